"""The loop: a run's blocks of steps, the hooks between them, and the history.

``Loop.advance_to(n)`` steps until step n (it can be advanced again). The steps are taken in blocks
(``block.Block``: eager or compiled, the same function), each up to the noise chunk's end or the next
hook's turn; inside a block every step is checked (finite, the bound, the learning rate) and the
records on the ``SaveAt`` grid are taken. A block whose check fails returns where it stopped; the loop
then raises ``DivergenceError`` with the state of the step before, or, for a problem of E independent
members (an ensemble: ``within`` answers (E,) flags), freezes the members that failed at that state and
goes on with the others. Python runs once per block, not per step.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .. import _compat
from ..compile.options import Compile
from ..core import _checks
from ..core.errors import DivergenceError
from ..core.history import History, Records, build, empty_records, last_step
from ..core.noise import Noise
from ..core.state import State
from ..optim import Average
from .block import Block, Carry, Outcome, Stepping
from .hooks import Hook
from .options import Checks, SaveAt


def _next(n: int, every: int | None) -> int:
    return (n // every + 1) * every if every else sys.maxsize


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
    """A run's loop from ``driver.runner.setup``; ``advance_to(n)`` steps it to step n and it can be advanced again.

    ``carry`` is where it stands (every step of it checked); records are kept as they are taken and ``history()``
    stacks them. ``block`` is the run's ``Block``, eager until it switches to its kernel (``_tier``, before each
    block): at once with ``compile=True`` or a kernel on disk, else, for a run that reaches step
    ``Compile.after``, at the first block after the kernel's background compile is ready (``compiled_from``:
    the step it switched at).
    """

    def __init__(
        self,
        stepping: Stepping,
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
        self.problem, self.stepping, self.source = stepping.problem, stepping, source
        self.carry, self.end, self.save, self.checks, self.hooks = carry, end, save, checks, hooks
        self.previous, self.lr, self.options = previous, lr, options
        self.chunk = options.chunk  # steps of noise drawn at once: the longest block
        self.window = continued(previous, carry.state)[2]  # where the cost of the next record starts
        self.start = carry.n
        self.record_state: Callable[[State], Any] = save.record or stepping.problem.record
        self.records: list[Records] = []
        self.empty = empty_records(self.record_state(carry.state))
        averaged = isinstance(carry.state.average, Average)
        self.empty_average = empty_records(carry.state.average.mean) if averaged else None
        self.dtype = carry.state.x.dtype
        self.good = (carry, source.state_dict(carry.n))  # the last checked carry, with its noise position
        # the members still running and the step each froze at (-1: running): (E,) for a problem of E members (its
        # ``within`` answers one flag per member), 0-d for one run (its failure raises instead of freezing)
        flags = self.problem.within(carry.state, checks.bound)
        self.ensemble = flags.ndim > 0
        self.alive, self.frozen_at = torch.ones_like(flags, dtype=torch.bool), torch.full(flags.shape, -1)
        diverged = previous.diverged if previous is not None and self.ensemble else None
        if diverged is not None:
            if diverged.shape != flags.shape:
                raise ValueError(f"the history has {diverged.shape[0]} members, the state {flags.shape[0]}")
            assert previous is not None and previous.frozen_at is not None
            self.alive, self.frozen_at = ~diverged.to(torch.bool), previous.frozen_at.to(torch.int64)
        # hooks that agree on checks (a group) are asked at the ``Checks`` grid; others only at their own turns
        self.group_checks = any(type(hook).checked is not Hook.checked for hook in hooks)
        self.block = Block(
            stepping,
            carry,
            bound=checks.bound,
            record=self.record_state,
            members=self.ensemble,
            chunk=self.chunk,
            every=save.every,
            check_every=checks.every,
            options=options,
        )
        self.compiled_from: int | None = carry.n if self.block.compiled else None
        self.tier = "compiled" if self.block.compiled else "new"  # "new", "compiling", "eager" or "compiled"

    @property
    def route(self) -> str:
        """ "compiled" or "eager": how the next block runs."""
        return "compiled" if self.block.compiled else "eager"

    def first_route(self) -> str:
        """How the run's first block goes, in one line: "compiled" (``compile=True``, or the kernel's package on disk,
        found by its own key) or "eager" and why; "eager, compiling ..." where its compile starts in the background."""
        options = self.options
        if options.enabled is False:
            return "eager (compile=False)"
        if options.enabled is True:
            return "compiled (compile=True)"
        if self.stepping.reduce is not None:
            return "eager (a gradient hook: compile=True compiles)"
        if options.compiler == "dynamo":
            return "compiled (compile=True)"
        if self.end < (options.after or 0):  # as_compile has set it
            return f"eager (the run ends before step {options.after}, Compile(after=...))"
        if self.block.build_kernel().loaded():
            return "compiled (the kernel is on disk)"
        return "eager, compiling its kernel in the background (no kernel on disk)"

    def _tier(self) -> None:
        """Before a block: the run's first block takes its ``first_route``, starting the kernel's compile in the
        background where it says so; a later block switches once that compile is ready (not with
        ``Compile(switch=False)``). A compile that fails leaves the run eager with one warning."""
        if self.tier == "new":
            route = self.first_route()
            if route.startswith("compiled"):
                self.block.build_kernel()
                self._switch()
            elif route.startswith("eager,"):
                kernel = self.block.build_kernel()
                if kernel.package is None:
                    self._stay_eager(f"the step could not be traced ({kernel.failure})")
                    return
                kernel.package.start("in the background, the run stepping eagerly meanwhile")
                self.tier = "compiling"
            else:
                self.tier = "eager"
            return
        package = self.block.kernel.package if self.block.kernel is not None else None
        failure = package.poll() if package is not None else "no package"
        if failure is None:
            if self.options.switch:
                self._switch()
            else:
                self.tier = "eager"
        elif failure:
            self._stay_eager(f"the background compile of the step failed ({failure})")

    def _switch(self) -> None:
        self.block.compiled, self.tier, self.compiled_from = True, "compiled", self.carry.n

    def _stay_eager(self, reason: str) -> None:
        self.tier = "eager"
        warnings.warn(f"fwdtrain: {reason}; the run goes on eagerly", RuntimeWarning, stacklevel=5)

    # ---- records ----
    def running_cost(self) -> torch.Tensor:
        """The running average cost (1/n) sum_k mean_i c(X_k); with members, the mean over those still running."""
        average = self.carry.total / max(self.carry.n, 1)
        return average[self.alive].mean()  # one run: its 0-d alive selects the one value

    def _values(self, cost: torch.Tensor, grad: torch.Tensor, average: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A record's (cost, grad_norm, average_cost) as kept: a frozen member's NaN, then the hooks' ``record``."""
        cost, grad, average = (
            torch.where(self.alive, v, torch.full_like(v, float("nan"))) for v in (cost, grad, average)
        )
        values = {"cost": cost, "average_cost": average}
        for hook in self.hooks:
            values = hook.record(values)
        return values["cost"], grad, values["average_cost"]

    def record_now(self, c: Carry | None = None) -> None:
        """Take a record of carry ``c`` (default the current one), unless there is one at that step."""
        c = self.carry if c is None else c
        if c.info is None or last_step(self.records) == c.n:
            return
        g, total_g = self.window
        cost = ((c.total - total_g) / (c.n - g)).to(self.dtype)
        cost, grad, average = self._values(cost, self.problem.gradient_norm(c.info.gradient), c.total / c.n)
        theta_average = c.state.average.mean if isinstance(c.state.average, Average) else None
        self.records.append(Records.one(c.n, c.state.t, cost, grad, average, self.record_state(c.state), theta_average))
        if c.n % self.save.every == 0:
            self.window = (c.n, c.total)

    def _take_records(self, first: int, seen: dict[str, Any]) -> None:
        """The records a block took (``seen``: stacked, at the steps of the record grid after step ``first``)."""
        every = self.save.every
        steps = torch.arange(len(seen["t"]), dtype=torch.int64) * every + (first // every + 1) * every
        totals = seen["total"]
        g, total_g = self.window
        starts = torch.cat([torch.tensor([g]), steps[:-1]])  # the window of each record: since the previous one
        previous = torch.cat([total_g.unsqueeze(0), totals[:-1]])
        shape = (-1,) + (1,) * (totals.ndim - 1)
        cost = ((totals - previous) / (steps - starts).reshape(shape)).to(self.dtype)
        cost, grad, average = self._values(cost, seen["grad_norm"], totals / steps.reshape(shape))
        self.records.append(Records(steps, seen["t"], cost, grad, average, seen["record"], seen.get("theta_average")))
        self.window = (int(steps[-1]), totals[-1])

    def history(self, c: Carry | None = None, noise_state: dict | None = None, interrupted: bool = False) -> History:
        """The history up to the last record, continuing from carry ``c`` (default the current one)."""
        c = self.carry if c is None else c
        carried = {
            "noise": self.source.state_dict(c.n) if noise_state is None else noise_state,
            "cost_total": c.total,
            "window_start": torch.tensor(self.window[0], dtype=torch.int64),
            "window_total": self.window[1],
        }
        return build(
            self.records,
            self.empty,
            carry=carried,
            interrupted=interrupted,
            dtype=self.dtype,
            device=c.state.x.device,
            previous=self.previous,
            empty_average=self.empty_average,
            diverged=~self.alive if self.ensemble else None,
            frozen_at=self.frozen_at if self.ensemble else None,
            compiled=None if c.n == self.start else self.block.compiled,
            compiled_from=self.compiled_from if c.n > self.start else None,
        )

    # ---- checks ----
    def check(self) -> None:
        """The hooks' agreement on the current state's check (a group's, at the ``Checks`` grid): raise
        ``DivergenceError`` unless it is finite (and within the bound); with members, freeze the members that fail
        (``freeze``) and raise only when none is left running."""
        c = self.carry
        ok = self.problem.within(c.state, self.checks.bound) | ~self.alive
        for hook in self.hooks:
            ok = hook.checked(self, ok)
        failed = self.alive & ~ok
        if not bool(failed.any()):
            return
        if not self.ensemble:
            error = self.diverged(c.n)
            error.agreed = True  # type: ignore[attr-defined]  # the group made this check together
            raise error
        self._freeze(failed)

    def _freeze(self, failed: torch.Tensor) -> None:
        """Freeze the ``failed`` members at the current carry (their state and total stay there inside the blocks);
        raise when none runs."""
        self.alive, self.frozen_at = self.alive & ~failed, torch.where(failed, self.carry.n, self.frozen_at)
        if not bool(self.alive.any()):
            raise self.diverged(self.carry.n + 1)

    def bad_rate(self, n: int) -> Exception:
        """The error for step n, whose state's learning rate alpha(t_n) is not a finite number >= 0: the steps
        stopped at n - 1, and the error carries that state (the loop's carry) and its history."""
        c = self.carry
        t = c.state.t + self.stepping.dt  # t_n as the step makes it
        try:
            _checks.check_alpha(self.stepping.schedule(t), t, self.lr)
            reason = f"the learning rate at t = {t.tolist()} is not a finite number >= 0"
        except (TypeError, ValueError) as error:
            reason = str(error)
        message = f"{reason}; the run stopped at step {n}, the step of that time, and keeps the state of step {c.n} "
        return self._error(f"{message}(t = {c.state.t.tolist()}) in error.state", n, c)

    def _error(self, message: str, n: int, last: Carry, noise_state: dict | None = None, **more: Any) -> Exception:
        """``DivergenceError`` at step n with the state of carry ``last`` and the history up to it (recorded)."""
        self.record_now(last)
        history = self.history(last, noise_state)
        return DivergenceError(message, step=n, last_finite_step=last.n, state=last.state, history=history, **more)

    def diverged(self, n: int) -> Exception:
        """The error for a failed check at step n, carrying the last checked state (of step n - 1 where the
        block found it, at a group's check the one before) and its history; it names the problem's function
        that was NaN or inf at that state when there is one (``Trainable.nonfinite``)."""
        last, noise_state = self.good
        if self.carry.n == n - 1:
            last, noise_state = self.carry, self.source.state_dict(self.carry.n)
        limit = f" or exceeded bound={self.checks.bound}" if self.checks.bound is not None else ""
        t0 = float(last.state.t.amax())
        culprit = self.problem.nonfinite(last.state) if not self.ensemble and last.n == n - 1 else None
        at = f"at step {n} (t = {t0 + (n - last.n) * float(self.stepping.dt):.6g})"
        if culprit is not None:
            detail = f"x, x_tilde or theta became non-finite{limit} {at}: the {culprit} returned NaN or inf at the "
            detail += f"particles of step {n - 1}"
        elif last.n == n - 1:
            detail = f"x, x_tilde or theta became non-finite{limit} {at} (every function of the problem was finite "
            detail += f"at step {n - 1})"
        else:
            detail = f"x, x_tilde or theta became non-finite{limit} between step {last.n} and step {n}"
        what = "every member of the ensemble" if self.ensemble else "the run"
        kept = f"the last checked state, of step {last.n} (t = {t0:.6g}), is kept; try a smaller learning rate or step"
        return self._error(f"{what} diverged: {detail}; {kept}", n, last, noise_state, culprit=culprit)

    def visible(self) -> State:
        """The state a callback sees (a frozen member stays at its frozen state inside the blocks)."""
        return self.carry.state

    # ---- the loop ----
    def next_event(self, n: int, stop: int | None = None, *, record_hooks_only: bool = False) -> int:
        """The loop's one event clock: the first step after n (and no later than ``stop``, default the end) at
        which a block ends for Python: a hook's turn, a group's check, the end. A process group asks with
        ``record_hooks_only`` for the events every rank shares (its checks, and hooks that need a record)."""
        hooks = [hook for hook in self.hooks if hook.needs_record or not record_hooks_only]
        return min(
            _next(n, self.checks.every) if self.group_checks else sys.maxsize,
            *(_next(n, hook.every) for hook in hooks),
            self.end,
            self.end if stop is None else stop,
        )

    def _on_event(self) -> None:
        n = self.carry.n
        due = [hook for hook in self.hooks if hook.every and n % hook.every == 0]
        if self.group_checks and (n % self.checks.every == 0 or n == self.end):
            self.check()
        if n == self.end or any(hook.needs_record for hook in due):
            self.record_now()
        for hook in due:
            hook.at(self)

    def advance_to(self, stop: int) -> Carry:
        """Step until step ``stop`` (at most the end), a block at a time, the hooks at their turns. Returns the carry.

        Raises ``DivergenceError`` at a failed check; KeyboardInterrupt leaves ``carry`` at the last whole block
        (after the hooks' ``failed``, which may raise instead). With ``flush_subnormals`` the steps run with
        subnormal floats read as zero on this thread (``_compat.subnormals_flushed``), the mode restored after.
        """
        stop = min(stop, self.end)
        try:
            with _compat.subnormals_flushed(self.options.flush_subnormals):
                self._advance(stop)
        except BaseException as error:
            if not getattr(error, "agreed", False):  # a check the group made together needs no report
                for hook in self.hooks:
                    hook.failed(self, error)
            raise
        return self.carry

    def _advance(self, stop: int) -> None:
        next_event = self.next_event(self.carry.n, stop)
        while self.carry.n < stop:
            dw = self.source.draw(min(self.chunk, stop - self.carry.n))
            first = self.carry.n
            while (i := self.carry.n - first) < len(dw):
                if self.tier in ("new", "compiling"):
                    self._tier()
                count = min(next_event - self.carry.n, len(dw) - i)
                self._settle(self.block(self.carry, dw, i, count, self.alive), dw, i)
                if self.carry.n == next_event:
                    self._on_event()
                    next_event = self.next_event(self.carry.n, stop)

    def _settle(self, out: Outcome, dw: torch.Tensor, i: int) -> None:
        """Keep the records and carry of a block that started at row ``i`` of ``dw``; where a check failed, step the
        failed stage again from the last passed check and raise at the step that fails or, with members, freeze
        those that failed there; where the block stopped before a bad learning rate, raise."""
        start = self.carry
        if out.records is not None:
            self._take_records(start.n, out.records)
        self._keep(out.carry)
        if out.stage_end is not None:
            self._find_failure(dw, i + self.carry.n - start.n, i + out.stage_end - start.n)
        if out.bad_rate is not None and self.carry.n == out.bad_rate - 1:
            raise self.bad_rate(out.bad_rate)

    def _keep(self, carry: Carry) -> None:
        self.carry = carry
        self.good = (carry, self.source.state_dict(carry.n))

    def _find_failure(self, dw: torch.Tensor, row: int, end: int) -> None:
        """The failed stage, rows ``row`` to ``end`` of ``dw``, stepped again from the last passed check (the carry),
        one step at a time, eagerly: at the step whose check fails, raise with the state before it or, with
        members, freeze those that failed and go on. Where every step passes (a compiled stage that blew up
        where the eager steps, which differ by rounding, do not: a run at the edge of diverging parts ways), the
        run goes on from the eager steps, the stage's record taken."""
        for index in range(row, end):
            after, ok = self.block.step_eagerly(self.carry, dw[index], self.alive)
            if not ok:
                if not self.ensemble:
                    raise self.diverged(after.n)
                self._freeze(self.alive & ~self.problem.within(after.state, self.checks.bound))
                return
            self._keep(after)
        if self.carry.n % self.save.every == 0:
            self.record_now()


__all__ = ["Carry", "Loop"]
