"""The driver: the loop over a problem's pure step, with chunked noise, a history, checks and checkpoints.

``run`` = ``setup`` (validate once, pick the kernels, position the noise) + ``Loop.advance_to``
(the unchecked loop, resumable at any step) + the final record. ``run`` is a pure function of its
inputs: the same (problem, state, history, noise or seed, options) give bitwise the same
(state, history), whatever the noise chunk size, and a resumed run equals the uninterrupted one.
The driver knows only the ``fwdtrain.trainable.Trainable`` protocol, never a concrete problem.

A problem made of independent members (``fwdtrain.ensemble.Ensemble``) adds the protocol's optional
member hooks (``within`` per member, ``freeze``, ``gradient_norm``, ``noise_source``): a check then
freezes each failed member at its last state that passed a check and the others go on; the run raises
``DivergenceError`` only when every member has diverged.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, NamedTuple

import torch

from . import _checks
from ._tree import leaves, squared_norm, tree_map
from .checkpointing import Checkpointing, as_checkpointing, probe, write
from .errors import DivergenceError
from .euler import GradientReduce, LearningRate, StepInfo
from .history import History, Record, build, empty_records
from .optim import Average, GradientTransformation
from .noise import BrownianNoise, Noise, NoiseLike, as_noise
from .progress import ProgressBar, progress_enabled
from .sensitivity import Mode
from .state import State
from .trainable import Trainable, as_trainable

OneStep = Callable[[State, torch.Tensor, torch.Tensor], tuple[State, StepInfo]]
Fused = Callable[[State, torch.Tensor], tuple[State, StepInfo]]


class Kernels(NamedTuple):
    """The step functions the loop calls: ``one_step(state, dw, alpha)`` and, for fuse > 1,
    ``fused(state, noise (K, ...))`` taking K steps at once (None otherwise)."""

    one_step: OneStep
    fused: Fused | None = None
    fuse: int = 1


class Carry(NamedTuple):
    """What the loop carries from step to step (assigned in one statement, so Ctrl-C never splits it).

    state: the training state at step n; n: the step count since the start of training;
    total: float64 sum of the per-step costs since the start of training; info: the last step's StepInfo.
    """

    state: State
    n: int
    total: torch.Tensor
    info: StepInfo | None


class Events(NamedTuple):
    """How often the loop stops to do something (steps; None = never)."""

    record: int = 100
    check: int = 100
    callback: int | None = None
    progress: int | None = None
    checkpoint: int | None = None


def step_function(problem: Any, dt: Any, mode: str, reduce: GradientReduce | None = None) -> OneStep:
    """``one_step(state, dw, alpha) -> (state, info)``: the problem's ``advance`` with dt, mode and reduce bound."""
    trainable = as_trainable(problem)

    def one_step(state: State, dw: torch.Tensor, alpha: torch.Tensor) -> tuple[State, StepInfo]:
        return trainable.advance(state, dw, dt, alpha, mode, reduce)
    return one_step


def kernels(problem: Trainable, dt: Any, mode: str, reduce: GradientReduce | None, schedule: Callable,
            compile: bool | str, fuse: int) -> Kernels:
    """The eager step, or the compiled one (and for fuse > 1 the K-step compiled call). The one place
    where the driver chooses how a step runs. ``compile``: False, True (inductor) or a ``torch.compile``
    backend name ("eager": traced by dynamo only, for quick tests)."""
    if compile is False and fuse == 1:
        return Kernels(step_function(problem, dt, mode, reduce))
    from .compiled import compile_advance, compile_steps  # deferred: importing torch._dynamo takes seconds

    backend = compile if isinstance(compile, str) else "inductor"
    one_step = compile_advance(problem, float(dt), mode, reduce, backend=backend)
    fused = compile_steps(problem, float(dt), schedule, mode, fuse, reduce, backend=backend) if fuse > 1 else None
    return Kernels(one_step, fused, fuse)


def within(state: State, bound: float | None) -> bool:
    """All of x, x_tilde, theta finite (and |.| <= bound when given): one reduction, one sync."""
    peaks = [leaf.detach().abs().amax() for leaf in leaves((state.x, state.x_tilde, state.theta)) if leaf.numel()]
    peak = torch.stack(peaks).amax()
    if bound is None:
        return bool(torch.isfinite(peak))
    return bool(peak <= bound)  # NaN compares False


