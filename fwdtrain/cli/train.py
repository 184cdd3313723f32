"""Command line: ``python -m fwdtrain [problem] [options]`` trains a built-in problem and prints
the learned quantities against the known optimum (``lqr-1d`` when no problem is named).

Exit status:
  0    success
  1    another rank of a process group failed or was lost (every rank that leaves says why on stderr)
  2    bad options, or a --checkpoint path that cannot be written (checked before the first step), or a
       --resume checkpoint that is unreadable, damaged, of another problem or shape, saved without a
       history, or resumed with a different --seed
  3    divergence (the last finite state is saved to --checkpoint when given); with --ensemble only when
       every member diverged (a member that diverges is frozen, flagged in the results, and the others go on)
  4    training finished but the checkpoint could not be saved: the results are printed, the error
       names the path
  130  interrupted with Ctrl-C (after printing the results so far and saving the checkpoint; a second
       Ctrl-C during the evaluation skips it and still prints the training results)

``--ensemble E`` trains the seeds seed, ..., seed + E - 1 (each its own network and noise, as ``--seed``
would) in one vmapped run (``fwdtrain.ensemble``) and prints each member's result, then the mean and
sample standard deviation over the members that did not diverge.

Every problem trains through ``fwdtrain.run`` (``--compile``, ``--fuse``, ``--checkpoint`` and
``--resume`` apply to all of them); SGDCT estimates from observed paths in a single process.

Under ``torchrun --nproc-per-node R -m fwdtrain ...`` every rank runs this same command: each
simulates ``--particles`` particles with its own noise (``distributed.rank_seed``), the gradient
is averaged over the group every step, and rank 0 alone prints, plots, evaluates and writes
one checkpoint holding every rank's particles.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
import time
from typing import Any, Sequence

import torch

from .. import distributed, examples, optim, plotting
from ..compile.options import Compile
from ..core import schedules
from ..core.errors import CheckpointError, CheckpointWriteError, DivergenceError
from ..core.state import with_optimizer
from ..driver.checkpoint import check_compatible, load, save
from ..driver.hooks import Checkpointing, Progress
from ..driver.options import Checks, SaveAt
from ..driver.runner import run
from ..problems import ensemble

SCHEDULES = ("constant", "inverse-time", "staged")
# Where the command line's defaults should differ from an example builder's, per problem (none now:
# the builders' defaults are the ones that train). Explicit options always win.
CLI_DEFAULTS: dict[str, dict[str, Any]] = {}
DTYPES = {"float32": torch.float32, "float64": torch.float64}
EXIT_WAIT = 600.0  # seconds the other ranks of a group wait at exit for rank 0 to finish
EXIT_CHECKPOINT = 4  # trained, but the checkpoint could not be written


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not the usage block
        self.exit(2, f"fwdtrain: error: {message} (see --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _finite_float(positive: bool):
    """An argparse type: a finite float, > 0 when ``positive``, else >= 0."""
    what = "a positive finite number" if positive else "a finite number >= 0"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


_positive_float = _finite_float(positive=True)
_rate = _finite_float(positive=False)


def _options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    add = common.add_argument
    add("--steps", type=_positive_int, help="total training steps (a resumed run continues up to this count)")
    add("--dt", type=_positive_float, help="time step h")
    add("--particles", type=_positive_int, help="number of particles N (per process under torchrun: "
        "R processes simulate R N particles)")
    add("--lr", type=_rate, help="learning rate alpha(0); without --schedule the problem's schedule is scaled to it")
    add("--schedule", choices=SCHEDULES, help="learning-rate schedule: constant alpha; inverse-time "
        "alpha T0/(T0 + t); staged alpha, alpha/2 after t=50, /5 after 100, /10 after 500 (default: the problem's)")
    add("--lr-offset", type=_positive_float, metavar="T0", help="T0 of the inverse-time schedule (default 50)")
    add("--seed", type=int, help="seed of the initial network and the noise (default 0)")
    add("--dtype", choices=tuple(DTYPES), help="floating type (default: the problem's, float32 for lqr-1d)")
    add("--optimizer", choices=tuple(optim.OPTIMIZERS), help="update rule (default sgd: theta <- theta - alpha h G); "
        "momentum 0.9, adam (0.9, 0.999), rmsprop 0.99 with their default options; the rate stays alpha(t) h")
    add("--clip", type=_positive_float, metavar="NORM", help="clip the gradient's global norm at NORM before the rule")
    add("--average-from", type=_rate, metavar="T", help="Polyak-Ruppert average of theta over t >= T: recorded, and "
        "evaluated next to the last iterate")
    add("--record-every", type=_positive_int, default=100, help="steps between history records (default 100)")
    add("--compile", action=argparse.BooleanOptionalAction, default=None,
        help="run each step through torch.compile (compiles for seconds first); --no-compile: eager. "
             "Default: compile when the run is long enough to repay it")
    add("--fuse", type=_positive_int, default=1, metavar="K", help="fuse K steps into one compiled call "
        "(implies --compile; K dividing --record-every, e.g. 4 to 16)")
    add("--checkpoint", metavar="PATH", help="save a checkpoint here at the end, on Ctrl-C and every "
        "--checkpoint-every steps (the folder must exist and be writable; checked before the first step)")
    add("--checkpoint-every", type=_positive_int, default=10_000, metavar="STEPS", help="default 10000")
    add("--resume", metavar="PATH", help="continue the run saved in this checkpoint (its seed, dt, particles "
        "and dtype; a different --seed is refused)")
    add("--plot", metavar="PATH", help="write the PNG here (default fwdtrain-<problem>.png)")
    add("--no-plot", action="store_true", help="do not write a plot")
    add("--no-progress", action="store_true", help="no progress bar (it is off anyway when stderr is not a terminal)")
    add("--json", action="store_true", help="print one JSON object instead of the table")
    add("--ensemble", type=_positive_int, metavar="E", help="train seeds seed .. seed+E-1 as one vmapped run "
        "and print each member's result and the mean and standard deviation over members (no plot)")
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fwdtrain", description="Online forward-propagation training of SDEs: train a built-in "
                     f"problem and compare with its known optimum. Without a problem name, trains {examples.DEFAULT}.",
                     epilog="options: fwdtrain PROBLEM --help (--steps, --dt, --particles, --lr, --schedule, --seed, "
                     "--dtype, --checkpoint, --resume, --plot, --no-progress, --json, ...)")
    sub = parser.add_subparsers(dest="problem", metavar="PROBLEM", parser_class=_Parser)
    common = _options()
    for name, builder in examples.REGISTRY.items():
        summary = getattr(builder, "summary", None) or name
        sub.add_parser(name, parents=[common], help=summary, description=summary)
    return parser


def _with_default_problem(argv: list[str]) -> list[str]:
    if argv and (argv[0] in examples.REGISTRY or argv[0] in ("-h", "--help")):
        return argv
    return [examples.DEFAULT, *argv]


def _learning_rate(example, lr: float | None, name: str | None, offset: float):
    """(schedule, alpha(0)): the named schedule starting at ``lr`` (default: the problem's alpha(0)),
    or, without a name, the problem's own schedule scaled so that alpha(0) = lr."""
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
        raise ValueError(f"--lr: the problem's learning rate starts at 0 and cannot be scaled; "
                         f"choose a --schedule as well")
    factor = base / own0
    return (lambda t: own(t) * factor), base


def update_rule(name: str, clip: float | None) -> optim.GradientTransformation | None:
    """The rule of --optimizer and --clip: None for plain sgd (``euler.descend``, bitwise today's update),
    else ``optim.optimizer(name)``, after ``clip_by_global_norm(clip)`` when clipping."""
    if name == "sgd" and clip is None:
        return None
    rule = optim.optimizer(name)
    return rule if clip is None else optim.chain(optim.clip_by_global_norm(clip), rule)


def _relative_error(learned: float, reference: float) -> float:
    return abs(learned - reference) / abs(reference) if reference else abs(learned - reference)


def _first(reference: dict, *names: str) -> float | None:
    for name in names:
        if name in reference:
            return float(reference[name])
    return None


def _resume(args: argparse.Namespace, explicit_problem: bool, grouped: bool):
    """(checkpoint, saved metadata) of --resume, or (None, {})."""
    if not args.resume:
        return None, {}
    checkpoint = distributed.load_group(args.resume) if grouped else load(args.resume)
    saved = dict(checkpoint.metadata)
    saved.pop("ranks", None)
    if not grouped and saved.get("world_size", 1) != 1:
        raise ValueError(f"--resume {args.resume} holds a run of {saved['world_size']} processes; resume it "
                         f"with torchrun --nproc-per-node {saved['world_size']} -m fwdtrain ...")
    if explicit_problem and saved.get("problem", args.problem) != args.problem:
        raise CheckpointError(f"--resume {args.resume} holds a {saved['problem']!r} run, not {args.problem!r}")
    if checkpoint.history is None:
        raise CheckpointError(f"--resume {args.resume} holds a state saved without its history, so the step count "
                              f"and the noise position are unknown (the noise would restart at step 0 while t = "
                              f"{float(checkpoint.state.t):.6g}); continue it from Python with "
                              f"fwdtrain.run(..., noise=...) or start a new run")
    return checkpoint, saved


def _compare(example: Any, learned: dict) -> dict:
    """{metric: {learned, reference, relative_error}} for the metrics with a reference."""
    return {name: {"learned": float(learned[name]), "reference": float(reference),
                   "relative_error": _relative_error(float(learned[name]), float(reference))}
            for name, reference in example.reference.items() if name in learned}


def _evaluate(args: argparse.Namespace, example: Any, problem: str, state: Any, history: Any,
              size: int) -> tuple[dict, str | None, str | None, float, bool]:
    """(metrics, plot path, note, seconds, interrupted): learned against reference, and the plot; Ctrl-C
    (a second one, after an interrupted training) skips what is left."""
    start = time.perf_counter()
    metrics: dict[str, Any] = {}
    plot, note = None, None
    try:
        metrics = _compare(example, example.evaluate(state.theta))
        if isinstance(state.average, optim.Average) and int(state.average.count) > 0:
            averaged = _compare(example, example.evaluate(state.average.mean))
            for name, entry in metrics.items():
                if name in averaged:
                    entry["averaged"] = averaged[name]["learned"]
                    entry["averaged_relative_error"] = averaged[name]["relative_error"]
        if not args.no_plot:
            if plotting.available():
                optimal_slope = _first(example.reference, "slope", "optimal_slope")
                control = getattr(example.sde, "control", None)
                plot = plotting.plot_run(
                    args.plot or f"fwdtrain-{problem}.png", history, control=control, theta=state.theta,
                    optimal_control=(lambda xs: optimal_slope * xs) if optimal_slope is not None else None,
                    optimal_cost=_first(example.reference, "cost", "optimal_cost"), dim=example.x0.shape[0],
                    title=f"{problem}: {history.steps} steps, dt {example.dt}, {size * example.particles} particles")
            else:
                note = plotting.INSTALL_HINT
    except KeyboardInterrupt:
        note = "evaluation interrupted (Ctrl-C): the training results are complete, the comparison is not"
        return metrics, plot, note, time.perf_counter() - start, True
    return metrics, plot, note, time.perf_counter() - start, False


def _train(args: argparse.Namespace, explicit_problem: bool) -> dict[str, Any]:
    """Train and evaluate; the result on rank 0, {"quiet": True, "interrupted": ...} on the other ranks."""
    if args.compile is False and args.fuse > 1:
        raise ValueError(f"--fuse {args.fuse} runs compiled chunks of steps but --no-compile asks for the eager step; "
                         f"drop one of them")
    grouped = distributed.is_initialized()
    size = distributed.world_size() if grouped else 1
    checkpoint, saved = _resume(args, explicit_problem, grouped)
    problem = saved.get("problem", args.problem)
    if problem not in examples.REGISTRY:
        raise ValueError(f"unknown problem {problem!r}; choose one of {sorted(examples.REGISTRY)}")
    defaults = {**CLI_DEFAULTS.get(problem, {}), **saved}
    options = {key: defaults[key] for key in ("particles", "dt", "seed", "steps") if key in defaults}
    if "dtype" in saved:
        options["dtype"] = DTYPES[saved["dtype"]]
    given = {"particles": args.particles, "dt": args.dt, "seed": args.seed, "steps": args.steps,
             "dtype": DTYPES[args.dtype] if args.dtype else None}
    for key in ("particles", "dt", "dtype", "seed"):
        if checkpoint is not None and given[key] is not None and key in options and given[key] != options[key]:
            why = (f"; the resumed noise continues seed {saved[key]}'s stream: drop --seed (or start a new run)"
                   if key == "seed" else "")
            raise ValueError(f"--{key} {args.__dict__[key]} differs from the resumed run's {saved[key]}{why}")
    training = {"optimizer": saved.get("optimizer", "sgd"), "clip": saved.get("clip"),
                "average_from": saved.get("average_from")}
    for key, flag in (("optimizer", "--optimizer"), ("clip", "--clip"), ("average_from", "--average-from")):
        value = getattr(args, key)
        if checkpoint is not None and value is not None and value != training[key]:
            raise ValueError(f"{flag} {value} differs from the resumed run's {training[key]}: its optimiser state "
                             f"and average continue as saved (drop {flag}, or start a new run)")
        if value is not None:
            training[key] = value
    rule = update_rule(training["optimizer"], training["clip"])
    options.update({key: value for key, value in given.items() if value is not None})
    example = examples.REGISTRY[problem](**options)
    seed = options.get("seed", 0)
    schedule_name = args.schedule or defaults.get("schedule")
    lr_offset = args.lr_offset or defaults.get("lr_offset") or 50.0
    lr, lr0 = _learning_rate(example, args.lr if args.lr is not None else defaults.get("lr"), schedule_name,
                             lr_offset)
    if grouped and example.data is not None:
        raise ValueError(f"{problem} estimates from observed paths in one process; run it without torchrun")
    members = _ensemble_size(args, saved, checkpoint is not None)
    if members is not None:
        if grouped or example.data is not None:
            raise ValueError("--ensemble runs in one process, for problems with Brownian noise"
                             + (f" ({problem} estimates from observed paths)" if example.data is not None else ""))
        member_examples = [examples.REGISTRY[problem](**{**options, "seed": seed + e}) for e in range(members)]
        first_state = ensemble.stack([with_optimizer(ex.initial_state(), rule, average_from=training["average_from"])
                                      for ex in member_examples])
    else:
        first_state = with_optimizer(example.initial_state(), rule, average_from=training["average_from"])
    if checkpoint is not None:
        state, history = checkpoint.state, checkpoint.history
        if members is None:
            check_compatible(state, example.theta, x0=example.x0, name=f"this problem ({problem})")
        else:
            check_compatible(state, first_state.theta, name=f"this ensemble of {members} {problem} runs")
    else:
        state, history = first_state, None
    done = history.steps if history is not None else 0
    remaining = max(example.steps - done, 0)
    metadata = {"problem": problem, "particles": example.particles, "dt": example.dt, "steps": example.steps,
                "seed": seed, "dtype": str(example.x0.dtype).removeprefix("torch."),
                "lr": lr0, "schedule": schedule_name, "lr_offset": lr_offset, **training}
    if grouped:
        metadata["world_size"] = size
    if members is not None:
        metadata["ensemble"] = members
    hooks: list = [Checkpointing(args.checkpoint, args.checkpoint_every, metadata)] if args.checkpoint else []
    if not (args.no_progress or args.json):
        hooks.append(Progress(enabled=None))
    common = dict(save=SaveAt(args.record_every), optimizer=rule, hooks=tuple(hooks),
                  compile=Compile("auto" if args.compile is None else (args.compile or args.fuse > 1)))
    begin = (state, history)
    unsaved = None
    start = time.perf_counter()
    try:
        if grouped:  # the same run on every rank; the group's gradient, per-rank noise
            state, history = distributed.distributed_run(example.trainable, begin, remaining, example.dt, lr, seed,
                                                         checks=Checks(min(100, args.record_every)), **common)
        elif members is not None:  # E seeds, one vmapped run
            state, history = run(ensemble.Ensemble(example.trainable, members), begin, remaining, example.dt, lr,
                                 seed, **common)
        else:
            state, history = run(example.trainable, begin, remaining, example.dt, lr,
                                 example.noise(seed, example.steps), **common)
    except DivergenceError as error:
        if args.checkpoint:  # keep the last finite state: resume it with a smaller --lr
            save(args.checkpoint, error.state, error.history, metadata=metadata)
            error.args = (f"{error.args[0]}; it is saved in {args.checkpoint}",)
        raise
    except distributed.GroupError as error:
        if error.reason == "non-finite" and args.checkpoint and error.history is not None:
            distributed.save_group(args.checkpoint, error.state, error.history, metadata=metadata)
            error.args = (f"{error.args[0]}; the last state every rank agreed on (step {error.history.steps}) "
                          f"is saved in {args.checkpoint}",)
        raise
    except CheckpointWriteError as error:  # trained, not saved: report the results all the same
        state, history, unsaved = error.state, error.history, str(error)
    wall = time.perf_counter() - start
    if not distributed.is_main():
        return {"quiet": True, "interrupted": bool(history.interrupted)}
    taken = history.steps - done
    if members is not None:
        return _ensemble_result(args, member_examples, problem, state, history, done, wall, lr0, schedule_name,
                                lr_offset, seed, metadata["dtype"], None if unsaved else args.checkpoint, unsaved,
                                training)
    metrics, plot, plot_note, evaluation, cut_short = _evaluate(args, example, problem, state, history, size)
    return {**_run_result(problem, example, state, history, taken, wall, size, metadata["dtype"], lr0,
                          _schedule_label(schedule_name, lr_offset), seed, training),
            "evaluate_s": evaluation, "metrics": metrics, "plot": plot, "plot_note": plot_note,
            "checkpoint": None if unsaved else args.checkpoint, "checkpoint_error": unsaved,
            "interrupted": bool(history.interrupted) or cut_short}


def _schedule_label(schedule_name: str | None, lr_offset: float) -> str:
    return (f"inverse-time, T0 {lr_offset:g}" if schedule_name == "inverse-time" else schedule_name) or "problem default"


def _run_result(problem: str, example: Any, state: Any, history: Any, taken: int, wall: float, processes: int,
                dtype: str, lr0: float, schedule: str, seed: int, training: dict) -> dict[str, Any]:
    """The keys that a single run's result and each ensemble member's share."""
    return {"problem": problem, "steps": history.steps, "steps_this_run": taken, "t": float(state.t),
            "dt": example.dt, "particles": example.particles, "processes": processes, "dtype": dtype, "lr": lr0,
            "schedule": schedule, "seed": seed, **training,
            "averaged_iterates": int(state.average.count) if isinstance(state.average, optim.Average) else 0,
            "wall_s": wall, "steps_per_s": taken / wall if wall > 0 else 0.0}


def _ensemble_size(args: argparse.Namespace, saved: dict, resuming: bool) -> int | None:
    """E of --ensemble (or of the resumed ensemble); None for a single run. A mismatch is refused."""
    stored = saved.get("ensemble")
    if resuming and args.ensemble is not None and stored != args.ensemble:
        held = f"an ensemble of {stored}" if stored else "a single run"
        raise ValueError(f"--ensemble {args.ensemble}: --resume {args.resume} holds {held}")
    return args.ensemble if args.ensemble is not None else stored


def _spread(values: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation; 0 for one value)."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return mean, math.sqrt(var)


def _ensemble_result(args, member_examples, problem, state, history, done, wall, lr0, schedule_name, lr_offset,
                     seed, dtype, checkpoint, unsaved, training) -> dict[str, Any]:
    """Each member's result (the keys of a single run's) and the mean and spread over the members that did not
    diverge."""
    quiet = argparse.Namespace(**{**vars(args), "no_plot": True})
    taken = history.steps - done
    results, cut_short = [], False
    for e, example in enumerate(member_examples):
        member_state, member_history = ensemble.member(state, e), ensemble.member_history(history, e)
        metrics, _, note, evaluation, stopped = _evaluate(quiet, example, problem, member_state, member_history, 1)
        cut_short = cut_short or stopped
        results.append({
            **_run_result(problem, example, member_state, history, taken, wall, 1, dtype, lr0,
                          _schedule_label(schedule_name, lr_offset), seed + e, training),
            "evaluate_s": evaluation, "metrics": metrics, "plot": None, "plot_note": note, "checkpoint": None,
            "interrupted": bool(history.interrupted) or stopped, "diverged": bool(history.diverged[e]),
            "frozen_at": int(history.frozen_at[e])})
    kept = [r for r in results if not r["diverged"]]
    summary = {}
    for name in (kept[0]["metrics"] if kept else {}):
        mean, std = _spread([r["metrics"][name]["learned"] for r in kept])
        summary[name] = {"mean": mean, "std": std, "reference": kept[0]["metrics"][name]["reference"]}
    return {"problem": problem, "ensemble": len(results), "seeds": [seed, seed + len(results) - 1],
            "members": results, "summary": summary, "diverged": [r["seed"] for r in results if r["diverged"]],
            "steps": history.steps, "steps_this_run": taken, "wall_s": wall,
            "member_steps_per_s": len(results) * taken / wall if wall > 0 else 0.0, "checkpoint": checkpoint,
            "checkpoint_error": unsaved, "interrupted": bool(history.interrupted) or cut_short}


def _ensemble_table(result: dict[str, Any]) -> str:
    """Each member's table (as a single run prints it), then the mean and spread over members."""
    blocks = [_table(member) for member in result["members"]]
    first, last = result["seeds"]
    kept = result["ensemble"] - len(result["diverged"])
    lines = [f"ensemble of {result['ensemble']} members (seeds {first}..{last}) in one vmapped run: mean and "
             f"standard deviation over the {kept} members that did not diverge",
             f"{'metric':<12}{'mean':>14}{'std':>14}{'reference':>14}"]
    for name, m in result["summary"].items():
        lines.append(f"{name:<12}{m['mean']:>14.6g}{m['std']:>14.6g}{m['reference']:>14.6g}")
    if result["diverged"]:
        lines.append(f"diverged (frozen, left out): seeds {', '.join(map(str, result['diverged']))}")
    lines.append(f"steps {result['steps']}, this run {result['steps_this_run']} in {result['wall_s']:.1f} s = "
                 f"{result['member_steps_per_s']:.0f} member-steps/s")
    if result["checkpoint"]:
        lines.append(f"checkpoint: {result['checkpoint']}")
    if result.get("checkpoint_error"):
        lines.append(f"checkpoint NOT saved: {result['checkpoint_error']}")
    return "\n\n".join(blocks + ["\n".join(lines)])


def _table(result: dict[str, Any]) -> str:
    particles = (f"{result['particles']} particles" if result["processes"] == 1 else
                 f"{result['processes']} x {result['particles']} particles")
    rule = result["optimizer"] + (f", clip {result['clip']:g}" if result["clip"] is not None else "")
    averaged = any("averaged" in m for m in result["metrics"].values())
    lines = [f"fwdtrain {result['problem']}: {particles}, dt {result['dt']}, "
             f"{result['dtype']}, lr {result['lr']:g} ({result['schedule']}), {rule}, seed {result['seed']}",
             f"{'metric':<12}{'learned':>14}{'reference':>14}{'rel. error':>12}"
             + (f"{'averaged':>14}{'rel. error':>12}" if averaged else "")]
    for name, m in result["metrics"].items():
        lines.append(f"{name:<12}{m['learned']:>14.6g}{m['reference']:>14.6g}{m['relative_error']:>11.2%}"
                     + (f"{m['averaged']:>14.6g}{m['averaged_relative_error']:>11.2%}" if "averaged" in m else ""))
    if result["average_from"] is not None:
        lines.append(f"learned: the last iterate; averaged: the mean of theta over the {result['averaged_iterates']} "
                     f"iterates with t >= {result['average_from']:g} (--average-from)")
    lines.append(f"steps {result['steps']} (t = {result['t']:.6g}), this run {result['steps_this_run']} in "
                 f"{result['wall_s']:.1f} s = {result['steps_per_s']:.0f} steps/s; evaluation {result['evaluate_s']:.1f} s")
    if result.get("diverged"):
        lines.append(f"diverged: frozen at its last finite state, step {result['frozen_at']}")
    if result["interrupted"]:
        lines.append(f"interrupted at step {result['steps']}" + (f"; checkpoint saved to {result['checkpoint']}"
                                                               if result["checkpoint"] else ""))
    elif result["checkpoint"]:
        lines.append(f"checkpoint: {result['checkpoint']}")
    if result["plot"]:
        lines.append(f"plot: {result['plot']}")
    if result["plot_note"]:
        lines.append(result["plot_note"])
    if result.get("checkpoint_error"):
        lines.append(f"checkpoint NOT saved: {result['checkpoint_error']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m fwdtrain`` and the ``fwdtrain`` script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    explicit = bool(argv) and argv[0] in examples.REGISTRY
    quiet = not distributed.is_main()  # a rank > 0 under torchrun: rank 0 says it all
    try:
        with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext(), \
                contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
            args = build_parser().parse_args(_with_default_problem(argv))
    except SystemExit as stop:  # --help, or a bad option (one line already printed)
        return stop.code if isinstance(stop.code, int) else 2
    status = 1
    try:
        distributed.init_process_group()  # a no-op outside torchrun
        status = _main(args, explicit)
        return status
    except ValueError as error:  # a torchrun environment given only in part
        print(f"fwdtrain: error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # in a group (e.g. a peer gone while joining it): every rank says why
        if distributed.world_size() <= 1:
            raise
        print(f"fwdtrain: rank {distributed.rank()}: error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    finally:  # after a run, every rank waits for rank 0's evaluation and plots, then all leave together
        distributed.destroy_process_group(wait=EXIT_WAIT if status in (0, 130) else None)


def _main(args: argparse.Namespace, explicit: bool) -> int:
    def fail(message: str, status: int, every_rank: bool = False) -> int:
        if every_rank or distributed.is_main():  # the same error on every rank is printed once
            where = (f"rank {distributed.rank()}: " if every_rank and distributed.is_initialized()
                     and not message.startswith(f"rank {distributed.rank()}:") else "")
            print(f"fwdtrain: {where}error: {message}", file=sys.stderr)
        return status

    try:
        result = _train(args, explicit)
    except DivergenceError as error:
        return fail(str(error), 3)
    except distributed.GroupError as error:  # a rank whose peers are gone (rank 0 among them) says why itself
        return fail(str(error), 3 if error.reason == "non-finite" else 1, every_rank=error.reason == "lost")
    except (ValueError, TypeError, CheckpointError) as error:
        return fail(str(error), 2)
    if not result.get("quiet"):
        table = _ensemble_table if "ensemble" in result else _table
        print(json.dumps(result) if args.json else table(result))
        if result.get("checkpoint_error"):
            print(f"fwdtrain: error: {result['checkpoint_error']}", file=sys.stderr)
    if result["interrupted"]:
        return 130
    return EXIT_CHECKPOINT if result.get("checkpoint_error") else 0


__all__ = ["main", "build_parser"]
