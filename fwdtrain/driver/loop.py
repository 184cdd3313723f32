"""The loop: a problem's steps between events, with a history, divergence checks and hooks.

``Loop.advance_to(n)`` steps until step n (it can be advanced again). Steps come from a
stepper (``steppers``: eager or compiled, chosen once); between two events every step is
unchecked. At its events the loop checks for divergence (``Checks``), takes a record
(``SaveAt``) and calls its hooks (``hooks``). It knows only the ``Trainable`` interface: a problem
made of E independent members (an ensemble) answers ``within`` with (E,) flags, and then a member
that fails a check is frozen at its last checked state (``Trainable.freeze``) while the others go on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import optree
import torch

from .. import _compat
from ..compile import route
from ..compile.options import Compile
from ..compile.route import Route
from ..core import _checks
from ..core._tree import tree_map as optree_map
from ..core.errors import DivergenceError
from ..core.history import History, Record, Records, build, empty_records, last_step
from ..core.noise import Noise
from ..core.schedules import Schedule
from ..core.state import State
from ..optim import Average
from ..problems.trainable import Trainable
from .hooks import Hook
from .options import Checks, SaveAt
from .steppers import Auto, Carry, Compiled, Eager, Stepping

MAX_STOPS = 64  # a compiled block with more events than this takes the ordinary path (one call per event)


def _next(n: int, every: int | None) -> int:
    return (n // every + 1) * every if every else sys.maxsize


def check_learning_rate(schedule: Schedule, t: torch.Tensor, lr: Any) -> None:
    """``_checks.check_alpha`` of alpha = schedule(t); with members (t of shape (E,)) for each member's alpha."""
    alpha = schedule(t)
    if t.ndim == 0:
        _checks.check_alpha(alpha, t, lr)
        return
    alphas = torch.as_tensor(alpha, dtype=t.dtype, device=t.device)
    if alphas.shape not in ((), t.shape):
        raise ValueError(
            f"the learning rate of {t.shape[0]} members has shape {tuple(alphas.shape)}; "
            f"expected one value per member, ({t.shape[0]},)"
        )
    for t_e, alpha_e in zip(t, alphas.expand(t.shape), strict=True):
        _checks.check_alpha(alpha_e, t_e, lr)


def continued(history: History | None, state: State) -> tuple[int, torch.Tensor, tuple[int, torch.Tensor]]:
    """(start step, float64 cost total, record window) of a run continued from ``history`` (zeros for a new run)."""
    zero = torch.zeros(state.t.shape, dtype=torch.float64, device=state.x.device)  # (E,) with members
    if history is None or not len(history.step):
        return 0, zero, (0, zero)
    if history.carry is None or history.average_cost is None:
        raise ValueError("history has no carry (it was not returned by fwdtrain.run or load); it cannot be continued")
    if not torch.equal(history.t[-1].to(state.t), state.t):
        raise ValueError(
            f"history ends at t = {history.t[-1].tolist()} but state.t = {state.t.tolist()}: "
            f"continue from the Run (or checkpoint) that holds both"
        )
    total = history.carry["cost_total"].to(state.x.device)
    window = (int(history.carry["window_start"]), history.carry["window_total"].to(state.x.device))
    return history.steps, total, window


