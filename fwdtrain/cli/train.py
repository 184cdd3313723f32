"""Training a ``Job``: one ``fwdtrain.run`` (a single run, an ensemble, or every rank of a group)."""

from __future__ import annotations

import math
import time
from typing import Any, Literal, NamedTuple

from .. import distributed
from ..compile import kernels
from ..compile.options import Compile
from ..core.errors import CheckpointWriteError, DivergenceError
from ..driver.checkpoint import save
from ..driver.hooks import Checkpointing, Hook, Progress
from ..driver.options import Checks, SaveAt
from ..driver.runner import run
from ..problems import ensemble
from .configure import Job


class Trained(NamedTuple):
    """The run's final state and history, its wall time, and the error of a checkpoint that was not written;
    ``steady``: (steps, seconds) from the run's first block boundary to its end (the steps alone, a compile or a
    kernel's load before them left out; None for a run with no boundary before its end); ``compiled`` and
    ``loaded``: the kernels the run compiled and loaded from disk."""

    state: Any
    history: Any
    wall: float
    unsaved: str | None
    steady: tuple[int, float] | None = None
    compiled: int = 0
    loaded: int = 0


class _Clock(Hook):
    """Times the steps from the run's first block boundary on, where a compile (or a kernel's load) is done: the
    run is cut at ``PIECES`` boundaries (a few block ends more: no change to what the run computes)."""

    PIECES = 16

    def __init__(self, steps: int) -> None:
        self.every = max(1, math.ceil(steps / self.PIECES))
        self.first: tuple[int, float] | None = None
        self.last: tuple[int, float] | None = None

    def at(self, loop: Any) -> None:
        mark = (loop.carry.n, time.perf_counter())
        self.first, self.last = self.first or mark, mark

    def end(self, loop: Any, interrupted: bool) -> None:
        if self.first is not None and loop.carry.n > self.first[0]:
            self.last = (loop.carry.n, time.perf_counter())

    def steady(self) -> tuple[int, float] | None:
        if self.first is None or self.last is None or self.last[0] <= self.first[0]:
            return None
        return self.last[0] - self.first[0], self.last[1] - self.first[1]


class Diverged(Exception):
    """The run diverged (exit status 3): the message says where, and where the last finite state is kept."""


def _hooks(job: Job, clock: _Clock) -> tuple[Hook, ...]:
    args = job.args
    hooks: list[Hook] = [Checkpointing(args.checkpoint, args.checkpoint_every, job.metadata)] if args.checkpoint else []
    hooks.append(clock)
    if not (args.no_progress or args.json):
        hooks.append(Progress(enabled=None))
    return tuple(hooks)


def _run(job: Job, options: dict[str, Any]) -> tuple[Any, Any]:
    example = job.example
    members = None if job.members is None else ensemble.Ensemble(example.trainable, len(job.members))
    if job.grouped:  # the same run on every rank: the group's gradient, per-rank noise (member e: rank seed + e)
        return distributed.distributed_run(
            example.trainable if members is None else members,
            job.start,
            job.remaining,
            example.dt,
            job.lr,
            job.seed,
            checks=Checks(min(100, job.args.record_every)),
            **options,
        )
    if members is not None:  # E seeds, one vmapped run
        return run(members, job.start, job.remaining, example.dt, job.lr, job.seed, **options)
    return run(
        example.trainable,
        job.start,
        job.remaining,
        example.dt,
        job.lr,
        example.noise(job.seed, example.steps),
        **options,
    )


def _kept(job: Job, error: DivergenceError) -> str:
    """Where the last finite state of a divergence is kept, saved to --checkpoint when one was given."""
    args = job.args
    if not args.checkpoint:
        return "rerun with --checkpoint PATH to keep its last finite state, and a smaller --lr or --dt"
    save(args.checkpoint, error.state, error.history, metadata=job.metadata)
    return (
        f"its last finite state (step {error.last_finite_step}) is saved in {args.checkpoint}: continue it with "
        f"--resume {args.checkpoint} and a smaller --lr"
    )


def train(job: Job) -> Trained:
    """Train ``job``; ``Diverged`` on divergence (the last finite state saved to --checkpoint); a checkpoint that
    could not be written at the end is reported in ``Trained.unsaved``, the results kept."""
    args = job.args
    enabled: bool | Literal["auto"] = "auto" if args.compile is None else bool(args.compile or args.fuse)
    clock = _Clock(job.remaining)
    options = dict(
        save=SaveAt(args.record_every),
        optimizer=job.rule,
        solver=job.training["solver"],
        hooks=_hooks(job, clock),
        compile=Compile(enabled, unroll=args.fuse or 1),
    )
    before = kernels.counts()
    start, unsaved = time.perf_counter(), None
    try:
        state, history = _run(job, options)
    except DivergenceError as error:
        message = str(error).split("; the last checked state")[0]
        raise Diverged(f"{message}; {_kept(job, error)}") from error
    except distributed.GroupError as error:
        if error.reason == "non-finite" and args.checkpoint and error.history is not None:
            distributed.save_group(args.checkpoint, error.state, error.history, metadata=job.metadata)
            error.args = (
                f"{error.args[0]}; the last state every rank agreed on (step {error.history.steps}) "
                f"is saved in {args.checkpoint}",
            )
        raise
    except CheckpointWriteError as error:  # trained, not saved: report the results all the same
        state, history, unsaved = error.state, error.history, str(error)
    wall, after = time.perf_counter() - start, kernels.counts()
    return Trained(
        state=state,
        history=history,
        wall=wall,
        unsaved=unsaved,
        steady=clock.steady(),
        compiled=after["compiles"] - before["compiles"],
        loaded=after["loads"] - before["loads"],
    )


__all__ = ["Diverged", "Trained", "train"]
