"""What the command line prints: the learned quantities against the reference, as a table or one JSON object,
and the plot. A plot that fails after training is reported with the results (exit status 5), never instead."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

from .. import optim, plotting
from ..compile.options import AFTER_ENV
from ..core.problem import ControlledSDE
from ..problems import ensemble
from . import figures
from .configure import Job
from .train import Trained


class Evaluation(NamedTuple):
    """The metrics of a trained theta, the plot written (or why not), and whether a Ctrl-C cut it short."""

    metrics: dict[str, Any]
    plot: str | None
    plot_error: str | None
    note: str | None
    seconds: float
    interrupted: bool


def relative_error(learned: float, reference: float) -> float | None:
    """|learned - reference| / |reference|; None for a reference of 0 (the learned value is the error then)."""
    return abs(learned - reference) / abs(reference) if reference else None


def _first(reference: dict, *names: str) -> float | None:
    return next((float(reference[name]) for name in names if name in reference), None)


def compare(example: Any, learned: dict[str, Any]) -> dict[str, Any]:
    """{metric: {learned, reference, relative_error}} for the metrics with a reference."""
    return {
        name: {
            "learned": float(learned[name]),
            "reference": float(reference),
            "relative_error": relative_error(float(learned[name]), float(reference)),
        }
        for name, reference in example.reference.items()
        if name in learned
    }


def _metrics(example: Any, state: Any, solver: str) -> dict[str, Any]:
    """Learned against reference, measured with the solver the run trained with."""
    metrics = compare(example, example.measure(state.theta, solver))
    if isinstance(state.average, optim.Average) and int(state.average.count) > 0:
        averaged = compare(example, example.measure(state.average.mean, solver))
        for name, entry in metrics.items():
            if name in averaged:
                entry["averaged"] = averaged[name]["learned"]
                entry["averaged_relative_error"] = averaged[name]["relative_error"]
    return metrics


def _plot(job: Job, example: Any, state: Any, history: Any, path: str) -> str:
    """The problem's figure (``figures``: what it learned against its reference, as its example page shows it);
    a problem without one gets the generic control and cost panels."""
    title = f"{job.problem}: {history.steps} steps, dt {example.dt}, {job.size * example.particles} particles"
    if job.problem in figures.FIGURES:
        return figures.save(job.problem, figures.Trained(example, job.seed, state, history), path, title)
    slope = _first(example.reference, "slope", "optimal_slope")
    control = example.sde.control if isinstance(example.sde, ControlledSDE) else None
    return plotting.plot_run(
        path,
        history,
        control=control,
        theta=state.theta,
        optimal_control=(lambda xs: slope * xs) if slope is not None else None,
        optimal_cost=_first(example.reference, "cost", "optimal_cost"),
        dim=example.x0.shape[0],
        title=title,
    )


@contextlib.contextmanager
def _eager_when(never_compile: bool) -> Iterator[None]:
    """With ``--no-compile``, the evaluation's own runs (a stationary cost with theta frozen) stay eager too: their
    default ``Compile(after=...)`` is set out of reach while they run."""
    if not never_compile:
        yield
        return
    before = os.environ.get(AFTER_ENV)
    os.environ[AFTER_ENV] = str(2**62)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(AFTER_ENV, None)
        else:
            os.environ[AFTER_ENV] = before


def evaluate(job: Job, example: Any, state: Any, history: Any, plot_path: str | None) -> Evaluation:
    """Learned against reference, and the plot; a Ctrl-C (a second one, after an interrupted training) skips
    what is left, and a plot that cannot be written is reported, the metrics kept."""
    start = time.perf_counter()
    metrics: dict[str, Any] = {}
    plot = error = None
    note = plotting.INSTALL_HINT if not job.args.no_plot and job.members is None and not plotting.available() else None
    try:
        with _eager_when(job.args.compile is False):
            metrics = _metrics(example, state, job.training["solver"])
        if plot_path is not None:
            try:
                plot = _plot(job, example, state, history, plot_path)
            except (OSError, ValueError, RuntimeError) as failed:
                error = f"the plot {plot_path!r} could not be written ({type(failed).__name__}: {failed})"
    except KeyboardInterrupt:
        note = "evaluation interrupted (Ctrl-C): the training results are complete, the comparison is not"
        return Evaluation(metrics, plot, error, note, time.perf_counter() - start, True)
    return Evaluation(metrics, plot, error, note, time.perf_counter() - start, False)


def rates(trained: Trained, taken: int) -> tuple[float, float | None]:
    """(steps per second, seconds before them): the rate of the steps from the run's first block boundary on, and
    the wall time less those steps at that rate (the compile, a kernel's load, the first eager call), never below
    0; (taken / wall, None) for a run that ended before a boundary."""
    if trained.steady is None or trained.steady[1] <= 0:
        return (taken / trained.wall if trained.wall > 0 else 0.0), None
    steps, seconds = trained.steady
    rate = steps / seconds
    return rate, max(trained.wall - taken / rate, 0.0)


def _common(job: Job, example: Any, state: Any, history: Any, trained: Trained, seed: int) -> dict[str, Any]:
    """The keys that a single run's result and each ensemble member's share."""
    taken = history.steps - job.done
    rate, startup = rates(trained, taken)
    return {
        "problem": job.problem,
        "steps": history.steps,
        "steps_this_run": taken,
        "t": round(history.steps * example.dt, 10),  # the nominal time: a float32 clock drifts by ulps per step
        "dt": example.dt,
        "particles": example.particles,
        "processes": job.size,
        "dtype": job.metadata["dtype"],
        "lr": job.lr0,
        "schedule": job.schedule,
        "seed": seed,
        **job.training,
        "averaged_iterates": int(state.average.count) if isinstance(state.average, optim.Average) else 0,
        "wall_s": trained.wall,
        "steps_per_s": rate,  # the steps alone: a compile before them is startup_s
        "startup_s": startup,
        "kernels_compiled": trained.compiled,
        "kernels_loaded": trained.loaded,
        **_route(history, taken),
    }


def _route(history: Any, taken: int) -> dict[str, Any]:
    """How this run's steps ran: ``route`` "compiled" or "eager" (its last steps), ``compiled_from`` the step at which
    they began to run compiled (None: eager throughout)."""
    switched = history.compiled_from if taken else None
    return {"route": history.route if taken else None, "compiled_from": None if switched is None else int(switched)}


def _nothing_left(job: Job) -> str | None:
    if job.remaining > 0:
        return None
    return (
        f"nothing to train: the run is at step {job.done}, at or past --total-steps {job.example.steps}; "
        f"give a larger --total-steps to continue it"
    )


def single_result(job: Job, trained: Trained) -> dict[str, Any]:
    """The result of a single run: its metrics against the reference, the plot and the checkpoint."""
    state, history = trained.state, trained.history
    evaluation = evaluate(job, job.example, state, history, job.plot_path)
    notes = [n for n in (_nothing_left(job), evaluation.note) if n]
    return {
        **_common(job, job.example, state, history, trained, job.seed),
        "evaluate_s": evaluation.seconds,
        "metrics": evaluation.metrics,
        "plot": evaluation.plot,
        "plot_error": evaluation.plot_error,
        "notes": notes,
        "checkpoint": None if trained.unsaved else job.args.checkpoint,
        "checkpoint_error": trained.unsaved,
        "interrupted": bool(history.interrupted) or evaluation.interrupted,
    }


def _spread(values: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation; 0 for one value)."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return mean, math.sqrt(var)


def ensemble_result(job: Job, trained: Trained) -> dict[str, Any]:
    """Each member's result (the keys of a single run's) and the mean and spread over those that did not diverge."""
    state, history = trained.state, trained.history
    assert job.members is not None
    results, cut_short = [], False
    for e, example in enumerate(job.members):
        member_state, member_history = ensemble.member(state, e), ensemble.member_history(history, e)
        evaluation = evaluate(job, example, member_state, member_history, None)
        cut_short = cut_short or evaluation.interrupted
        results.append(
            {
                **_common(job, example, member_state, history, trained, job.seed + e),
                "evaluate_s": evaluation.seconds,
                "metrics": evaluation.metrics,
                "plot": None,
                "plot_error": None,
                "notes": [evaluation.note] if evaluation.note else [],
                "checkpoint": None,
                "interrupted": bool(history.interrupted) or evaluation.interrupted,
                "diverged": bool(history.diverged[e]),
                "frozen_at": int(history.frozen_at[e]),
            }
        )
    kept = [r for r in results if not r["diverged"]]
    summary = {}
    for name in kept[0]["metrics"] if kept else {}:
        mean, std = _spread([r["metrics"][name]["learned"] for r in kept])
        summary[name] = {"mean": mean, "std": std, "reference": kept[0]["metrics"][name]["reference"]}
    taken = history.steps - job.done
    return {
        "problem": job.problem,
        "ensemble": len(results),
        "processes": job.size,
        "seeds": [job.seed, job.seed + len(results) - 1],
        "members": results,
        "summary": summary,
        "diverged": [r["seed"] for r in results if r["diverged"]],
        "steps": history.steps,
        "steps_this_run": taken,
        "wall_s": trained.wall,
        "member_steps_per_s": len(results) * rates(trained, taken)[0],
        "startup_s": rates(trained, taken)[1],
        **_route(history, taken),
        "kernels_compiled": trained.compiled,
        "kernels_loaded": trained.loaded,
        "checkpoint": None if trained.unsaved else job.args.checkpoint,
        "checkpoint_error": trained.unsaved,
        "plot_error": None,
        "interrupted": bool(history.interrupted) or cut_short,
        "notes": [n for n in (_nothing_left(job),) if n],
    }


def _percent(value: float | None) -> str:
    return f"{value:>11.2%}" if value is not None else f"{'n/a':>11}"


def table(result: dict[str, Any]) -> str:
    """A single run's result as the command line prints it."""
    particles = (
        f"{result['particles']} particles"
        if result["processes"] == 1
        else f"{result['processes']} x {result['particles']} particles"
    )
    rule = result["optimizer"] + (f", clip {result['clip']:g}" if result["clip"] is not None else "")
    averaged = any("averaged" in m for m in result["metrics"].values())
    lines = [
        f"fwdtrain {result['problem']}: {particles}, dt {result['dt']}, {result['dtype']}, {result['solver']}, "
        f"lr {result['lr']:g} ({result['schedule']}), {rule}, seed {result['seed']}",
        f"{'metric':<12}{'learned':>14}{'reference':>14}{'rel. error':>12}"
        + (f"{'averaged':>14}{'rel. error':>12}" if averaged else ""),
    ]
    for name, m in result["metrics"].items():
        lines.append(
            f"{name:<12}{m['learned']:>14.6g}{m['reference']:>14.6g} {_percent(m['relative_error'])}"
            + (f"{m['averaged']:>14.6g} {_percent(m['averaged_relative_error'])}" if "averaged" in m else "")
        )
    if result["average_from"] is not None:
        lines.append(
            f"learned: the last iterate; averaged: the mean of theta over the {result['averaged_iterates']} "
            f"iterates with t >= {result['average_from']:g} (--average-from)"
        )
    this_run = (
        f"this run {result['steps_this_run']} in {result['wall_s']:.1f} s{_startup(result)} "
        f"{result['steps_per_s']:.0f} steps/s ({_how(result)})"
        if result["steps_this_run"]
        else "none this run"
    )
    lines.append(
        f"steps {result['steps']} in total (t = {result['t']:.6g}), {this_run}; evaluation {result['evaluate_s']:.1f} s"
    )
    lines += _tail(result)
    return "\n".join(lines)


