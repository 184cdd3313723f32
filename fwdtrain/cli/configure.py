"""From the command line's options (and a checkpoint to resume) to a ``Job``: what to train and how.

Everything that can fail is checked here, before the first step: the options against each other and
against the checkpoint, the checkpoint's fit to the problem, and every path the run will write to.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .. import distributed, examples, optim, plotting
from ..core import schedules
from ..core.errors import CheckpointError
from ..core.state import State, with_optimizer
from ..driver.checkpoint import check_compatible, load
from ..driver.hooks import probe
from ..problems import ensemble
from .parser import DTYPES, UsageError


class Job(NamedTuple):
    """What the command line trains: the problem and its example, the start and what is left to do, the
    learning rate and update rule, the metadata a checkpoint carries, and the group (if any)."""

    args: argparse.Namespace
    problem: str
    example: Any
    members: list[Any] | None  # the members' examples (--ensemble), else None
    start: tuple[State, Any]  # (state, history or None)
    done: int  # steps already taken (a resumed run)
    remaining: int
    lr: Callable[[torch.Tensor], Any]
    lr0: float
    schedule: str  # its label, for the table
    seed: int
    rule: optim.GradientTransformation | None
    training: dict[str, Any]  # optimizer, clip, average_from: as given or saved
    metadata: dict[str, Any]
    size: int  # processes in the group (1 without one)

    @property
    def grouped(self) -> bool:
        return self.size > 1 or distributed.is_initialized()

    @property
    def plot_path(self) -> str | None:
        """Where the plot goes, or None (--no-plot, an ensemble, another rank, or no matplotlib)."""
        if self.args.no_plot or self.members is not None or not distributed.is_main() or not plotting.available():
            return None
        return self.args.plot or f"fwdtrain-{self.problem}.png"


def resume(args: argparse.Namespace, named: bool, grouped: bool) -> tuple[Any, dict[str, Any]]:
    """(checkpoint, saved metadata) of --resume, or (None, {})."""
    if not args.resume:
        return None, {}
    checkpoint = distributed.load_group(args.resume) if grouped else load(args.resume)
    saved = dict(checkpoint.metadata)
    saved.pop("ranks", None)
    if not grouped and saved.get("world_size", 1) != 1:
        raise UsageError(
            f"--resume {args.resume} holds a run of {saved['world_size']} processes; resume it with "
            f"torchrun --nproc-per-node {saved['world_size']} -m fwdtrain ..."
        )
    if named and saved.get("problem", args.problem) != args.problem:
        raise CheckpointError(f"--resume {args.resume} holds a {saved['problem']!r} run, not {args.problem!r}")
    if checkpoint.history is None:
        raise CheckpointError(
            f"--resume {args.resume} holds a state saved without its history, so the step count "
            f"and the noise position are unknown; continue it from Python with "
            f"fwdtrain.run(..., noise=...) or start a new run"
        )
    return checkpoint, saved


def _options(args: argparse.Namespace, saved: dict[str, Any], resuming: bool) -> dict[str, Any]:
    """The builder's keywords: the checkpoint's particles, dt, seed, steps and dtype, then the options given
    (a resumed run refuses another particles, dt, dtype or seed: its noise continues that seed's stream)."""
    options: dict[str, Any] = {key: saved[key] for key in ("particles", "dt", "seed", "steps") if key in saved}
    if "dtype" in saved:
        options["dtype"] = DTYPES[saved["dtype"]]
    given = {
        "particles": args.particles,
        "dt": args.dt,
        "seed": args.seed,
        "steps": args.steps,
        "dtype": DTYPES[args.dtype] if args.dtype else None,
    }
    for key in ("particles", "dt", "dtype", "seed"):
        if resuming and given[key] is not None and key in options and given[key] != options[key]:
            why = (
                f"; the resumed noise continues seed {saved[key]}'s stream: drop --seed (or start a new run)"
                if key == "seed"
                else ""
            )
            raise UsageError(f"--{key} {getattr(args, key)} differs from the resumed run's {saved[key]}{why}")
    options.update({key: value for key, value in given.items() if value is not None})
    return options


def _training(args: argparse.Namespace, saved: dict[str, Any], resuming: bool) -> dict[str, Any]:
    """--optimizer, --clip and --average-from: given, or the resumed run's (another value is refused)."""
    training = {
        "optimizer": saved.get("optimizer", "sgd"),
        "clip": saved.get("clip"),
        "average_from": saved.get("average_from"),
        "solver": saved.get("solver", "euler"),
    }
    for key, flag in (
        ("optimizer", "--optimizer"),
        ("clip", "--clip"),
        ("average_from", "--average-from"),
        ("solver", "--solver"),
    ):
        value = getattr(args, key)
        if resuming and value is not None and value != training[key]:
            raise UsageError(
                f"{flag} {value} differs from the resumed run's {training[key]}: its state continues "
                f"as saved (drop {flag}, or start a new run)"
            )
        if value is not None:
            training[key] = value
    return training


def update_rule(name: str, clip: float | None) -> optim.GradientTransformation | None:
    """The rule of --optimizer and --clip: None for plain sgd, else ``optim.optimizer(name)`` after
    ``clip_by_global_norm(clip)`` when clipping."""
    if name == "sgd" and clip is None:
        return None
    rule = optim.optimizer(name)  # type: ignore[arg-type]  # argparse's choices are optim.OPTIMIZERS
    return rule if clip is None else optim.chain(optim.clip_by_global_norm(clip), rule)


def learning_rate(example: Any, lr: float | None, name: str | None, offset: float) -> tuple[Callable, float]:
    """(schedule, alpha(0)): the named schedule starting at ``lr`` (default: the problem's alpha(0)), or,
    without a name, the problem's own schedule scaled so that alpha(0) = lr."""
    own = example.lr if callable(example.lr) else schedules.constant(float(example.lr))
    own0 = float(own(torch.zeros((), dtype=example.x0.dtype)))
    base = own0 if lr is None else float(lr)
    if name == "constant":
        return schedules.constant(base), base
    if name == "inverse-time":
        return schedules.inverse_time(base * offset, offset), base
    if name == "staged":
        return schedules.staged(base), base
    if lr is None or base == own0:
        return own, own0
    if own0 == 0:
        raise UsageError("--lr: the problem's learning rate starts at 0 and cannot be scaled; choose a --schedule too")
    factor = base / own0
    return (lambda t: own(t) * factor), base


def _members(args: argparse.Namespace, saved: dict[str, Any], resuming: bool) -> int | None:
    """E of --ensemble (or of the resumed ensemble); None for a single run. A mismatch is refused."""
    stored = saved.get("ensemble")
    if resuming and args.ensemble is not None and stored != args.ensemble:
        held = f"an ensemble of {stored}" if stored else "a single run"
        raise UsageError(f"--ensemble {args.ensemble}: --resume {args.resume} holds {held}")
    return args.ensemble if args.ensemble is not None else stored


def _start(job_parts: dict[str, Any], checkpoint: Any) -> tuple[State, Any]:
    """The first state (new run) or the checkpoint's (resumed: checked against the problem)."""
    example, members, rule, training = (job_parts[k] for k in ("example", "members", "rule", "training"))
    if members is None:
        first = with_optimizer(example.initial_state(), rule, average_from=training["average_from"])
    else:
        first = ensemble.stack(
            [with_optimizer(ex.initial_state(), rule, average_from=training["average_from"]) for ex in members]
        )
    if checkpoint is None:
        return first, None
    problem = job_parts["problem"]
    if members is None:
        check_compatible(checkpoint.state, example.theta, x0=example.x0, name=f"this problem ({problem})")
    else:
        check_compatible(checkpoint.state, first.theta, name=f"this ensemble of {len(members)} {problem} runs")
    return checkpoint.state, checkpoint.history


def prepare(args: argparse.Namespace, named: bool) -> Job:
    """The ``Job`` of these options (resumed from --resume), every path probed; raises ``UsageError``,
    ``CheckpointError`` or ``ValueError`` before anything is trained."""
    grouped = distributed.is_initialized()
    size = distributed.world_size() if grouped else 1
    checkpoint, saved = resume(args, named, grouped)
    resuming = checkpoint is not None
    problem = saved.get("problem", args.problem)
    if problem not in examples.REGISTRY:
        raise UsageError(f"--resume {args.resume} holds a {problem!r} run, which this fwdtrain does not know")
    options, training = _options(args, saved, resuming), _training(args, saved, resuming)
    rule = update_rule(training["optimizer"], training["clip"])
    example = examples.REGISTRY[problem](**options)
    seed = options.get("seed", 0)
    name, offset = args.schedule or saved.get("schedule"), args.lr_offset or saved.get("lr_offset") or 50.0
    lr, lr0 = learning_rate(example, args.lr if args.lr is not None else saved.get("lr"), name, offset)
    count = _members(args, saved, resuming)
    if (grouped or count is not None) and example.data is not None:
        raise UsageError(
            f"{problem} estimates from observed paths in one process: run it without torchrun and without --ensemble"
        )
    members = (
        None if count is None else [examples.REGISTRY[problem](**{**options, "seed": seed + e}) for e in range(count)]
    )
    parts = {"example": example, "members": members, "rule": rule, "training": training, "problem": problem}
    start = _start(parts, checkpoint)
    done = start[1].steps if start[1] is not None else 0
    label = (f"inverse-time, T0 {offset:g}" if name == "inverse-time" else name) or "problem default"
    metadata = {
        "problem": problem,
        "particles": example.particles,
        "dt": example.dt,
        "steps": example.steps,
        "seed": seed,
        "dtype": str(example.x0.dtype).removeprefix("torch."),
        "lr": lr0,
        "schedule": name,
        "lr_offset": offset,
        **training,
        **({"world_size": size} if grouped else {}),
        **({"ensemble": count} if count is not None else {}),
    }
    job = Job(
        args,
        problem,
        example,
        members,
        start,
        done,
        max(example.steps - done, 0),
        lr,
        lr0,
        label,
        seed,
        rule,
        training,
        metadata,
        size,
    )
    probe_paths(job)
    return job


def probe_paths(job: Job) -> None:
    """Every path the run writes to, probed before the first step (a missing or unwritable folder is refused)."""
    if job.args.checkpoint and distributed.is_main():
        probe(job.args.checkpoint)
    if job.plot_path is not None:
        probe(job.plot_path, what="plot")
        if os.path.splitext(job.plot_path)[1].lower() not in (".png", ""):
            raise UsageError(f"--plot {job.plot_path}: the plot is a PNG; name a .png file")


__all__ = ["Job", "learning_rate", "prepare", "probe_paths", "resume", "update_rule"]
