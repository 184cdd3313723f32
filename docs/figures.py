"""The figures and printed results of the example pages, from fixed seeds.

Each built-in problem is trained exactly as ``python -m fwdtrain PROBLEM`` trains it (the command line's
own parsing, training and report), its printed table is written to ``docs/examples/output/PROBLEM.txt``
and its figure to ``docs/figures/PROBLEM.png``::

    python docs/figures.py                  # every problem at its default length (minutes on two cores)
    python docs/figures.py lqr-1d noisy-control
    python docs/figures.py --quick --out /tmp/figures   # tiny runs, no evaluation (what the tests run)

``--quick`` trains each problem for a few steps with a few particles, skips the evaluation against the
reference and writes into ``--out`` (never over the committed figures). Needs matplotlib and scipy.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

import fwdtrain as ft
from fwdtrain.cli.configure import prepare
from fwdtrain.cli.parser import parse
from fwdtrain.cli.report import render, report
from fwdtrain.cli.train import train

DOCS = Path(__file__).resolve().parent
QUICK = ["--total-steps", "40", "--particles", "4", "--record-every", "10"]
# Options beyond the defaults, shown on the problem's page with its command.
EXTRA: dict[str, list[str]] = {}  # extra command-line options per problem
REFERENCE = dict(color="black", linestyle="--", linewidth=1.0)


def trained(problem: str, quick: bool) -> tuple[Any, Any, str]:
    """(job, trained, printed table) of ``python -m fwdtrain PROBLEM`` (shortened with ``quick``)."""
    argv = [problem, *EXTRA.get(problem, []), "--no-plot", "--no-progress", *(QUICK if quick else [])]
    args, named = parse(argv)
    job = prepare(args, named)
    result = train(job)
    if quick:
        return job, result, f"(quick run of {' '.join(argv)}: not evaluated)"
    with contextlib.redirect_stdout(io.StringIO()):
        text = render(report(job, result))
    return job, result, text


def times(history: Any) -> np.ndarray:
    return history.t.double().numpy()


def panel_cost(ax: Any, history: Any, optimum: float | None, label: str = "cost") -> None:
    """The cost of each record interval and the running average since the start, against the optimum."""
    t = times(history)
    ax.plot(t, history.cost.double().numpy(), color="tab:blue", alpha=0.35, linewidth=0.8, label=f"{label} per record")
    ax.plot(t, history.average_cost.double().numpy(), color="tab:blue", label=f"running average {label}")
    if optimum is not None:
        ax.axhline(optimum, label=f"optimum {optimum:.4g}", **REFERENCE)
        top = max(optimum * 3, float(np.nanmedian(history.average_cost.double().numpy())) * 1.5)
        ax.set_ylim(0, top)
    ax.set_xlabel("t")
    ax.set_title(f"running {label}")
    ax.legend(fontsize=8)


def panel_traces(ax: Any, history: Any, names: dict[str, Callable[[Any], np.ndarray]], truth: dict[str, float]) -> None:
    """Parameter traces over the records, each against its reference value."""
    t = times(history)
    for i, (name, value) in enumerate(names.items()):
        color = f"C{i}"
        ax.plot(t, value(history.theta), color=color, label=name)
        if name in truth:
            ax.axhline(truth[name], color=color, linestyle="--", linewidth=1.0)
    ax.set_xlabel("t")
    ax.set_title("parameters (dashed: reference)")
    ax.legend(fontsize=8)


def leaf(name: str, index: tuple[int, ...] = ()) -> Callable[[Any], np.ndarray]:
    return lambda theta: theta[name][(slice(None), *index)].double().numpy()


def lqr_1d(job: Any, result: Any, axes: list[Any]) -> None:
    example, theta = job.example, result.state.theta
    control = example.sde.control
    k = math.sqrt(2) - 1
    xs = torch.linspace(-3, 3, 121, dtype=example.x0.dtype)
    with torch.no_grad():
        us = torch.stack([control(theta, x.reshape(1)).reshape(()) for x in xs])
    axes[0].plot(xs.numpy(), us.double().numpy(), label="learned u(x)")
    axes[0].plot(xs.numpy(), -k * xs.numpy(), label=f"optimum -{k:.4f} x", **REFERENCE)
    axes[0].set_xlabel("x")
    axes[0].set_title("control")
    axes[0].legend(fontsize=8)
    panel_cost(axes[1], result.history, k)
    records = ft.ensemble.unstack(result.history.theta)
    slopes = [ft.examples.linear_slope(control, record) for record in records]
    axes[2].plot(times(result.history), slopes, label="slope of u on [-1, 1]")
    axes[2].axhline(-k, **REFERENCE, label="optimum")
    axes[2].set_xlabel("t")
    axes[2].set_title("slope of the learned control")
    axes[2].legend(fontsize=8)


def lqr_nd(job: Any, result: Any, axes: list[Any]) -> None:
    solution = ft.examples.riccati(ft.examples.random_lqr(2, job.seed))
    history = result.history
    gain = history.theta["gain"].double().numpy()  # (R, k, d)
    t = times(history)
    for i in range(gain.shape[1]):
        for j in range(gain.shape[2]):
            color = f"C{i * gain.shape[2] + j}"
            axes[0].plot(t, gain[:, i, j], color=color, label=f"K[{i},{j}]")
            axes[0].axhline(solution.gain[i, j], color=color, linestyle="--", linewidth=1.0)
    axes[0].set_xlabel("t")
    axes[0].set_title("gain K of u = -K x (dashed: Riccati)")
    axes[0].legend(fontsize=8)
    panel_cost(axes[1], history, solution.cost)


def noisy_control(job: Any, result: Any, axes: list[Any]) -> None:
    beta = 1.0
    optimum = ft.examples.noisy_optimal_gain(beta)
    history = result.history
    ks = np.linspace(0.05, 1.5, 200)
    axes[0].plot(ks, [ft.examples.noisy_cost(k, beta) for k in ks], label="J(k), closed form")
    learned = float(result.state.theta["gain"])
    axes[0].axvline(optimum, label=f"k* = {optimum:.4f}", **REFERENCE)
    axes[0].plot(
        [learned], [ft.examples.noisy_cost(learned, beta)], "o", color="tab:red", label=f"learned {learned:.4f}"
    )
    axes[0].set_xlabel("gain k")
    axes[0].set_title("stationary cost of u = -k x")
    axes[0].legend(fontsize=8)
    panel_traces(axes[1], history, {"gain": leaf("gain")}, {"gain": optimum})
    panel_cost(axes[2], history, ft.examples.noisy_cost(optimum, beta))


def density(ax: Any, xs: np.ndarray, curves: dict[str, np.ndarray], title: str) -> None:
    for i, (label, values) in enumerate(curves.items()):
        style = REFERENCE if i == 0 else {}
        ax.plot(xs, values / np.trapezoid(values, xs), label=label, **style)
    ax.set_xlabel("x")
    ax.set_title(title)
    ax.legend(fontsize=8)


def ou_calibration(job: Any, result: Any, axes: list[Any]) -> None:
    reference = job.example.reference
    panel_traces(axes[0], result.history, {"mean": leaf("mean"), "scale": leaf("scale")}, reference)
    theta = result.state.theta
    mean, scale = float(theta["mean"]), abs(float(theta["scale"]))
    xs = np.linspace(-2, 4, 400)
    target = np.exp(-((xs - reference["mean"]) ** 2) / (2 * reference["variance"]))
    variance = max(scale * scale / 2, 1e-6)  # kappa = 1
    learned = np.exp(-((xs - mean) ** 2) / (2 * variance))
    density(axes[1], xs, {"target law": target, "learned stationary law": learned}, "stationary density")


def double_well_calibration(job: Any, result: Any, axes: list[Any]) -> None:
    reference = job.example.reference
    panel_traces(axes[0], result.history, {"a": leaf("a"), "b": leaf("b")}, reference)
    theta = result.state.theta
    xs = np.linspace(-3, 3, 400)

    def law(a: float, b: float) -> np.ndarray:
        return np.exp(a * xs**2 - b * xs**4 / 2)  # s = 1

    a, b = float(theta["a"]), max(float(theta["b"]), 1e-3)
    curves = {"target law": law(reference["a"], reference["b"]), "learned stationary law": law(a, b)}
    density(axes[1], xs, curves, "stationary density")


def sgdct_ou(job: Any, result: Any, axes: list[Any]) -> None:
    reference = job.example.reference
    panel_traces(axes[0], result.history, {"kappa": leaf("kappa"), "mean": leaf("mean")}, reference)
    history = result.history
    axes[1].plot(times(history), history.cost.double().numpy(), color="tab:blue", alpha=0.6, linewidth=0.8)
    axes[1].set_xlabel("t")
    axes[1].set_title("loss r' a^-1 r / (2h) per record")


def jump_lqr(job: Any, result: Any, axes: list[Any]) -> None:
    example, history = job.example, result.history
    kind = "additive" if example.name == "jump-lqr" else "proportional"
    optimum = ft.examples.jump_optimal_gain(kind, 2.0, 0.5)
    cost = lambda k: ft.examples.jump_linear_cost(k, kind, 0.5, 2.0, 0.5)
    ks = np.linspace(0.05, 1.5, 200)
    axes[0].plot(ks, [cost(k) for k in ks], label="J(k), closed form")
    learned = float(result.state.theta["gain"])
    axes[0].axvline(optimum, label=f"k* = {optimum:.4f}", **REFERENCE)
    axes[0].plot([learned], [cost(learned)], "o", color="tab:red", label=f"learned {learned:.4f}")
    axes[0].set_xlabel("gain k")
    axes[0].set_title(f"stationary cost of u = -k x ({kind} jumps)")
    axes[0].legend(fontsize=8)
    panel_traces(axes[1], history, {"gain": leaf("gain")}, {"gain": optimum})
    panel_cost(axes[2], history, cost(optimum))


def hawkes(job: Any, result: Any, axes: list[Any]) -> None:
    truth = ft.examples.hawkes.TRUTH
    positive = {name: (lambda th, n=name: np.exp(th[f"log_{n}"].double().numpy())) for name in truth}
    panel_traces(axes[0], result.history, positive, truth)
    history = result.history
    axes[1].plot(times(history), history.cost.double().numpy(), color="tab:blue", alpha=0.6, linewidth=0.8)
    axes[1].set_xlabel("t")
    axes[1].set_title("negative log-likelihood per unit time")


FIGURES: dict[str, tuple[Callable[[Any, Any, list[Any]], None], int]] = {
    "lqr-1d": (lqr_1d, 3),
    "lqr-nd": (lqr_nd, 2),
    "noisy-control": (noisy_control, 3),
    "ou-calibration": (ou_calibration, 2),
    "double-well-calibration": (double_well_calibration, 2),
    "sgdct-ou": (sgdct_ou, 2),
    "jump-lqr": (jump_lqr, 3),
    "jump-lqr-proportional": (jump_lqr, 3),
    "hawkes": (hawkes, 2),
}


def make(problem: str, quick: bool, figures: Path, outputs: Path) -> float:
    """Train ``problem``, write its printed table and its figure; the seconds it took."""
    start = time.perf_counter()
    job, result, text = trained(problem, quick)
    draw, panels = FIGURES[problem]
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.4), constrained_layout=True)
    draw(job, result, list(axes))
    example = job.example
    fig.suptitle(
        f"{problem}: {result.history.steps} steps of dt {example.dt}, {example.particles} particles, seed {job.seed}",
        fontsize=10,
    )
    figures.mkdir(parents=True, exist_ok=True)
    outputs.mkdir(parents=True, exist_ok=True)
    fig.savefig(figures / f"{problem}.png", dpi=110)
    plt.close(fig)
    (outputs / f"{problem}.txt").write_text(text + "\n")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("problems", nargs="*", metavar="PROBLEM", help=f"default: all of {', '.join(FIGURES)}")
    parser.add_argument("--quick", action="store_true", help="tiny runs, no evaluation (for the tests)")
    parser.add_argument("--out", type=Path, help="folder for the figures and tables (required with --quick)")
    args = parser.parse_args(argv)
    if args.quick and args.out is None:
        parser.error("--quick writes into --out DIR, never over the committed figures")
    unknown = [p for p in args.problems if p not in FIGURES]
    if unknown:
        parser.error(f"unknown problem(s) {unknown}; choose from {list(FIGURES)}")
    figures = args.out if args.out else DOCS / "figures"
    outputs = args.out if args.out else DOCS / "examples" / "output"
    for problem in args.problems or FIGURES:
        seconds = make(problem, args.quick, figures, outputs)
        print(f"{problem}: {seconds:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