def _switched(result: dict[str, Any]) -> bool:
    """Whether the run began eagerly and went on compiled (its kernel ready from a background compile)."""
    first = result["steps"] - result["steps_this_run"]
    return result.get("compiled_from") is not None and result["compiled_from"] > first


def _how(result: dict[str, Any]) -> str:
    """How the steps of the rate ran: "compiled", "eager", or "eager, then compiled from step N" (a rate of both)."""
    return f"eager, then compiled from step {result['compiled_from']}" if _switched(result) else result["route"]


def _startup(result: dict[str, Any]) -> str:
    """': compiling 31.2 s, then' before the steps' rate: the time before the run's first block boundary, said as
    compiling (a compile the run waited for), tracing (the step traced and its package looked up by key, its
    compile in the background), loading the kernel or starting; ' =' where the run ended before its time could be
    split."""
    if result.get("startup_s") is None:
        return " ="
    first = result["steps"] - result["steps_this_run"]
    if result["kernels_compiled"]:
        what = "compiling" if result.get("compiled_from") == first else "tracing"
    elif result["kernels_loaded"]:
        what = "loading the kernel"
    else:
        what = "starting"
    return f": {what} {result['startup_s']:.1f} s, then"


def _tail(result: dict[str, Any]) -> list[str]:
    lines = []
    if result.get("diverged"):
        lines.append(f"diverged: frozen at its last finite state, step {result['frozen_at']}")
    if result["interrupted"]:
        lines.append(
            f"interrupted at step {result['steps']}"
            + (f"; checkpoint saved to {result['checkpoint']}" if result["checkpoint"] else "")
        )
    elif result["checkpoint"]:
        lines.append(f"checkpoint: {result['checkpoint']}")
    if result.get("plot"):
        lines.append(f"plot: {result['plot']}")
    lines.extend(result.get("notes", []))
    if result.get("plot_error"):
        lines.append(f"plot NOT written: {result['plot_error']}")
    if result.get("checkpoint_error"):
        lines.append(f"checkpoint NOT saved: {result['checkpoint_error']}")
    return lines


