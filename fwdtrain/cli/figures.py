"""The figure of each built-in problem: what it learned against its reference, as its example page shows it.

``python -m fwdtrain PROBLEM`` writes this figure, and ``docs/figures.py`` draws the example pages' figures with
the same functions, so the two cannot differ. Each problem's panels:

- lqr-1d: the learned control u(x) against u* = -k* x, the running cost against J*, the slope over time;
- lqr-nd: the gain K over time against the Riccati gain, the running cost against the Riccati cost;
- noisy-control, jump-lqr, jump-lqr-proportional: the closed-form J(k) with k* and the learned gain, the gain
  over time against k*, the running cost against J(k*);
- ou-calibration, double-well-calibration: the parameters over time against the target's, the learned
  stationary density against the target law;
- sgdct-ou: the drift parameters over time against the truth, the loss.

The event-stream examples (``hawkes``, ``hawkes-2d``, ``order-book``) draw their own (``cli.events``).

Needs matplotlib (object API only: no pyplot, no global state, no display).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import numpy as np
import torch

from .. import examples
from ..plotting import INSTALL_HINT
from ..problems import ensemble

REFERENCE = dict(color="black", linestyle="--", linewidth=1.0)


class Trained(NamedTuple):
    """What a figure draws: the problem's ``Example``, the seed, the final state and the history of records."""

    example: Any
    seed: int
    state: Any
    history: Any


def _integral(values: np.ndarray, xs: np.ndarray) -> float:
    trapezoid = getattr(np, "trapezoid", None) or getattr(np, "trapz")  # noqa: B009  (numpy < 2 has only trapz)
    return float(trapezoid(values, xs))


def times(history: Any) -> np.ndarray:
    return history.t.double().numpy()


def panel_cost(ax: Any, history: Any, optimum: float | None, label: str = "cost") -> None:
    """The cost of each record interval and the running average since the start, against the optimum."""
    t = times(history)
    ax.plot(t, history.cost.double().numpy(), color="tab:blue", alpha=0.35, linewidth=0.8, label=f"{label} per record")
    ax.plot(t, history.average_cost.double().numpy(), color="tab:blue", label=f"running average {label}")
    if optimum is not None:
        ax.axhline(optimum, label=f"optimum {optimum:.4g}", **REFERENCE)
        average = history.average_cost.double().numpy()
        middle = float(np.nanmedian(average)) if len(average) and np.isfinite(average).any() else optimum
        ax.set_ylim(0, max(optimum * 3, middle * 1.5))
    ax.set_xlabel("t")
    ax.set_title(f"running {label}")
    ax.legend(fontsize=8)


def panel_traces(ax: Any, history: Any, names: dict[str, Callable[[Any], np.ndarray]], truth: dict[str, float]) -> None:
    """Parameter traces over the records, each against its reference value (dashed, same colour)."""
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
    key = (slice(None), *index)
    return lambda theta: theta[name][key].double().numpy()


def lqr_1d(run: Trained, axes: list[Any]) -> None:
    example, theta = run.example, run.state.theta
    control = example.sde.control
    k = -float(example.reference["slope"])
    xs = torch.linspace(-3, 3, 121, dtype=example.x0.dtype)
    with torch.no_grad():
        us = torch.stack([control(theta, x.reshape(1)).reshape(()) for x in xs])
    axes[0].plot(xs.numpy(), us.double().numpy(), label="learned u(x)")
    axes[0].plot(xs.numpy(), -k * xs.numpy(), label=f"optimum -{k:.4f} x", **REFERENCE)
    axes[0].set_xlabel("x")
    axes[0].set_title("control")
    axes[0].legend(fontsize=8)
    panel_cost(axes[1], run.history, float(example.reference["cost"]))
    slopes = [examples.linear_slope(control, record) for record in ensemble.unstack(run.history.theta)]
    axes[2].plot(times(run.history), slopes, label="slope of u on [-1, 1]")
    axes[2].axhline(-k, **REFERENCE, label="optimum")
    axes[2].set_xlabel("t")
    axes[2].set_title("slope of the learned control")
    axes[2].legend(fontsize=8)


