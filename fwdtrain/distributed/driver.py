"""``distributed_run``: the driver's own ``Loop`` on every rank, with two hooks: the gradient reduce
(``gradient_mean``) and a group check at the end of every segment.

Rank r steps the ordinary loop (``fwdtrain.driver.setup``) on its own particles with its own noise
(``BrownianNoise`` seeded with ``rank_seed(seed, r)``) and ``reduce=gradient_mean``. The loop is
advanced one segment of ``check_every`` steps at a time (``Loop.advance_to``), and after every
segment one ``check_group`` collective confirms that every rank finished it, is finite and holds
the same theta. A rank that raises, diverges or is interrupted inside a segment makes the same
gradient collectives as the others up to the segment's end (with a zero gradient) and reports
there, so every rank stops at the same check with the same verdict.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch

from .. import _checks
from .._tree import squared_norm, tree_map
from ..checkpointing import Checkpointing, CheckpointWriteError, as_checkpointing, probe
from ..driver import Loop, setup
from ..errors import DivergenceError
from ..euler import LearningRate
from ..history import History, concatenate, records
from ..progress import ProgressBar, progress_enabled
from ..sensitivity import Mode
from ..state import State
from .check import DIVERGED, FAILED, INTERRUPTED, OK, check_group
from .checkpoint import save_group
from .group import GroupError, group_mean, is_main, print_main, require_group, world_size
from .reduce import GradientMean, gradient_mean
from .seeds import rank_seed


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


def _next(n: int, every: int | None) -> int:
    """The first multiple of ``every`` after n (never, for None)."""
    return (n // every + 1) * every if every else sys.maxsize


def distributed_run(
    problem: Any,
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
    checkpoint: Checkpointing | str | os.PathLike | None = None,
    compile: bool | str = "auto",
    fuse: int = 1,
    optimizer: Any = None,
) -> tuple[State, History]:
    """``fwdtrain.run`` for this rank's particles with the group's theta; every rank calls it alike.

    Each rank passes its own ``state`` (its N_r particles, the same theta) and the same
    other arguments. Rank r's noise is ``BrownianNoise((N_r, m), dt, seed=rank_seed(seed, r))``
    and the gradient is ``gradient_mean(every, weight=N_r)``, so R ranks equal one process
    with sum_r N_r particles driven by the ranks' noise concatenated along the particle
    axis (with ``every`` > 1, see ``GradientMean``). ``problem`` is any problem ``run`` takes
    whose gradient is a particle mean (an SDE, a ``Calibration``); ``compile`` and ``fuse``
    as for ``run`` (the gradient collective runs between compiled pieces); ``optimizer`` as for ``run``
    (every rank applies the rule to the same reduced gradient, so opt_state stays equal across ranks).

    Every ``check_every`` steps (at step ``history.steps`` first, and at the end) one
    ``check_group`` collective confirms every rank; otherwise every rank raises
    ``GroupError`` there, carrying this rank's last checked state and history (a rank
    that raised re-raises its own error; a divergence on any rank is reason
    "non-finite" on all). Ctrl-C on any rank returns every rank's last checked state
    with ``history.interrupted`` True (saved to ``checkpoint`` when given).
    ``progress`` (a tqdm bar) and ``verbose`` (a line per check) are shown on rank 0
    only, with the group's cost. ``checkpoint``: a path or ``Checkpointing(path, every, metadata)``;
    ``save_group`` at every ``every`` steps and at the end (rank 0 writes). ``history`` continues
    a run (from ``load_group``).

    Returns this rank's final ``State`` and the group's ``History`` (the same records on
    every rank: costs are means over all ranks' particles; the carry is this rank's).
    Works without a process group (a single process).
    """
    steps = _checks.check_count(steps, "steps", minimum=0)
    check_every = _checks.check_count(check_every, "check_every")
    checkpoint = as_checkpointing(checkpoint)
    saving_every = checkpoint.every if checkpoint is not None else None
    if saving_every is not None and saving_every % every:
        raise ValueError(f"checkpoint.every={saving_every} must be a multiple of every={every}")
    require_group()
    if not isinstance(state, State):
        raise TypeError(f"distributed_run(problem, state, ...) expects a fwdtrain.State, got {type(state).__name__}")
    start = history.steps if history is not None else 0
    end = start + steps
    code, error = OK, None
    loop: Loop | None = None
    try:  # validate on this rank; a rank with bad input joins the first check as failed
        reduce = gradient_mean(every, weight=state.particles, start=start)
        loop = setup(problem, state, steps, dt, lr, rank_seed(seed), record_every=record_every, mode=mode,
                     history=history, chunk=chunk, bound=bound, check_every=check_every, progress=False,
                     reduce=reduce, compile=compile, fuse=fuse, optimizer=optimizer)
        if checkpoint is not None and is_main():
            probe(checkpoint.path)
    except Exception as caught:  # noqa: BLE001 - re-raised after the check
        code, error = FAILED, caught
    # the group's records so far, up to the last agreed state (its carry continues the run)
    pieces: list[History] = [loop.history()] if loop is not None else [history] if isinstance(history, History) else []
    good = state  # the last state every rank agreed on (the pieces end there)

    def history_of() -> History | None:
        joined = concatenate(pieces)
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

    def save(at: State, hist: History) -> None:
        try:
            save_group(checkpoint.path, at, hist, metadata=checkpoint.metadata)
        except OSError as failed:  # rank 0 could not write: keep the results (as run does)
            path = os.fspath(checkpoint.path)
            raise CheckpointWriteError(f"could not save the checkpoint {path!r}: {failed.strerror or failed}; the "
                                       f"run's state and history are in this error's .state and .history",
                                       path=path, state=at, history=hist) from None

    agree(state, start, code, error)
    assert loop is not None  # every rank passed the first check
    taken = len(pieces[0].step)  # the loop's records already in the pieces
    bar = ProgressBar(steps, start) if steps and is_main() and progress_enabled(progress) else None
    clock = time.perf_counter()
    n = start
    try:
        while n < end:
            stop = min(_next(n, check_every), _next(n, saving_every), end)
            before = loop.carry
            code, error = OK, None
            try:
                loop.advance_to(stop)
            except GroupError:
                raise
            except KeyboardInterrupt:
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
                        save(good, stopped_history)
                    return good, stopped_history
            carry = loop.carry
            status = agree(carry.state, stop, OK, None, carry.total - before.total, stop - n)
            saving = checkpoint is not None and (stop == end or (saving_every and stop % saving_every == 0))
            if saving:
                loop.record_now()  # as one uninterrupted run records at its checkpoints
            whole = loop.history()
            pieces.append(_group_records(records(whole, taken), state.particles))
            taken = len(whole.step)
            state, n = carry.state, stop
            good = state
            if verbose:
                print_main(f"step {n:>8d}  t {float(state.t):10.3f}  cost {status.cost:.5f}  "
                           f"|G| {float(squared_norm(carry.info.gradient).sqrt()):.3e}  "
                           f"{(n - start) / (time.perf_counter() - clock):8.1f} steps/s  ranks {world_size()}")
            if bar is not None:
                bar.update(n, status.cost)
            if saving:
                save(state, history_of())
    finally:
        if bar is not None:
            bar.close()
    return state, history_of()


__all__ = ["distributed_run"]