def ensemble_table(result: dict[str, Any]) -> str:
    """Each member's table (as a single run prints it), then the mean and spread over members."""
    blocks = [table(member) for member in result["members"]]
    first, last = result["seeds"]
    kept = result["ensemble"] - len(result["diverged"])
    processes = result.get("processes", 1)
    where = "one vmapped run" if processes == 1 else f"one vmapped run on each of {processes} processes"
    lines = [
        f"ensemble of {result['ensemble']} members (seeds {first}..{last}) in {where}: mean and "
        f"standard deviation over the {kept} members that did not diverge",
        f"{'metric':<12}{'mean':>14}{'std':>14}{'reference':>14}",
    ]
    for name, m in result["summary"].items():
        lines.append(f"{name:<12}{m['mean']:>14.6g}{m['std']:>14.6g}{m['reference']:>14.6g}")
    if result["diverged"]:
        lines.append(f"diverged (frozen, left out): seeds {', '.join(map(str, result['diverged']))}")
    lines.append(
        f"steps {result['steps']} in total, this run {result['steps_this_run']} in {result['wall_s']:.1f} s"
        f"{_startup(result)} {result['member_steps_per_s']:.0f} member-steps/s ({_how(result)})"
    )
    lines += [line for line in _tail({**result, "interrupted": False}) if not line.startswith("diverged")]
    return "\n\n".join(blocks + ["\n".join(lines)])


def report(job: Job, trained: Trained) -> dict[str, Any]:
    """The result of the job: a single run's or an ensemble's."""
    return single_result(job, trained) if job.members is None else ensemble_result(job, trained)


def render(result: dict[str, Any]) -> str:
    return ensemble_table(result) if "ensemble" in result else table(result)


__all__ = [
    "Evaluation",
    "compare",
    "ensemble_result",
    "ensemble_table",
    "evaluate",
    "rates",
    "relative_error",
    "render",
    "report",
    "single_result",
    "table",
]