def flags(problem: Trainable, state: State, bound: float | None) -> torch.Tensor:
    """Bool flags of ``within``: the problem's per-member hook ((E,) for an ensemble), else one 0-d flag."""
    hook = getattr(problem, "within", None)
    return hook(state, bound) if hook is not None else torch.tensor(within(state, bound))


def gradient_norm(problem: Trainable, gradient: Any) -> torch.Tensor:
    """|G|: the problem's per-member hook ((E,) for an ensemble), else the norm over every leaf."""
    hook = getattr(problem, "gradient_norm", None)
    return hook(gradient) if hook is not None else squared_norm(gradient).sqrt()


def _next(n: int, every: int | None) -> int:
    return (n // every + 1) * every if every else sys.maxsize


class Loop:
    """The training loop from ``setup``: ``advance_to(n)`` steps it to step n, and it can be advanced again.

    ``carry`` is where it stands. Records are kept as they are taken; ``history()`` stacks them.
    Hooks: ``callback(n, state)`` at callback events, ``on_progress(n, average_cost)`` at progress
    events, and checkpoints at checkpoint events (all given to ``setup``).
    """

    def __init__(self, problem: Trainable, kernels: Kernels, schedule: Callable, source: Noise,
                 carry: Carry, end: int, dt: Any, *, events: Events, bound: float | None, chunk: int,
                 record: Callable[[State], Any], previous: History | None, window: tuple[int, torch.Tensor],
                 callback: Callable | None, checkpoint: Checkpointing | None,
                 members: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        self.problem, self.kernels, self.schedule, self.source = problem, kernels, schedule, source
        self.carry, self.end, self.dt, self.events, self.bound, self.chunk = carry, end, dt, events, bound, chunk
        self.record, self.previous, self.window = record, previous, window
        self.callback, self.checkpoint = callback, checkpoint
        self.records: list[Record] = []
        self.empty = empty_records(record(carry.state))
        averaged = isinstance(carry.state.average, Average)
        self.empty_average = empty_records(carry.state.average.mean) if averaged else None
        self.dtype = carry.state.x.dtype
        self.good = (carry, source.state_dict(carry.n))  # the last carry known finite, with its noise position
        self.on_progress: Callable[[int, torch.Tensor], Any] | None = None
        # members only (a problem with a ``freeze`` hook): (alive (E,) bool, frozen_at (E,) int64, -1 = running)
        self.members = members

    # ---- records ----
    def record_now(self, c: Carry | None = None) -> None:
        """Take a record of carry ``c`` (default the current one), unless there is one at that step."""
        c = self.carry if c is None else c
        if c.info is None or (self.records and self.records[-1].step == c.n):
            return
        g, total_g = self.window
        cost = ((c.total - total_g) / (c.n - g)).to(self.dtype)
        grad, average = gradient_norm(self.problem, c.info.gradient), c.total / c.n
        if self.members is not None:  # a frozen member has no cost or gradient after its freeze
            alive = self.members[0]
            cost, grad, average = (torch.where(alive, value, torch.full_like(value, float("nan")))
                                   for value in (cost, grad, average))
        theta_average = c.state.average.mean if isinstance(c.state.average, Average) else None
        self.records.append(Record(c.n, c.state.t, cost, grad, average, self.record(c.state), theta_average))
        if c.n % self.events.record == 0:
            self.window = (c.n, c.total)

    def history(self, c: Carry | None = None, noise_state: dict | None = None, interrupted: bool = False) -> History:
        """The history up to the last record, continuing from carry ``c`` (default the current one)."""
        c = self.carry if c is None else c
        carried = {"noise": self.source.state_dict(c.n) if noise_state is None else noise_state,
                   "cost_total": c.total, "window_start": torch.tensor(self.window[0], dtype=torch.int64),
                   "window_total": self.window[1]}
        alive, frozen_at = self.members if self.members is not None else (None, None)
        return build(self.records, self.empty, carry=carried, interrupted=interrupted, dtype=self.dtype,
                     device=c.state.x.device, previous=self.previous, empty_average=self.empty_average,
                     diverged=None if alive is None else ~alive, frozen_at=frozen_at)

    # ---- checks ----
    def diverged(self, n: int) -> DivergenceError:
        """The error for a failed check at step n, carrying the last state that passed and its history."""
        last, noise_state = self.good  # no record is ever taken after the last passed check
        self.record_now(last)
        limit = f" or exceeded bound={self.bound}" if self.bound is not None else ""
        t0 = float(last.state.t.amax())  # with members: every one has diverged, each frozen where it last passed
        run = "the run" if self.members is None else "every member of the ensemble"
        return DivergenceError(
            f"{run} diverged: x, x_tilde or theta became non-finite{limit} between step {last.n} and "
            f"step {n} (t = {t0:.6g} to {t0 + (n - last.n) * float(self.dt):.6g}); "
            f"the last finite state (step {last.n}) is in error.state; try a smaller lr or dt",
            step=n, last_finite_step=last.n, state=last.state, history=self.history(last, noise_state))

    def check(self) -> None:
        """Raise ``DivergenceError`` unless the current state is finite (and within the bound).

        With members: a member that fails is frozen at its state of the last passed check (``freeze``)
        and flagged; the error is raised only when no member is left running.
        """
        c = self.carry
        ok = flags(self.problem, c.state, self.bound)
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
                c = Carry(self.problem.freeze(good.state, c.state, running), c.n,
                          torch.where(running, c.total, good.total), c.info)
                self.carry = c
            self.members = (running, frozen_at)
        self.good = (c, self.source.state_dict(c.n))
        self.check_learning_rate()

    def check_learning_rate(self) -> None:
        """Raise ``DivergenceError`` (carrying the current state) if alpha(t_n) is not a finite number >= 0."""
        c = self.carry
        try:
            check_learning_rate(self.schedule, c.state.t, self.schedule)
        except (TypeError, ValueError) as error:
            self.record_now(c)
            raise DivergenceError(f"{error}; training stopped at step {c.n} (alpha is checked at every divergence "
                                  f"check, check_every steps) with the state reached in error.state", step=c.n,
                                  last_finite_step=c.n, state=c.state,
                                  history=self.history(c, self.good[1])) from error

    def visible(self, c: Carry) -> State:
        """The state a callback sees: with members, the frozen ones at their frozen state."""
        if self.members is None or bool(self.members[0].all()):
            return c.state
        return self.problem.freeze(self.good[0].state, c.state, self.members[0])

    # ---- the loop ----
    def _next_event(self, n: int, stop: int) -> int:
        e = self.events
        return min(_next(n, e.record), _next(n, e.check), _next(n, e.callback), _next(n, e.progress),
                   _next(n, e.checkpoint), self.end, stop)

    def _on_event(self, stop: int) -> None:
        c, e = self.carry, self.events
        n = c.n
        is_record = n % e.record == 0 or n == self.end
        is_checkpoint = e.checkpoint is not None and n % e.checkpoint == 0
        if is_record or is_checkpoint or n % e.check == 0:
            self.check()
            c = self.carry  # with members, the check may have frozen some
        if is_record:
            self.record_now()
        if e.callback is not None and n % e.callback == 0:
            self.callback(n, self.visible(c))
        if self.on_progress is not None and e.progress is not None and (n % e.progress == 0 or n == self.end):
            average = c.total / n  # with members: the mean over those still running
            self.on_progress(n, average if self.members is None else average[self.members[0]].mean())
        if is_checkpoint and n != self.end:
            self.record_now()
            write(self.checkpoint, c.state, self.history(c, self.good[1]))

    def advance_to(self, stop: int) -> Carry:
        """Step until step ``stop`` (at most the end): unchecked steps, events at their steps. Returns the carry.

        Raises ``DivergenceError`` at a failed check; KeyboardInterrupt leaves ``carry`` at the last whole step.
        """
        stop = min(stop, self.end)
        one_step, fused, fuse = self.kernels
        next_event = self._next_event(self.carry.n, stop)
        while self.carry.n < stop:
            block = self.source.draw(min(self.chunk, stop - self.carry.n))
            i = 0
            while i < len(block):
                carry = self.carry
                if fused is not None and next_event - carry.n >= fuse and len(block) - i >= fuse:
                    new, infos = fused(carry.state, block[i:i + fuse])
                    total = carry.total
                    for cost in infos.cost:  # the same float64 sum, one step at a time
                        total = total + cost
                    info = StepInfo(infos.cost[-1], tree_map(lambda g: g[-1], infos.gradient))
                    self.carry = Carry(new, carry.n + fuse, total, info)
                    i += fuse
                else:
                    new, info = one_step(carry.state, block[i], self.schedule(carry.state.t))
                    self.carry = Carry(new, carry.n + 1, carry.total + info.cost, info)
                    i += 1
                if self.carry.n == next_event:
                    self._on_event(stop)
                    next_event = self._next_event(self.carry.n, stop)
        return self.carry


def _schedule(lr: LearningRate, state: State) -> Callable:
    if callable(lr):
        return lr
    alpha = torch.as_tensor(lr, dtype=state.x.dtype, device=state.x.device).clone()
    return lambda t: alpha  # noqa: E731


def _members(trainable: Trainable, initial: torch.Tensor, history: History | None
             ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(alive, frozen_at) for a problem with members (a ``freeze`` hook), continued from the history; else None."""
    if getattr(trainable, "freeze", None) is None:
        return None
    if history is not None and history.diverged is not None:
        if history.diverged.shape != initial.shape:
            raise ValueError(f"the history has {history.diverged.shape[0]} members, the state {initial.shape[0]}")
        return ~history.diverged.to(torch.bool), history.frozen_at.to(torch.int64)
    return torch.ones_like(initial, dtype=torch.bool), torch.full(initial.shape, -1, dtype=torch.int64)


def _noise_source(trainable: Trainable, noise: NoiseLike, history: History | None, seed: int,
                  shape: tuple[int, ...], dt: Any, start: int, state: State) -> Noise:
    """The noise positioned at step ``start``: the user's, the history's, or ``BrownianNoise(shape, dt, seed)``
    (the problem's own ``noise_source(seed, dt, state, saved)`` hook, when it has one, for the last two)."""
    dtype, device = state.x.dtype, state.x.device
    source = as_noise(noise)
    hook = getattr(trainable, "noise_source", None)
    if source is None and hook is not None:
        source = hook(seed, dt, state, history.noise if history is not None else None)
    elif source is None and history is not None and history.noise is not None:
        if BrownianNoise.kind not in history.noise:
            raise ValueError(f"the history was produced with user-supplied noise ({', '.join(history.noise)}); "
                             f"pass the same noise= again to continue it")
        source = BrownianNoise.from_state_dict(history.noise, dtype, device)
    elif source is None:
        source = BrownianNoise(shape, float(dt), seed=seed, dtype=dtype, device=device)
    elif isinstance(source, BrownianNoise):
        source = source.copy()
    else:  # a tensor or function: indexed by the step count, so it is positioned at the start
        source = source.copy()
        source.position = start
        source.expect(shape, dtype, device)
        return source
    if isinstance(source, BrownianNoise) and (source.shape != shape or source.dtype != dtype
                                              or source.device != device or source.dt != float(dt)):
        raise ValueError(f"the noise source {source!r} does not fit the run: expected shape "
                         f"{shape}, dt={float(dt)}, dtype={dtype} on {device}")
    if source.position != start:  # a stream continues from where it was left: it must be at the start
        raise ValueError(f"the noise source is at step {source.position} but the run starts at step {start}; "
                         f"pass the history saved with this state (it carries the noise position)")
    return source


def _check_options(steps, record_every, chunk, check_every, progress_every, callback_every, record, callback,
                   reduce, bound, progress, compile, fuse) -> tuple[int, ...]:
    steps = _checks.check_count(steps, "steps", minimum=0)
    record_every = _checks.check_count(record_every, "record_every")
    chunk = _checks.check_count(chunk, "chunk")
    check_every = _checks.check_count(check_every, "check_every")
    progress_every = _checks.check_count(progress_every, "progress_every")
    callback_every = record_every if callback_every is None else _checks.check_count(callback_every, "callback_every")
    for name, fn in (("record", record), ("callback", callback), ("reduce", reduce)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be a function or None, got {type(fn).__name__}")
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0):
        raise ValueError(f"bound must be a positive number or None, got {bound!r}")
    if progress not in (None, True, False):
        raise TypeError(f"progress must be None (auto), True or False, got {progress!r}")
    if not (compile is True or compile is False or isinstance(compile, str)):
        raise TypeError(f"compile must be \"auto\", True, False or a torch.compile backend name, got {compile!r}")
    fuse = _checks.check_count(fuse, "fuse")
    return steps, record_every, chunk, check_every, progress_every, callback_every, fuse


def check_learning_rate(schedule: Callable, t: torch.Tensor, lr: Any) -> None:
    """``_checks.check_alpha`` of alpha = schedule(t); with members (t of shape (E,)) for each member's alpha."""
    alpha = schedule(t)
    if t.ndim == 0:
        _checks.check_alpha(alpha, t, lr)
        return
    alphas = torch.as_tensor(alpha, dtype=t.dtype, device=t.device)
    if alphas.shape not in ((), t.shape):
        raise ValueError(f"the learning rate of {t.shape[0]} members has shape {tuple(alphas.shape)}; "
                         f"expected one value per member, ({t.shape[0]},)")
    for t_e, alpha_e in zip(t, alphas.expand(t.shape)):
        _checks.check_alpha(alpha_e, t_e, lr)


def _compilation(compile: bool | str, fuse: int, steps: int, state: State) -> tuple[bool | str, int]:
    """``compile="auto"``: eager, compiled or fused, whichever ``choose_compilation`` estimates finishes the
    ``steps`` soonest (short runs stay eager; a warm on-disk cache makes compiling pay off sooner).
    An explicit ``fuse`` > 1 compiles as asked."""
    if compile != "auto":
        return compile, fuse
    if fuse > 1:
        return True, fuse
    from .compiled import choose_compilation, warm_cache_exists  # deferred: importing torch._dynamo takes seconds

    particles = state.x.shape[:-1].numel()  # all of them: N, or E x N for an ensemble
    chosen = choose_compilation(steps, particles, warm_cache=warm_cache_exists())
    return chosen.compile, chosen.fuse


def setup(
    problem: Any, state: State, steps: int, dt: float, lr: LearningRate, seed: int = 0, *,
    record_every: int = 100, mode: Mode = "auto", noise: NoiseLike = None, history: History | None = None,
    chunk: int = 1024, record: Callable[[State], Any] | None = None, callback: Callable[[int, State], Any] | None = None,
    callback_every: int | None = None, check_every: int = 100, bound: float | None = None,
    progress_every: int = 256, progress: bool | None = None, checkpoint: Checkpointing | str | os.PathLike | None = None,
    reduce: GradientReduce | None = None, compile: bool | str = "auto", fuse: int = 1,
    optimizer: GradientTransformation | None = None,
) -> Loop:
    """Validate everything once and build the ``Loop`` of ``run`` (same arguments), positioned at the
    history's step (0 for a new run) and ending ``steps`` later. Nothing is stepped."""
    steps, record_every, chunk, check_every, progress_every, callback_every, fuse = _check_options(
        steps, record_every, chunk, check_every, progress_every, callback_every, record, callback, reduce, bound,
        progress, compile, fuse)
    checkpoint = as_checkpointing(checkpoint)
    if history is not None and not isinstance(history, History):
        raise TypeError(f"history must be a fwdtrain.History (from run or load), got {type(history).__name__}")
    if not isinstance(state, State):
        raise TypeError(f"run(problem, state, ...) expects a fwdtrain.State (from fwdtrain.init), "
                        f"got {type(state).__name__}")
    trainable = as_trainable(problem, optimizer)
    trainable.check(state, dt, lr)  # the opt_state's fit to the rule included: before any step
    schedule = _schedule(lr, state)
    for t in (state.t, state.t + steps * float(dt)):  # alpha(t) at both ends now, in between at every check
        check_learning_rate(schedule, t, lr)
    compile, fuse = _compilation(compile, fuse, steps, state)
    resolved = trainable.resolve_mode(state, mode)
    compiling = compile is not False or fuse > 1
    if compiling and mode == "auto":
        # torch 2.13's dynamo cannot trace forward mode (jvp under vmap fails in fake-tensor propagation,
        # so the compiled step would fall back to eager): compile the reverse-mode step instead
        resolved = "reverse"
    initial = flags(trainable, state, bound)
    if not bool(initial.all()):
        which = f" (members {torch.nonzero(~initial).flatten().tolist()})" if initial.ndim else ""
        above = f" or entries above bound={bound}" if bound else ""
        raise ValueError(f"the initial state has non-finite entries{above}{which}")
    if checkpoint is not None:
        probe(checkpoint.path)
    device = state.x.device
    zero = torch.zeros((), dtype=torch.float64, device=device)
    start, total, window = 0, zero, (0, zero)  # window: (step, total) at the last record on the grid
    if history is not None and len(history.step):
        if history.carry is None or history.average_cost is None:
            raise ValueError("history has no carry (it was not returned by fwdtrain.run or load); "
                             "it cannot be continued")
        start = history.steps
        total = history.carry["cost_total"].to(device)
        window = (int(history.carry["window_start"]), history.carry["window_total"].to(device))
        if not torch.equal(history.t[-1].to(state.t), state.t):
            raise ValueError(f"history ends at t = {history.t[-1].tolist()} but state.t = {state.t.tolist()}: "
                             f"pass the history that was returned (or saved) with this state")
    members = _members(trainable, initial, history)
    source = _noise_source(trainable, noise, history, seed, tuple(trainable.noise_shape(state)), dt, start, state)
    chosen = kernels(trainable, dt, resolved, reduce, schedule, True if compile is False and compiling else compile, fuse)
    show = steps > 0 and progress_enabled(progress)
    events = Events(record_every, check_every, callback_every if callback is not None else None,
                    progress_every if show else None, checkpoint.every if checkpoint is not None else None)
    record = trainable.record if record is None else record
    return Loop(trainable, chosen, schedule, source, Carry(state, start, total, None), start + steps, dt,
                events=events, bound=bound, chunk=chunk, record=record, previous=history, window=window,
                callback=callback, checkpoint=checkpoint, members=members)


def run(
    problem: Any,
    state: State,
    steps: int,
    dt: float,
    lr: LearningRate,
    seed: int = 0,
    *,
    record_every: int = 100,
    mode: Mode = "auto",
    noise: NoiseLike = None,
    history: History | None = None,
    chunk: int = 1024,
    record: Callable[[State], Any] | None = None,
    callback: Callable[[int, State], Any] | None = None,
    callback_every: int | None = None,
    check_every: int = 100,
    bound: float | None = None,
    progress: bool | None = None,
    progress_every: int = 256,
    checkpoint: Checkpointing | str | os.PathLike | None = None,
    reduce: GradientReduce | None = None,
    compile: bool | str = "auto",
    fuse: int = 1,
    optimizer: GradientTransformation | None = None,
) -> tuple[State, History]:
    """Take ``steps`` pure steps of ``problem`` from ``state``.

    Args:
      problem:        what to train: an ``SDE``/``ControlledSDE`` (the cost form, stepped by
                      ``fwdtrain.euler.advance``), a ``calibration.Calibration`` (N even), an
                      ``sgdct.DriftEstimation`` (noise = the observed increments) or any
                      ``fwdtrain.trainable.Trainable``; ``fwdtrain.ensemble.Ensemble`` (E members in
                      one vmapped step; ``fwdtrain.ensemble.run``) freezes a diverged member and goes on.
      state, dt, lr, mode: as for ``fwdtrain.step``; lr is evaluated as alpha(t_n) on the 0-d
                      tensor t_n (a number becomes a constant 0-d tensor), so nothing is re-traced per step.
      steps:          steps to take in this call.
      seed:           seed of the default noise, ``BrownianNoise(noise_shape, dt, seed=seed)`` (blocks of
                      64 steps). Ignored when ``noise`` is given or ``history`` carries a noise position.
      noise:          a ``BrownianNoise`` (copied, never advanced), a (total_steps, N, m) tensor whose
                      row n is dW_n, or a function ``(start, count) -> (count, N, m)``; n counts from
                      the start of training (``history.steps`` on a resumed run).
      history:        the ``History`` of the run that produced ``state``: the step count, the running
                      average and the noise stream continue from it, and new records are appended.
      chunk:          increments drawn per noise call (does not change the results).
      record_every:   steps between records; the last step is always recorded.
      record:         ``record(state)`` stored at each record (default: the problem's, theta).
      callback:       ``callback(n, state)`` every ``callback_every`` steps (default: record_every).
      check_every:    steps between divergence checks (and at every record, checkpoint and at the
                      end): x, x_tilde and theta finite, and ``max |.| <= bound`` when ``bound`` is
                      given. On failure ``DivergenceError`` carries the last state that passed.
      progress:       tqdm bar: None = only when stderr is a terminal; updated every progress_every steps.
      checkpoint:     ``Checkpointing(path, every, metadata)`` (or a bare path): ``fwdtrain.save`` every
                      ``every`` steps (if given), at the end and on KeyboardInterrupt. The folder is
                      probed before the first step (``CheckpointError``); a save that fails later raises
                      ``CheckpointWriteError`` carrying the state and history reached.
      reduce:         maps the particle-mean gradient before the update (e.g. an all-reduce).
      compile:        "auto" (default): compile when the run is long enough to repay the compile
                      time (``fwdtrain.compiled.choose_compilation``; short runs stay eager). True: run
                      each step through ``torch.compile`` (``fwdtrain.compile_advance``), any problem:
                      same maths, no Python dispatch; the first step compiles (seconds). False: eager.
                      Falls back to eager with a one-line warning if compilation fails. A string names
                      the ``torch.compile`` backend (True is "inductor"; "eager" traces only, for tests).
                      A ``reduce`` hook runs eagerly between the compiled pieces.
      fuse:           K > 1 fuses K steps into one compiled call (``fwdtrain.compile_steps``; implies
                      compile) wherever K steps fit before the next event; single compiled steps fill
                      the gaps. Pick K dividing record_every and check_every (e.g. 4..16).
      optimizer:      the update rule, a ``fwdtrain.optim`` transformation (e.g. ``optim.adam()``), bound
                      to the problem (``as_trainable(problem, optimizer)``); ``state.opt_state`` must be
                      its state (``init(..., optimizer=...)``), checked before the first step. None: the
                      problem's own (plain sgd, theta <- theta - alpha h G, unless it was built with one).
                      A Polyak-Ruppert average in the state (``init(..., average_from=t0)``) is updated
                      every step and recorded as ``history.theta_average``.

    Returns ``(state, history)``. On KeyboardInterrupt the last completed state is returned
    with ``history.interrupted = True`` (and saved when ``checkpoint`` is given).
    """
    loop = setup(problem, state, steps, dt, lr, seed, record_every=record_every, mode=mode, noise=noise,
                 history=history, chunk=chunk, record=record, callback=callback, callback_every=callback_every,
                 check_every=check_every, bound=bound, progress=progress, progress_every=progress_every,
                 checkpoint=checkpoint, reduce=reduce, compile=compile, fuse=fuse, optimizer=optimizer)
    start = loop.carry.n
    bar = ProgressBar(steps, start) if loop.events.progress is not None else None
    if bar is not None:
        loop.on_progress = bar.update
    interrupted = False
    try:
        try:
            loop.advance_to(loop.end)
        except KeyboardInterrupt:
            interrupted = True
            loop.check()  # DivergenceError if it diverged (with members: freezes those that did)
            loop.record_now()
    finally:
        if bar is not None:
            bar.close()
    if loop.carry.n == start and history is not None:
        return state, history._replace(interrupted=torch.tensor(interrupted))
    result = loop.history(interrupted=interrupted)
    if loop.checkpoint is not None:
        write(loop.checkpoint, loop.carry.state, result)
    return loop.carry.state, result


__all__ = ["run", "setup", "Loop", "Carry", "Kernels", "Events", "kernels", "step_function", "within", "flags",
           "gradient_norm",
           "Checkpointing", "History"]