class Loop:
    """A run's loop from ``driver.run.setup``; ``advance_to(n)`` steps it to step n and it can be advanced again.

    ``carry`` is where it stands; records are kept as they are taken and ``history()`` stacks them.
    """

    def __init__(
        self,
        problem: Trainable,
        stepping: Stepping,
        stepper: Any,
        source: Noise,
        carry: Carry,
        end: int,
        *,
        save: SaveAt,
        checks: Checks,
        hooks: tuple[Hook, ...],
        previous: History | None,
        options: Compile,
        lr: Any,
    ) -> None:
        self.problem, self.stepping, self.stepper, self.source = problem, stepping, stepper, source
        self.carry, self.end, self.save, self.checks, self.hooks = carry, end, save, checks, hooks
        self.previous, self.lr, self.options = previous, lr, options
        self.kernel_events = route.kernel_events()  # kernels compiled or loaded before this run
        self.chunk = options.chunk  # steps of noise drawn at once
        self.flush_subnormals = options.flush_subnormals  # steps and events with subnormals read as zero
        self.window = continued(previous, carry.state)[2]  # where the cost of the next record starts
        self.start = carry.n
        self.record_state: Callable[[State], Any] = save.record or problem.record
        self.records: list[Record | Records] = []
        self.empty = empty_records(self.record_state(carry.state))
        averaged = isinstance(carry.state.average, Average)
        self.empty_average = empty_records(carry.state.average.mean) if averaged else None
        self.dtype = carry.state.x.dtype
        self.good = (carry, source.state_dict(carry.n))  # the last carry that passed a check, with its noise position
        flags = problem.within(carry.state, checks.bound)
        # members (a problem whose ``within`` has a member axis): (alive (E,) bool, frozen_at (E,) int64, -1: running)
        self.members: tuple[torch.Tensor, torch.Tensor] | None = None
        if flags.ndim:
            diverged = previous.diverged if previous is not None else None
            if diverged is not None:
                if diverged.shape != flags.shape:
                    raise ValueError(f"the history has {diverged.shape[0]} members, the state {flags.shape[0]}")
                assert previous is not None and previous.frozen_at is not None
                self.members = (~diverged.to(torch.bool), previous.frozen_at.to(torch.int64))
            else:
                self.members = (
                    torch.ones_like(flags, dtype=torch.bool),
                    torch.full(flags.shape, -1, dtype=torch.int64),
                )

        # the fast path of a compiled run without hooks or members: a block's records and checks observed inside
        # its kernel (``_observed_block``); built at the first block, dropped for good if it cannot be
        everies = [every for every in (save.every, checks.every) if every]
        # the most stops a block can hold: each cadence's events in chunk steps, the first step, the end, its end
        self.stops = sum(self.chunk // every + 1 for every in everies) + 3
        self.observer: Any = None
        self.observable = (
            isinstance(stepper, (Compiled, Auto))
            and options.route == "aot"
            and not hooks
            and self.members is None
            and save.record is None
            and type(problem).within is Trainable.within  # what the observation computes in the kernel
            and type(problem).gradient_norm is Trainable.gradient_norm
            and self.stops <= MAX_STOPS
        )

    def set_carry(self, carry: Carry) -> None:
        self.carry = carry

    @property
    def route(self) -> Route | None:
        """How the steps are computed and why (``compile.route``); None while ``compile="auto"`` has not chosen."""
        if isinstance(self.stepper, Auto):
            return self.stepper.decision
        return route.fixed(not isinstance(self.stepper, Eager))

    # ---- records ----
    def running_cost(self) -> torch.Tensor:
        """The running average cost (1/n) sum_k mean_i c(X_k); with members, the mean over those still running."""
        c = self.carry
        average = c.total / max(c.n, 1)
        return average if self.members is None else average[self.members[0]].mean()

    def record_now(self, c: Carry | None = None) -> None:
        """Take a record of carry ``c`` (default the current one), unless there is one at that step."""
        c = self.carry if c is None else c
        if c.info is None or last_step(self.records) == c.n:
            return
        g, total_g = self.window
        cost = ((c.total - total_g) / (c.n - g)).to(self.dtype)
        grad, average = self.problem.gradient_norm(c.info.gradient), c.total / c.n
        if self.members is not None:  # a frozen member has no cost or gradient after its freeze
            alive = self.members[0]
            cost, grad, average = (
                torch.where(alive, value, torch.full_like(value, float("nan"))) for value in (cost, grad, average)
            )
        values = {"cost": cost, "average_cost": average}
        for hook in self.hooks:
            values = hook.record(values)
        theta_average = c.state.average.mean if isinstance(c.state.average, Average) else None
        self.records.append(
            Record(
                c.n, c.state.t, values["cost"], grad, values["average_cost"], self.record_state(c.state), theta_average
            )
        )
        if c.n % self.save.every == 0:
            self.window = (c.n, c.total)

    def history(self, c: Carry | None = None, noise_state: dict | None = None, interrupted: bool = False) -> History:
        """The history up to the last record, continuing from carry ``c`` (default the current one)."""
        c = self.carry if c is None else c
        carried = {
            "noise": self.source.state_dict(c.n) if noise_state is None else noise_state,
            "cost_total": c.total,
            "window_start": torch.tensor(self.window[0], dtype=torch.int64),
            "window_total": self.window[1],
        }
        cost = getattr(self.stepper, "cost", None)  # "auto"'s counted step: a continued run need not count again
        if cost is not None:
            carried.update(route.as_carry(cost))
        alive, frozen_at = self.members if self.members is not None else (None, None)
        return build(
            self.records,
            self.empty,
            carry=carried,
            interrupted=interrupted,
            dtype=self.dtype,
            device=c.state.x.device,
            previous=self.previous,
            empty_average=self.empty_average,
            diverged=None if alive is None else ~alive,
            frozen_at=frozen_at,
            compiled=None if self.route is None else self.route.compiled,
        )

    # ---- checks ----
    def check(self) -> None:
        """Raise ``DivergenceError`` unless the current state is finite (and within the bound).

        With members: a member that fails is frozen at its state of the last passed check (``freeze``)
        and flagged; the error is raised only when no member is left running.
        """
        c = self.carry
        ok = self.problem.within(c.state, self.checks.bound)
        for hook in self.hooks:
            ok = hook.checked(self, ok)
        if self.members is None:
            if not bool(ok.all()):
                raise self.diverged(c.n)
        else:
            alive, frozen_at = self.members
            running, good = alive & ok, self.good[0]
            frozen_at = torch.where(alive & ~ok, torch.tensor(good.n), frozen_at)
            if not bool(running.any()):  # every member has diverged: the run has
                self.record_now(good)
                self.members = (running, frozen_at)
                raise self.diverged(c.n)
            if not bool(running.all()):  # freeze the failed members (and reset the frozen ones) at the last pass
                c = Carry(
                    self.problem.freeze(good.state, c.state, running),
                    c.n,
                    torch.where(running, c.total, good.total),
                    c.info,
                )
                self.carry = c
            self.members = (running, frozen_at)
        self.good = (c, self.source.state_dict(c.n))

    def bad_rate(self, n: int) -> DivergenceError:
        """The error for step n, whose state's learning rate alpha(t_n) is not a finite number >= 0: the steps
        stopped at n - 1, and the error carries that state (the loop's carry) and its history."""
        c = self.carry
        t = c.state.t + self.stepping.dt  # t_n as the step makes it
        try:
            check_learning_rate(self.stepping.schedule, t, self.lr)
            reason = f"the learning rate at t = {t.tolist()} is not a finite number >= 0"
        except (TypeError, ValueError) as error:
            reason = str(error)
        self.record_now(c)
        return DivergenceError(
            f"{reason}; the run stopped at step {n}, the step of that time, and keeps the state of step {c.n} "
            f"(t = {c.state.t.tolist()}) in error.state",
            step=n,
            last_finite_step=c.n,
            state=c.state,
            history=self.history(c),
        )

    def diverged(self, n: int) -> DivergenceError:
        """The error for a failed check at step n, carrying the last state that passed and its history; it
        names the step and the coefficient that first became non-finite when a replay finds them."""
        last, noise_state = self.good  # no record is ever taken after the last passed check
        self.record_now(last)
        limit = f" or exceeded bound={self.checks.bound}" if self.checks.bound is not None else ""
        t0 = float(last.state.t.amax())
        dt = float(self.stepping.dt)
        first, culprit = (n, None) if self.members is not None else self.replay(last, noise_state, n)
        at = f"at step {first} (t = {t0 + (first - last.n) * dt:.6g})"
        if culprit is not None:
            detail = (
                f"x, x_tilde or theta became non-finite{limit} {at}: the {culprit} returned NaN or inf at the "
                f"particles of step {first - 1}"
            )
        elif first < n:
            detail = (
                f"x, x_tilde or theta became non-finite{limit} {at} (every function of the problem was finite at "
                f"step {first - 1})"
            )
        else:
            detail = f"x, x_tilde or theta became non-finite{limit} between step {last.n} and step {n}"
        what = "the run" if self.members is None else "every member of the ensemble"
        return DivergenceError(
            f"{what} diverged: {detail}; the last checked state, of step "
            f"{last.n} (t = {t0:.6g}), is kept; try a smaller learning rate or step",
            step=first,
            last_finite_step=last.n,
            state=last.state,
            history=self.history(last, noise_state),
            culprit=culprit,
        )

    def replay(self, last: Carry, noise_state: dict, n: int) -> tuple[int, str | None]:
        """Step eagerly from the last checked state to the first step whose state fails the check: (that step,
        the problem's function that was not finite at the state before it, ``Trainable.nonfinite``, or None).
        (n, None) when the replay is not possible (a gradient hook: its collectives cannot be repeated)."""
        source = _rewound(self.source, noise_state, last.state)
        if source is None or self.stepping.reduce is not None:
            return n, None
        eager, carry = Eager(self.stepping), last
        block = source.draw(n - last.n)
        for i in range(n - last.n):
            culprit = self.problem.nonfinite(carry.state)
            carry, failing = eager.steps(carry, block, i, 1, lambda c: None)
            if failing is not None:
                return n, None
            if not bool(self.problem.within(carry.state, self.checks.bound).all()):
                return carry.n, culprit
        return n, None

    def visible(self, c: Carry | None = None) -> State:
        """The state a callback sees: with members, the frozen ones at their frozen state."""
        c = self.carry if c is None else c
        if self.members is None or bool(self.members[0].all()):
            return c.state
        return self.problem.freeze(self.good[0].state, c.state, self.members[0])

    # ---- the loop ----
    def next_event(self, n: int, stop: int | None = None, *, record_hooks_only: bool = False) -> int:
        """The loop's one event clock: the first step after n (and no later than ``stop``, default the end) at
        which it checks: a divergence check, a record, the first step, a hook's turn, the end. A process group
        asks with ``record_hooks_only`` for the events every rank shares (hooks that need a record)."""
        first = self.start + 1 if n < self.start + 1 else sys.maxsize  # one check after the first step
        hooks = [hook for hook in self.hooks if hook.needs_record or not record_hooks_only]
        return min(
            _next(n, self.save.every),
            _next(n, self.checks.every),
            first,
            *(_next(n, hook.every) for hook in hooks),
            self.end,
            self.end if stop is None else stop,
        )

    def _on_event(self) -> None:
        n = self.carry.n
        is_record = n % self.save.every == 0 or n == self.end
        due = [hook for hook in self.hooks if hook.every and n % hook.every == 0]
        needs_record = any(hook.needs_record for hook in due)
        if is_record or needs_record or n % self.checks.every == 0 or n == self.start + 1:
            self.check()
        if is_record or needs_record:
            self.record_now()
        for hook in due:
            hook.at(self)

    def advance_to(self, stop: int) -> Carry:
        """Step until step ``stop`` (at most the end): unchecked steps, events at their steps. Returns the carry.

        Raises ``DivergenceError`` at a failed check; KeyboardInterrupt leaves ``carry`` at the last whole step
        (after the hooks' ``failed``, which may raise instead). With ``flush_subnormals`` the steps and events run
        with subnormal floats read as zero on this thread (``_compat.subnormals_flushed``), the mode restored after.
        """
        stop = min(stop, self.end)
        try:
            with _compat.subnormals_flushed(self.flush_subnormals):
                self._advance(stop)
        except BaseException as error:
            if not isinstance(error, DivergenceError):
                for hook in self.hooks:
                    hook.failed(self, error)
            raise
        return self.carry

    def _advance(self, stop: int) -> None:
        next_event = self.next_event(self.carry.n, stop)
        while self.carry.n < stop:
            block = self.source.draw(min(self.chunk, stop - self.carry.n))  # a compiled stepper pads it
            first, i, tried = self.carry.n, 0, False
            while i < len(block):
                # the fast path, once a block: from its start, or from where "auto" chose to compile
                if self.observable and not tried and self._fast_stepper() is not None:
                    tried = True
                    if self._observed_block(block[i:] if i else block, stop):
                        next_event = self.next_event(self.carry.n, stop)
                        break
                count = min(next_event - self.carry.n, len(block) - i)
                _, failing = self.stepper.steps(self.carry, block, i, count, self.set_carry)
                if failing is not None:
                    raise self.bad_rate(failing)
                i = self.carry.n - first  # "auto" returns after its counted first step
                if self.carry.n == next_event:
                    self._on_event()
                    next_event = self.next_event(self.carry.n, stop)

    # ---- the fast path: a block's events observed inside its compiled loop ----
    def _events_in(self, n: int, length: int, stop: int) -> list[int]:
        """The events after step n up to step n + length (the loop's clock, ``next_event``)."""
        events: list[int] = []
        last = n + length
        while (event := self.next_event(n, stop)) <= last and event > n:
            events.append(event)
            n = event
        return events

    def _fast_stepper(self) -> Compiled | None:
        """The compiled stepper of the fast path: the run's own, or the one ``compile="auto"`` chose; None while
        it steps eagerly (or chose to), or where the loop kernel took another route than AOTInductor."""
        stepper = self.stepper.chosen if isinstance(self.stepper, Auto) else self.stepper
        return stepper if isinstance(stepper, Compiled) and stepper.kernel.route == "aot" else None

    def _observer(self, stepper: Compiled, carry: Carry) -> Any:
        """The observed loop kernel of ``stepper`` (``Compiled.observer``), built once: its trace names its package."""
        if self.observer is None:
            key = ("observed", self.checks.bound)  # the record is the problem's own (``save.record`` is None)
            observe = observation(self.problem, self.checks.bound, self.record_state)
            self.observer = stepper.observer(observe, self.stops, key, carry)
        return self.observer

    def _observed_block(self, block: torch.Tensor, stop: int) -> bool:
        """Step the whole of ``block`` in one kernel call, its events' checks and records observed at their steps
        (and at its end) inside the kernel. False, with nothing changed, where the block needs the ordinary path:
        too many events, a learning rate of the block not a finite number >= 0, an observation that fails its
        check (the ordinary path then steps the block again, event by event, and raises as it always does), or a
        kernel that cannot be built (then for good)."""
        c, length = self.carry, block.shape[0]
        events = self._events_in(c.n, length, stop)
        stops = [event - c.n for event in events]
        if not stops or stops[-1] != length:
            stops.append(length)
        stepper = self._fast_stepper()
        assert stepper is not None
        if len(stops) > self.stops:
            return False
        out = stepper.observed_steps(self._observer(stepper, c), c, block, stops)
        if out is None:
            self.observable = not self.observer.failed
            return False
        end, seen = out
        if not bool(seen["ok"][: len(stops)].all()):
            return False
        self._take_records(events, seen)
        self.carry = end
        self.good = (end, self.source.state_dict(end.n))
        return True

    def _take_records(self, events: list[int], seen: dict[str, Any]) -> None:
        """The records among ``events`` (rows of ``seen``), as ``record_now`` takes them, in one block."""
        every = self.save.every
        rows = [k for k, n in enumerate(events) if (every and n % every == 0) or n == self.end]
        if not rows:
            return
        index = torch.tensor(rows, dtype=torch.int64)
        steps = [events[k] for k in rows]
        totals = seen["total"].index_select(0, index)
        g, total_g = self.window
        starts = torch.tensor([g, *steps[:-1]], dtype=torch.int64)  # the window of each record: every record
        previous = torch.cat([total_g.reshape(1), totals[:-1]])  # but a run's last is on the grid
        step = torch.tensor(steps, dtype=torch.int64)
        cost = ((totals - previous) / (step - starts)).to(self.dtype)
        average = totals / step
        pick = lambda tree: None if tree is None else optree_map(lambda leaf: leaf.index_select(0, index), tree)
        self.records.append(
            Records(
                step,
                seen["t"].index_select(0, index),
                cost,
                seen["grad_norm"].index_select(0, index),
                average,
                pick(seen["record"]),
                pick(seen.get("theta_average")),
            )
        )
        on_grid = [r for r, n in enumerate(steps) if every and n % every == 0]
        if on_grid:  # the window of the next record starts at the last record on the grid
            self.window = (steps[on_grid[-1]], totals[on_grid[-1]])


def observation(
    problem: Trainable, bound: float | None, record: Callable[[State], Any]
) -> Callable[[tuple[State, torch.Tensor, Any]], dict[str, Any]]:
    """What an event reads of the compiled loop's carry (state, cost total, StepInfo), as a pure function traced
    into the observed loop: the check (``Trainable.within``: max |.| of x, x_tilde and theta finite, or within the
    bound; as 0 or 1), the clock, the cost total, the gradient's norm (``Trainable.gradient_norm``), the record
    and, when the state carries one, the average of theta. Written with plain reductions (no foreach ops: the
    compiled package could not be loaded with them)."""

    def observe(carry: tuple[State, torch.Tensor, Any]) -> dict[str, Any]:
        state, total, info = carry
        largest = torch.stack([leaf.abs().amax() for leaf in _sized((state.x, state.x_tilde, state.theta))]).amax()
        ok = torch.isfinite(largest) if bound is None else largest <= bound  # NaN compares False
        norms = [torch.linalg.vector_norm(leaf) for leaf in _sized(info.gradient)]
        seen = {
            "ok": ok.to(state.x.dtype),
            "t": state.t,
            "total": total,
            "grad_norm": torch.linalg.vector_norm(torch.stack(norms)) if norms else total.new_zeros(()).to(total),
            "record": record(state),
        }
        if isinstance(state.average, Average):
            seen["theta_average"] = state.average.mean
        return seen

    return observe


def _sized(tree: Any) -> list[torch.Tensor]:
    """The leaves of ``tree`` that hold numbers, as floating tensors (an integer leaf's max |.| is exact in float64)."""
    return [
        leaf if leaf.is_floating_point() else leaf.to(torch.float64)
        for leaf in optree.tree_leaves(tree)
        if isinstance(leaf, torch.Tensor) and leaf.numel()
    ]


def _rewound(source: Noise, saved: dict, state: State) -> Noise | None:
    """A copy of ``source`` at the position ``saved`` (its ``state_dict``), or None if it cannot be rewound."""
    return source.rewound(saved, state.x.dtype, state.x.device)


__all__ = ["Carry", "Loop", "check_learning_rate"]
