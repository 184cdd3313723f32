"""The driver: a loop over the pure step, with chunked noise, a history, checks and checkpoints.

``run`` is a pure function of its inputs: the same (sde, state, history, noise or
seed, options) give bitwise the same (state, history), whatever the noise chunk
size, and a run resumed from a checkpoint equals the uninterrupted run.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, NamedTuple

import torch

from . import _checks, calibration
from ._tree import leaves, squared_norm, tree_map
from .errors import DivergenceError
from .noise import BrownianNoise, NoiseLike, as_noise
from .problem import SDE
from .sensitivity import Mode
from .state import State, noise_dim
from .euler import GradientReduce, LearningRate, StepInfo, advance, resolve_step_mode
from .stepping import check_step_inputs

Problem = SDE | calibration.Calibration  # what ``run`` trains: the cost form or a calibration


class History(NamedTuple):
    """What ``run`` records every ``record_every`` steps and at the last step (R records).

    step (R,):         step count n since the start of training (continues across resumes).
    t (R,):            time t_n.
    cost (R,):         particle-mean cost averaged over the steps since the previous record at a
                       multiple of ``record_every``: mean over k in (g, n] of mean_i c(X^i_{k-1}).
    grad_norm (R,):    |G_{n-1}|, the norm of the particle-mean gradient estimate of the last step.
    theta:             ``record(state)`` stacked over records (default theta itself: leaves (R, *s)).
    average_cost (R,): float64 running mean of the particle-mean cost over every step since the
                       start of training, (1/n) sum_{k<n} mean_i c(X^i_k): the online estimate of J.
    carry:             what a continuation needs: the noise position after the last record and the
                       running cost sums (a dict of tensors; saved in checkpoints).
    interrupted:       0-d bool tensor, True when the run was stopped by KeyboardInterrupt.

    Every leaf is a tensor, so a History is a pytree like the State (``tree_map`` works on it).

    The last record is always the final state of the run; pass the history back to
    ``run`` (with that state) to continue it.
    """

    step: torch.Tensor
    t: torch.Tensor
    cost: torch.Tensor
    grad_norm: torch.Tensor
    theta: Any
    average_cost: torch.Tensor | None = None
    carry: dict | None = None
    interrupted: torch.Tensor | None = None

    @property
    def steps(self) -> int:
        """Steps taken since the start of training (0 for an empty history)."""
        return int(self.step[-1]) if len(self.step) else 0

    @property
    def noise(self) -> dict | None:
        """The noise position after the last record (``state_dict`` of the source)."""
        return None if self.carry is None else self.carry.get("noise")

    def numpy(self) -> dict[str, Any]:
        """The records as numpy arrays: {"step", "t", "cost", "grad_norm", "theta", "average_cost"}."""
        def as_array(x):
            return x.detach().cpu().numpy()
        out = {"step": as_array(self.step), "t": as_array(self.t), "cost": as_array(self.cost),
               "grad_norm": as_array(self.grad_norm), "theta": tree_map(as_array, self.theta)}
        if self.average_cost is not None:
            out["average_cost"] = as_array(self.average_cost)
        return out


class _Carry(NamedTuple):
    """What the loop carries from step to step (assigned in one statement, so Ctrl-C never splits it).

    total: float64 sum of the particle-mean costs of all steps since the start of training.
    """

    state: State
    n: int
    total: torch.Tensor
    info: StepInfo | None


def step_function(sde: Problem, dt: Any, mode: str, reduce: GradientReduce | None = None
                  ) -> Callable[[State, torch.Tensor, torch.Tensor], tuple[State, StepInfo]]:
    """``one_step(state, dw, alpha) -> (state, info)``: ``step.advance`` with the problem bound.

    For a ``calibration.Calibration`` it is ``calibration.advance``, its info read as
    ``StepInfo(cost=objective, gradient=G)``. The driver calls exactly this function once
    per step; it is the seam where a compiled kernel or a distributed gradient ``reduce`` plugs in.
    """
    if isinstance(sde, calibration.Calibration):
        def calibration_step(state: State, dw: torch.Tensor, alpha: torch.Tensor) -> tuple[State, StepInfo]:
            new_state, info = calibration.advance(sde, state, dw, dt, alpha, mode, reduce)
            return new_state, StepInfo(info.objective, info.gradient)
        return calibration_step

    def one_step(state: State, dw: torch.Tensor, alpha: torch.Tensor) -> tuple[State, StepInfo]:
        return advance(sde, state, dw, dt, alpha, mode, reduce)
    return one_step


def _checked(sde: Problem, state: State, dt: Any, lr: Any, mode: Mode) -> tuple[int, str]:
    """Validate the problem with its own step's checks: (noise dimension m, resolved mode)."""
    dtype, device = state.x.dtype, state.x.device
    if isinstance(sde, calibration.Calibration):
        m = noise_dim(sde.sde, state.theta, state.x)
        calibration._check(sde, state, torch.zeros((state.particles, m), dtype=dtype, device=device), dt, lr)
        return m, calibration._resolve(sde, state, mode)
    m = noise_dim(sde, state.theta, state.x) if isinstance(sde, SDE) else 0
    check_step_inputs(sde, state, torch.zeros((state.particles, max(m, 1)), dtype=dtype, device=device), dt, lr)
    return m, resolve_step_mode(mode, state, m)


