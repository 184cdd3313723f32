"""Newton's method for a maximum with some entries bounded below by 0 (projected Newton), saying whether it converged.

Maximise f(x) subject to x_i >= 0 for the ``bounded`` entries. Each iteration takes the gradient g and Hessian H,
holds the active entries A = {i bounded: x_i = 0 and g_i <= 0} (at their bound, the gradient pushing outward) at 0,
solves the Levenberg-damped Newton system on the free rest F,

    (-H_FF + damping diag(1 + |H_ii|)) d_F = g_F,

and moves to the projection of x + d onto the bounds. The damping grows x10 until f does not decrease (a heavily
damped step is a scaled projected-gradient step, which ascends) and shrinks /10 after each accepted step. An entry
whose MLE is 0 reaches exactly 0 in one projected step and stays there while its gradient points outward, instead
of crawling towards it in log space.

Converged: a Newton step (damping at most 1e-6) moves x by less than ``tolerance`` (max |x_new - x|). Not
converged: the iteration limit, or no ascent step found before the damping passes 1e12.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

_NEWTON = 1e-6  # damping at most this: a step that counts as Newton's for the convergence test


class Newton(NamedTuple):
    """Where Newton stopped: x, whether it converged, why it stopped, and the iterations (derivative passes)."""

    x: torch.Tensor
    converged: bool
    reason: str
    iterations: int


def active(x: torch.Tensor, gradient: torch.Tensor, bounded: torch.Tensor) -> torch.Tensor:
    """The entries held at their bound: bounded, at 0, and the gradient of the maximised f pointing below 0."""
    return bounded & (x <= 0) & (gradient <= 0)


def project(x: torch.Tensor, bounded: torch.Tensor) -> torch.Tensor:
    """x with its bounded entries clamped at 0."""
    return torch.where(bounded, x.clamp(min=0), x)


def _step(gradient: torch.Tensor, curvature: torch.Tensor, held: torch.Tensor, damping: float) -> torch.Tensor:
    free = (~held).to(gradient.dtype)
    system = -curvature * free[:, None] * free[None, :] + torch.diag(1 - free)  # held rows: d_i = 0
    system = system + damping * torch.diag(free * (1 + curvature.diagonal().abs()))
    return torch.linalg.solve(system, gradient * free)


def projected_newton(
    objective: Callable[[torch.Tensor], torch.Tensor],
    derivatives: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    x: torch.Tensor,
    bounded: torch.Tensor,
    iterations: int = 100,
    tolerance: float = 1e-10,
) -> Newton:
    """Maximise ``objective`` (x -> 0-d) from ``x`` with ``derivatives`` (x -> (gradient, Hessian)) and x_i >= 0
    where ``bounded`` (see the module's docstring)."""
    x = project(x, bounded)
    value = objective(x)
    damping = 1e-8
    slack = 4.5 * torch.finfo(x.dtype).eps  # rounding of the objective: 1e-15 in float64
    for count in range(1, iterations + 1):
        gradient, curvature = derivatives(x)
        held = active(x, gradient, bounded)
        first = True
        while True:
            trial = project(x + _step(gradient, curvature, held, damping), bounded)
            moved = float((trial - x).abs().max()) if x.numel() else 0.0
            if first and moved < tolerance and damping <= _NEWTON:  # a Newton step: already at the optimum
                return Newton(x, True, "converged", count)
            first = False
            candidate = objective(trial)
            if bool(torch.isfinite(candidate)) and float(candidate) >= float(value) - slack:
                break
            damping *= 10
            if damping > 1e12:
                return Newton(x, False, "no ascent step found (damping past 1e12)", count)
        if moved < tolerance and damping <= _NEWTON:
            return Newton(trial, True, "converged", count)
        x, value, damping = trial, candidate, max(damping / 10, 1e-12)
    return Newton(x, False, f"iteration limit ({iterations}) reached", iterations)


__all__ = ["Newton", "active", "project", "projected_newton"]
