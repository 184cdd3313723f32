"""``distributed_run``: ``fwdtrain.run`` on every rank of a group, in segments that end at group checks.

Rank r runs the ordinary driver on its own particles with its own noise
(``BrownianNoise`` seeded with ``rank_seed(seed, r)``) and ``reduce=gradient_mean``; the
driver is called for one segment of ``check_every`` steps at a time (``run(..., history=)``
continues a run bitwise, so segments change nothing), and after every segment one
``check_group`` collective confirms that every rank finished it, is finite and holds the
same theta. A rank that raises, diverges or is interrupted inside a segment makes the
same gradient collectives as the others up to the segment's end (with a zero gradient)
and reports there, so every rank stops at the same check with the same verdict.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch

from .. import _checks
from .._tree import tree_map
from ..driver import run
from ..history import History
from ..progress import ProgressBar as _Progress, progress_enabled as _progress_enabled
from ..errors import DivergenceError
from ..problem import SDE
from ..sensitivity import Mode
from ..state import State
from ..euler import LearningRate
from .check import DIVERGED, FAILED, INTERRUPTED, OK, check_group
from .group import GroupError, group_mean, is_main, print_main, require_group, world_size
from .reduce import GradientMean, gradient_mean
from .seeds import rank_seed

_FIELDS = ("step", "t", "cost", "grad_norm", "average_cost")


def _records(history: History, start: int, stop: int | None = None) -> History:
    """Records start:stop of ``history`` (the carry and flag kept)."""
    cut = slice(start, stop)
    return history._replace(**{name: getattr(history, name)[cut] for name in _FIELDS},
                            theta=tree_map(lambda leaf: leaf[cut], history.theta))


def _join(pieces: list[History]) -> History | None:
    """The records of ``pieces`` one after the other, with the last piece's carry and flag."""
    if not pieces:
        return None
    if len(pieces) == 1:
        return pieces[0]
    last = pieces[-1]
    return last._replace(**{name: torch.cat([getattr(p, name) for p in pieces]) for name in _FIELDS},
                         theta=tree_map(lambda *xs: torch.cat(xs), *[p.theta for p in pieces]))


def _group_records(piece: History, particles: int) -> History:
    """The records' costs as means over every rank's particles (one all_reduce)."""
    if not len(piece.step):
        return piece
    cost, average = group_mean((piece.cost, piece.average_cost), particles, what="the cost history")
    return piece._replace(cost=cost, average_cost=average)


def _play_out(reduce: GradientMean, stop: int, theta: Any) -> None:
    """Make the gradient collectives the other ranks make up to step ``stop``, with a zero gradient."""
    zeros = tree_map(torch.zeros_like, theta)
    while reduce.calls < stop:
        reduce(zeros)