def lqr_nd(run: Trained, axes: list[Any]) -> None:
    solution = examples.riccati(examples.random_lqr(run.example.x0.shape[0], run.seed))
    history = run.history
    t = times(history)
    if "gain" in history.theta:
        gain = history.theta["gain"].double().numpy()  # (R, k, d)
        for i in range(gain.shape[1]):
            for j in range(gain.shape[2]):
                color = f"C{(i * gain.shape[2] + j) % 10}"
                axes[0].plot(t, gain[:, i, j], color=color, label=f"K[{i},{j}]")
                axes[0].axhline(solution.gain[i, j], color=color, linestyle="--", linewidth=1.0)
        axes[0].set_title("gain K of u = -K x (dashed: Riccati)")
        axes[0].legend(fontsize=8, ncol=max(1, gain.shape[2] // 2))
    else:  # a network control: its first component along the first axis against the Riccati control's
        xs = torch.linspace(-2, 2, 81, dtype=run.example.x0.dtype)
        d = run.example.x0.shape[0]
        points = torch.nn.functional.pad(xs.reshape(-1, 1), (0, d - 1))
        with torch.no_grad():
            us = torch.stack([run.example.sde.control(run.state.theta, x).reshape(-1)[0] for x in points])
        axes[0].plot(xs.numpy(), us.double().numpy(), label="learned u_1(x_1 e_1)")
        axes[0].plot(xs.numpy(), -solution.gain[0, 0] * xs.numpy(), label="Riccati -K[0,0] x_1", **REFERENCE)
        axes[0].set_title("control along x_1")
        axes[0].legend(fontsize=8)
    axes[0].set_xlabel("t" if "gain" in history.theta else "x_1 (other coordinates 0)")
    panel_cost(axes[1], history, solution.cost)


def _gain_against_closed_form(run: Trained, axes: list[Any], cost: Callable[[float], float], title: str) -> None:
    optimum = float(run.example.reference["gain"])
    ks = np.linspace(0.05, max(1.5, 2 * optimum), 200)
    axes[0].plot(ks, [cost(k) for k in ks], label="J(k), closed form")
    learned = float(run.state.theta["gain"])
    axes[0].axvline(optimum, label=f"k* = {optimum:.4f}", **REFERENCE)
    axes[0].plot([learned], [cost(learned)], "o", color="tab:red", label=f"learned {learned:.4f}")
    axes[0].set_xlabel("gain k")
    axes[0].set_title(title)
    axes[0].legend(fontsize=8)
    panel_traces(axes[1], run.history, {"gain": leaf("gain")}, {"gain": optimum})
    panel_cost(axes[2], run.history, float(run.example.reference["cost"]))


def noisy_control(run: Trained, axes: list[Any]) -> None:
    beta = 1.0  # the built-in problem's
    _gain_against_closed_form(run, axes, lambda k: examples.noisy_cost(k, beta), "stationary cost of u = -k x")


def jump_lqr(run: Trained, axes: list[Any]) -> None:
    kind: Literal["additive", "proportional"] = "additive" if run.example.name == "jump-lqr" else "proportional"
    cost = lambda k: examples.jump_linear_cost(k, kind, 0.5, 2.0, 0.5)  # the built-in problems' sigma, rate, scale
    _gain_against_closed_form(run, axes, cost, f"stationary cost of u = -k x ({kind} jumps)")


def density(ax: Any, xs: np.ndarray, curves: dict[str, np.ndarray], title: str) -> None:
    for i, (label, values) in enumerate(curves.items()):
        style = REFERENCE if i == 0 else {}
        ax.plot(xs, values / _integral(values, xs), label=label, **style)
    ax.set_xlabel("x")
    ax.set_title(title)
    ax.legend(fontsize=8)


def ou_calibration(run: Trained, axes: list[Any]) -> None:
    reference = run.example.reference
    panel_traces(axes[0], run.history, {"mean": leaf("mean"), "scale": leaf("scale")}, reference)
    theta = run.state.theta
    mean, scale = float(theta["mean"]), abs(float(theta["scale"]))
    xs = np.linspace(-2, 4, 400)
    target = np.exp(-((xs - reference["mean"]) ** 2) / (2 * reference["variance"]))
    variance = max(scale * scale / 2, 1e-6)  # kappa = 1
    learned = np.exp(-((xs - mean) ** 2) / (2 * variance))
    density(axes[1], xs, {"target law": target, "learned stationary law": learned}, "stationary density")


def double_well_calibration(run: Trained, axes: list[Any]) -> None:
    reference = run.example.reference
    panel_traces(axes[0], run.history, {"a": leaf("a"), "b": leaf("b")}, reference)
    theta = run.state.theta
    xs = np.linspace(-3, 3, 400)

    def law(a: float, b: float) -> np.ndarray:
        return np.exp(a * xs**2 - b * xs**4 / 2)  # s = 1

    a, b = float(theta["a"]), max(float(theta["b"]), 1e-3)
    curves = {"target law": law(reference["a"], reference["b"]), "learned stationary law": law(a, b)}
    density(axes[1], xs, curves, "stationary density")


def sgdct_ou(run: Trained, axes: list[Any]) -> None:
    reference = run.example.reference
    panel_traces(axes[0], run.history, {"kappa": leaf("kappa"), "mean": leaf("mean")}, reference)
    axes[1].plot(times(run.history), run.history.cost.double().numpy(), color="tab:blue", alpha=0.6, linewidth=0.8)
    axes[1].set_xlabel("t")
    axes[1].set_title("loss r' a^-1 r / (2h) per record")


FIGURES: dict[str, tuple[Callable[[Trained, list[Any]], None], int]] = {
    "lqr-1d": (lqr_1d, 3),
    "lqr-nd": (lqr_nd, 2),
    "noisy-control": (noisy_control, 3),
    "ou-calibration": (ou_calibration, 2),
    "double-well-calibration": (double_well_calibration, 2),
    "sgdct-ou": (sgdct_ou, 2),
    "jump-lqr": (jump_lqr, 3),
    "jump-lqr-proportional": (jump_lqr, 3),
}


def figure(problem: str, run: Trained, title: str | None = None) -> Any:
    """The matplotlib ``Figure`` of a built-in ``problem``'s run (its panels as listed above)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(INSTALL_HINT) from error
    draw, panels = FIGURES[problem]
    result = Figure(figsize=(4.2 * panels, 3.4), layout="constrained")
    FigureCanvasAgg(result)
    draw(run, list(result.subplots(1, panels, squeeze=False)[0]))
    if title:
        result.suptitle(title, fontsize=10)
    return result


def save(problem: str, run: Trained, path: str, title: str | None = None) -> str:
    """Write the figure of ``problem``'s run to ``path`` (PNG, 110 dpi); the path."""
    figure(problem, run, title).savefig(path, dpi=110)
    return path


__all__ = ["FIGURES", "Trained", "figure", "save"]
