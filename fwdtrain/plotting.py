"""Plots of a run (needs matplotlib: ``pip install 'fwdtrain[plot]'``).

Two panels: the learned control u(x) against the optimal one, and the running
average cost (1/n) sum_k mean_i c(X^i_k) against the optimal cost over time.
Uses matplotlib's object API (no pyplot, no global state, no display needed).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from .core._tree import leaves

INSTALL_HINT = "plots need matplotlib: pip install 'fwdtrain[plot]'"


def available() -> bool:
    """True when matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(panels: int):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(INSTALL_HINT) from error
    figure = Figure(figsize=(5.0 * panels, 4.0), layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.subplots(1, panels, squeeze=False)[0]


def control_curve(
    control: Callable[[Any, torch.Tensor], torch.Tensor],
    theta: Any,
    lo: float = -2.0,
    hi: float = 2.0,
    points: int = 201,
    dim: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(xs, u_0(xs e_1)): the first control component along the first state axis."""
    dtype = leaves(theta)[0].dtype
    xs = torch.linspace(lo, hi, points, dtype=dtype)
    with torch.no_grad():
        us = torch.stack(
            [control(theta, torch.nn.functional.pad(x.reshape(1), (0, dim - 1))).reshape(-1)[0] for x in xs]
        )
    return xs, us


def plot_control(
    ax,
    control,
    theta,
    optimal: Callable[[torch.Tensor], torch.Tensor] | None = None,
    *,
    dim: int = 1,
    lo: float = -2.0,
    hi: float = 2.0,
) -> None:
    """Learned u(x) (and the optimal control, when known) on [lo, hi]."""
    xs, us = control_curve(control, theta, lo, hi, dim=dim)
    ax.plot(xs.numpy(), us.numpy(), label="learned u(x)")
    if optimal is not None:
        ax.plot(xs.numpy(), optimal(xs).numpy(), "--", label="optimal")
    ax.set_xlabel("x" if dim == 1 else "x_1 (other coordinates 0)")
    ax.set_ylabel("u" if dim == 1 else "u_1")
    ax.set_title("control")
    ax.legend()


def plot_cost(ax, history, optimal_cost: float | None = None) -> None:
    """Running average cost and the cost averaged over each record interval, against time."""
    h = history.numpy()
    ax.plot(h["t"], h["cost"], lw=0.5, alpha=0.4, label="cost, mean over each record interval")
    ax.plot(h["t"], h["average_cost"], lw=1.5, label="running average cost")
    if optimal_cost is not None:
        ax.axhline(optimal_cost, ls="--", color="k", label=f"optimal cost {optimal_cost:.5g}")
        top = max(float(h["average_cost"].max()) if len(h["t"]) else optimal_cost, optimal_cost) * 1.5
        ax.set_ylim(0.0 if optimal_cost >= 0 else None, top)
    ax.set_xlabel("t")
    ax.set_ylabel("cost")
    ax.set_title("cost")
    ax.legend()


def plot_run(
    path: str | os.PathLike,
    history,
    *,
    control=None,
    theta=None,
    optimal_control=None,
    optimal_cost: float | None = None,
    dim: int = 1,
    title: str | None = None,
) -> str:
    """Write a PNG of the run to ``path`` (the control panel only when ``control`` is given)."""
    panels = 2 if control is not None else 1
    figure, axes = _figure(panels)
    if control is not None:
        plot_control(axes[0], control, theta, optimal_control, dim=dim)
    plot_cost(axes[-1], history, optimal_cost)
    if title:
        figure.suptitle(title)
    path = os.fspath(path)
    figure.savefig(path, dpi=110)
    return path


__all__ = ["INSTALL_HINT", "available", "control_curve", "plot_control", "plot_cost", "plot_run"]