def _kernels(sde: Problem, dt: Any, mode: str, reduce: GradientReduce | None, schedule: Callable,
             compiled: bool, fuse: int) -> tuple[Callable, Callable | None]:
    """The per-step function (eager or compiled) and, for fuse > 1, the K-step compiled call."""
    if not compiled:
        return step_function(sde, dt, mode, reduce), None
    if isinstance(sde, calibration.Calibration):
        raise ValueError("compile=True and fuse > 1 compile the cost-form step only; "
                         "train a calibration.Calibration with compile=False and fuse=1")
    from .compiled import compile_advance, compile_steps  # deferred: importing torch._dynamo takes seconds

    one_step = compile_advance(sde, float(dt), mode, reduce)
    fused = compile_steps(sde, float(dt), schedule, mode, fuse, reduce) if fuse > 1 else None
    return one_step, fused


def _within(state: State, bound: float | None) -> bool:
    """All of x, x_tilde, theta finite (and |.| <= bound when given): one reduction, one sync."""
    peak = torch.stack([leaf.detach().abs().amax() for leaf in leaves((state.x, state.x_tilde, state.theta))
                        if leaf.numel()]).amax()
    if bound is None:
        return bool(torch.isfinite(peak))
    return bool(peak <= bound)  # NaN compares False


def _progress_enabled(progress: bool | None, stream=None) -> bool:
    """progress=None: on only when the stream (stderr) is a terminal."""
    if progress is not None:
        return bool(progress)
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class _Progress:
    """A tqdm bar (or a plain carriage-return line without tqdm) updated every few hundred steps."""

    def __init__(self, total: int, start: int) -> None:
        self.start, self.total, self.last, self.clock = start, total, start, time.perf_counter()
        try:
            from tqdm.auto import tqdm
        except ImportError:
            self.bar = None
        else:
            self.bar = tqdm(total=total, unit="step", file=sys.stderr, smoothing=0.1)

    def update(self, n: int, average: torch.Tensor) -> None:
        cost = float(average)
        if self.bar is not None:
            self.bar.set_postfix(cost=f"{cost:.5g}", refresh=False)
            self.bar.update(n - self.last)
        else:
            rate = (n - self.start) / max(time.perf_counter() - self.clock, 1e-9)
            sys.stderr.write(f"\rstep {n - self.start}/{self.total}  {rate:.0f} steps/s  cost {cost:.5g}")
            sys.stderr.flush()
        self.last = n

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            sys.stderr.write("\n")