def distributed_run(
    sde: SDE,
    state: State,
    steps: int,
    dt: float,
    lr: LearningRate,
    seed: int = 0,
    *,
    record_every: int = 100,
    mode: Mode = "auto",
    every: int = 1,
    check_every: int = 100,
    history: History | None = None,
    chunk: int = 1024,
    bound: float | None = None,
    progress: bool | None = False,
    verbose: bool = False,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    metadata: dict | None = None,
) -> tuple[State, History]:
    """``fwdtrain.run`` for this rank's particles with the group's theta; every rank calls it alike.

    Each rank passes its own ``state`` (its N_r particles, the same theta) and the same
    other arguments. Rank r's noise is ``BrownianNoise((N_r, m), dt, seed=rank_seed(seed, r))``
    and the gradient is ``gradient_mean(every, weight=N_r)``, so R ranks equal one process
    with sum_r N_r particles driven by the ranks' noise concatenated along the particle
    axis (with ``every`` > 1, see ``GradientMean``).

    Every ``check_every`` steps (at step ``history.steps`` first, and at the end) one
    ``check_group`` collective confirms every rank; otherwise every rank raises
    ``GroupError`` there, carrying this rank's last checked state and history (a rank
    that raised re-raises its own error; a divergence on any rank is reason
    "non-finite" on all). Ctrl-C on any rank returns every rank's last checked state
    with ``history.interrupted`` True (saved to ``checkpoint`` when given).
    ``progress`` (a tqdm bar) and ``verbose`` (a line per check) are shown on rank 0
    only, with the group's cost. ``checkpoint``: ``save_group`` every
    ``checkpoint_every`` steps and at the end (rank 0 writes). ``history`` continues
    a run (from ``load_group``).

    Returns this rank's final ``State`` and the group's ``History`` (the same records on
    every rank: costs are means over all ranks' particles; the carry is this rank's).
    Works without a process group (a single process).
    """
    steps = _checks.check_count(steps, "steps", minimum=0)
    check_every = _checks.check_count(check_every, "check_every")
    if checkpoint_every is not None:
        checkpoint_every = _checks.check_count(checkpoint_every, "checkpoint_every")
        if checkpoint_every % every:
            raise ValueError(f"checkpoint_every={checkpoint_every} must be a multiple of every={every}")
    require_group()
    if not isinstance(state, State):
        raise TypeError(f"distributed_run(sde, state, ...) expects a fwdtrain.State, got {type(state).__name__}")
    start = history.steps if history is not None else 0
    options = dict(record_every=record_every, mode=mode, chunk=chunk, bound=bound, check_every=check_every,
                   progress=False)
    code, error = OK, None
    try:  # validate on this rank; a rank with bad input joins the first check as failed
        reduce = gradient_mean(every, weight=state.particles, start=start)
        noise_seed = rank_seed(seed)
        state, history = run(sde, state, 0, dt, lr, noise_seed, history=history, **options)
    except Exception as caught:  # noqa: BLE001 - re-raised after the check
        code, error = FAILED, caught
    pieces: list[History] = [history] if isinstance(history, History) else []
    dangling = False  # the last piece ends with a record off the record_every grid (dropped when continued)
    good = state  # the last state every rank agreed on (the pieces end there)

    def history_of() -> History | None:
        joined = _join(pieces)
        pieces[:] = [joined] if joined is not None else []
        return joined

    def agree(at: State, n: int, code: int, error: Exception | None, cost: Any = 0.0, count: int = 0):
        try:
            return check_group(at, n, code=code, cost=cost, cost_steps=count, last_good=good)
        except GroupError as stop:
            stop.history = history_of() if stop.state is good else None
            if error is not None and code & FAILED:
                raise error  # the rank that raised shows its own error; the others show the GroupError
            raise stop from error

    agree(state, start, code, error)
    end = start + steps
    base = history  # the driver's history of the last segment: its last record carries the continuation
    bar = _Progress(steps, start) if steps and is_main() and _progress_enabled(progress) else None
    clock = time.perf_counter()
    n = start
    try:
        while n < end:
            stop = min(_next(n, check_every), _next(n, checkpoint_every if checkpoint is not None else None), end)
            tail = _records(base, -1)
            code, error = OK, None
            try:
                new_state, out = run(sde, state, stop - n, dt, lr, noise_seed, history=tail, reduce=reduce,
                                     **options)
                if bool(out.interrupted):
                    code = INTERRUPTED
            except GroupError:
                raise
            except KeyboardInterrupt:  # outside the driver's own loop (its set-up)
                code = INTERRUPTED
            except DivergenceError as caught:
                code, error = DIVERGED, caught
            except Exception as caught:  # noqa: BLE001 - re-raised after the check
                code, error = FAILED, caught
            if code != OK:
                try:
                    _play_out(reduce, stop, state.theta)
                except GroupError:
                    if error is not None:
                        raise error from None
                    raise
                try:
                    agree(good, stop, code, error)
                except GroupError as stopped:
                    if stopped.reason != "interrupted":
                        raise
                    stopped_history = history_of()._replace(interrupted=torch.tensor(True))
                    if checkpoint is not None:  # every rank is here: save the agreed state
                        from .checkpoint import save_group
                        save_group(checkpoint, good, stopped_history, metadata=metadata)
                    return good, stopped_history
            status = agree(new_state, stop, OK, None, out.carry["cost_total"] - base.carry["cost_total"], stop - n)
            # the driver records the last step of every call; keep only the record_every grid, the end and
            # checkpoints, as one uninterrupted run does
            if dangling:
                pieces[-1] = _records(pieces[-1], 0, -1)
            pieces.append(_group_records(_records(out, len(tail.step)), state.particles))
            saving = checkpoint is not None and (stop == end or (checkpoint_every and stop % checkpoint_every == 0))
            dangling = not saving and stop % record_every != 0
            state, base, n = new_state, out, stop
            good = state
            if verbose:
                print_main(f"step {n:>8d}  t {float(state.t):10.3f}  cost {status.cost:.5f}  "
                           f"|G| {float(out.grad_norm[-1]):.3e}  "
                           f"{(n - start) / (time.perf_counter() - clock):8.1f} steps/s  ranks {world_size()}")
            if bar is not None:
                bar.update(n, status.cost)
            if saving:
                from .checkpoint import save_group
                save_group(checkpoint, state, history_of(), metadata=metadata)
    finally:
        if bar is not None:
            bar.close()
    return state, history_of()


def _next(n: int, every: int | None) -> int:
    """The first multiple of ``every`` after n (never, for None)."""
    return (n // every + 1) * every if every else sys.maxsize


__all__ = ["distributed_run"]