def _next(n: int, every: int | None) -> int:
    return (n // every + 1) * every if every else sys.maxsize


def _empty_like_records(example: Any) -> Any:
    return tree_map(lambda leaf: torch.as_tensor(leaf)[None][:0], example)


def _build_history(previous: History | None, records: list, empty_record: Any, carry: dict | None,
                   interrupted: bool, dtype: torch.dtype, device: torch.device) -> History:
    """Stack the new records (and append them to ``previous``)."""
    if records:
        step = torch.tensor([r[0] for r in records], dtype=torch.long)
        t, cost, grad, average = (torch.stack([r[i] for r in records]) for i in range(1, 5))
        theta = tree_map(lambda *xs: torch.stack([torch.as_tensor(x) for x in xs]), *[r[5] for r in records])
    else:
        step = torch.zeros(0, dtype=torch.long)
        t = cost = grad = torch.zeros(0, dtype=dtype, device=device)
        average = torch.zeros(0, dtype=torch.float64, device=device)
        theta = empty_record
    if previous is not None and len(previous.step):
        step, t, cost, grad, average = (torch.cat([old, new]) for old, new in zip(
            (previous.step, previous.t, previous.cost, previous.grad_norm, previous.average_cost),
            (step, t, cost, grad, average)))
        theta = tree_map(lambda old, new: torch.cat([old, new]), previous.theta, theta)
    return History(step, t, cost, grad, theta, average, carry, torch.tensor(interrupted))


def run(
    sde: Problem,
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
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    metadata: dict | None = None,
    reduce: GradientReduce | None = None,
    compile: bool = False,
    fuse: int = 1,
) -> tuple[State, History]:
    """Take ``steps`` pure steps of the forward-propagation algorithm from ``state``.

    Args:
      sde, state, dt, lr, mode: as for ``fwdtrain.step``; lr is evaluated as alpha(t_n) on the 0-d
        tensor t_n (a number becomes a constant 0-d tensor), so nothing is re-traced per step.
        ``sde`` may also be a ``calibration.Calibration`` (state from ``calibration.init``, N even),
        stepped by ``calibration.advance``: cost is then its two-group estimate of J and the
        gradient G (compile and fuse are for the cost-form step only).
      steps:          steps to take in this call.
      seed:           seed of the default noise, ``BrownianNoise((N, m), dt, seed=seed)`` (blocks of
                      64 steps). Ignored when ``noise`` is given or ``history`` carries a noise position.
      noise:          a ``BrownianNoise`` (copied, never advanced), a (total_steps, N, m) tensor whose
                      row n is dW_n, or a function ``(start, count) -> (count, N, m)``; n counts from
                      the start of training (``history.steps`` on a resumed run).
      history:        the ``History`` of the run that produced ``state``: the step count, the running
                      average and the noise stream continue from it, and new records are appended.
      chunk:          increments drawn per noise call (does not change the results).
      record_every:   steps between records; the last step is always recorded.
      record:         ``record(state)`` stored at each record (default: ``state.theta``).
      callback:       ``callback(n, state)`` every ``callback_every`` steps (default: record_every).
      check_every:    steps between divergence checks (and at every record, checkpoint and at the
                      end): x, x_tilde and theta finite, and ``max |.| <= bound`` when ``bound`` is
                      given. On failure ``DivergenceError`` carries the last state that passed.
      progress:       tqdm bar: None = only when stderr is a terminal; updated every progress_every steps.
      checkpoint:     path for ``fwdtrain.save``: written every ``checkpoint_every`` steps (if given),
                      at the end and on KeyboardInterrupt, with ``metadata``.
      reduce:         maps the particle-mean gradient before the update (e.g. an all-reduce).
      compile:        run each step through ``torch.compile`` (``fwdtrain.compile_advance``): same
                      maths, no Python dispatch; the first step compiles (seconds), later steps
                      never recompile. Falls back to eager with a warning if compilation fails.
      fuse:           K > 1 fuses K steps into one compiled call (``fwdtrain.compile_steps``; implies
                      compile) wherever K steps fit before the next record, check, callback or
                      progress update; single compiled steps fill the gaps. Pick K dividing
                      record_every and check_every (e.g. 4..16: compile time grows with K).

    Returns ``(state, history)``. On KeyboardInterrupt the last completed state is returned
    with ``history.interrupted = True`` (and saved when ``checkpoint`` is given).
    """
    # ---- validate everything once; the loop below runs unchecked ----
    steps = _checks.check_count(steps, "steps", minimum=0)
    record_every = _checks.check_count(record_every, "record_every")
    chunk = _checks.check_count(chunk, "chunk")
    check_every = _checks.check_count(check_every, "check_every")
    progress_every = _checks.check_count(progress_every, "progress_every")
    callback_every = record_every if callback_every is None else _checks.check_count(callback_every, "callback_every")
    if checkpoint_every is not None:
        checkpoint_every = _checks.check_count(checkpoint_every, "checkpoint_every")
    for name, fn in (("record", record), ("callback", callback), ("reduce", reduce)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be a function or None, got {type(fn).__name__}")
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0):
        raise ValueError(f"bound must be a positive number or None, got {bound!r}")
    if progress not in (None, True, False):
        raise TypeError(f"progress must be None (auto), True or False, got {progress!r}")
    if compile not in (True, False):
        raise TypeError(f"compile must be True or False, got {compile!r}")
    fuse = _checks.check_count(fuse, "fuse")
    if history is not None and not isinstance(history, History):
        raise TypeError(f"history must be a fwdtrain.History (from run or load), got {type(history).__name__}")
    if not isinstance(state, State):
        raise TypeError(f"run(sde, state, ...) expects a fwdtrain.State (from fwdtrain.init), got {type(state).__name__}")
    dtype, device = state.x.dtype, state.x.device
    m, resolved = _checked(sde, state, dt, lr, mode)
    if not _within(state, bound):
        raise ValueError("the initial state has non-finite entries" + (f" or entries above bound={bound}" if bound else ""))
    record = (lambda s: s.theta) if record is None else record

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
            raise ValueError(f"history ends at t = {float(history.t[-1])} but state.t = {float(state.t)}: "
                             f"pass the history that was returned (or saved) with this state")
    source = as_noise(noise)
    if source is None and history is not None and history.noise is not None:
        if BrownianNoise.kind not in history.noise:
            raise ValueError(f"the history was produced with user-supplied noise ({', '.join(history.noise)}); "
                             f"pass the same noise= again to continue it")
        source = BrownianNoise.from_state_dict(history.noise, dtype, device)
    elif source is None:
        source = BrownianNoise((state.particles, m), float(dt), seed=seed, dtype=dtype, device=device)
    else:
        source = source.copy()
    if isinstance(source, BrownianNoise):
        if (source.shape != (state.particles, m) or source.dtype != dtype or source.device != device
                or source.dt != float(dt)):
            raise ValueError(f"the noise source {source!r} does not fit the run: expected shape "
                             f"({state.particles}, {m}), dt={float(dt)}, dtype={dtype} on {device}")
        if source.position != start:
            raise ValueError(f"the noise source is at step {source.position} but the run starts at step {start}; "
                             f"pass the history saved with this state (it carries the noise position)")
    else:
        source.position = start
        if source.shape is not None and tuple(source.shape) != (state.particles, m):
            raise ValueError(f"noise increments have shape {tuple(source.shape)} per step, expected "
                             f"({state.particles}, {m})")
    if callable(lr):
        schedule = lr
    else:
        alpha = torch.as_tensor(lr, dtype=dtype, device=device).clone()
        schedule = lambda t: alpha  # noqa: E731
    one_step, fused = _kernels(sde, dt, resolved, reduce, schedule, compile or fuse > 1, fuse)

    # ---- the loop ----
    end = start + steps
    records: list = []
    empty_record = _empty_like_records(record(state))
    carry = _Carry(state, start, total, None)
    good = (carry, source.state_dict(start))  # the last carry known finite, with its noise position
    bar = _Progress(steps, start) if steps and _progress_enabled(progress) else None

    def append_record(c: _Carry) -> None:
        nonlocal window
        if c.info is None or (records and records[-1][0] == c.n):
            return
        g, total_g = window
        records.append((c.n, c.state.t, ((c.total - total_g) / (c.n - g)).to(dtype),
                        squared_norm(c.info.gradient).sqrt(), c.total / c.n, record(c.state)))
        if c.n % record_every == 0:
            window = (c.n, c.total)

    def history_at(c: _Carry, noise_state: dict, interrupted: bool = False) -> History:
        carried = {"noise": noise_state, "cost_total": c.total,
                   "window_start": torch.tensor(window[0], dtype=torch.int64), "window_total": window[1]}
        return _build_history(history, records, empty_record, carried, interrupted, dtype, device)

    def save(c: _Carry, hist: History) -> None:
        from .checkpoint import save as save_checkpoint
        save_checkpoint(checkpoint, c.state, hist, metadata=metadata)

    def diverged(n: int) -> DivergenceError:
        last, noise_state = good  # no record is ever taken after the last passed check
        append_record(last)
        limit = f" or exceeded bound={bound}" if bound is not None else ""
        return DivergenceError(
            f"the run diverged: x, x_tilde or theta became non-finite{limit} between step {last.n} and "
            f"step {n} (t = {float(last.state.t):.6g} to {float(last.state.t) + (n - last.n) * float(dt):.6g}); "
            f"the last finite state (step {last.n}) is in error.state; try a smaller lr or dt",
            step=n, last_finite_step=last.n, state=last.state, history=history_at(last, noise_state))

    def on_event(c: _Carry) -> int:
        nonlocal good
        n = c.n
        is_record = n % record_every == 0 or n == end
        is_checkpoint = checkpoint is not None and checkpoint_every is not None and n % checkpoint_every == 0
        if is_record or is_checkpoint or n % check_every == 0:
            if not _within(c.state, bound):
                raise diverged(n)
            good = (c, source.state_dict(n))
        if is_record:
            append_record(c)
        if callback is not None and n % callback_every == 0:
            callback(n, c.state)
        if bar is not None and (n % progress_every == 0 or n == end):
            bar.update(n, c.total / n)
        if is_checkpoint and n != end:
            append_record(c)
            save(c, history_at(c, good[1]))
        return _next_event(n)

    def _next_event(n: int) -> int:
        return min(_next(n, record_every), _next(n, check_every), _next(n, callback_every if callback else None),
                   _next(n, progress_every if bar else None),
                   _next(n, checkpoint_every if checkpoint is not None else None), end)

    next_event = _next_event(start)
    interrupted = False
    try:
        try:
            while carry.n < end:
                block = source.draw(min(chunk, end - carry.n))
                i = 0
                while i < len(block):
                    if fused is not None and next_event - carry.n >= fuse and len(block) - i >= fuse:
                        new, infos = fused(carry.state, block[i:i + fuse])
                        total = carry.total
                        for cost in infos.cost:  # the same float64 sum, one step at a time
                            total = total + cost
                        info = StepInfo(infos.cost[-1], tree_map(lambda g: g[-1], infos.gradient))
                        carry = _Carry(new, carry.n + fuse, total, info)
                        i += fuse
                    else:
                        new, info = one_step(carry.state, block[i], schedule(carry.state.t))
                        carry = _Carry(new, carry.n + 1, carry.total + info.cost, info)
                        i += 1
                    if carry.n == next_event:
                        next_event = on_event(carry)
        except KeyboardInterrupt:
            interrupted = True
            if not _within(carry.state, bound):
                raise diverged(carry.n) from None
            append_record(carry)
    finally:
        if bar is not None:
            bar.close()
    if carry.n == start and history is not None:
        return state, history._replace(interrupted=torch.tensor(interrupted))
    result = history_at(carry, source.state_dict(carry.n), interrupted)
    if checkpoint is not None:
        save(carry, result)
    return carry.state, result
