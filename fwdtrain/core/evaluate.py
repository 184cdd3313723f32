"""Evaluation with theta frozen: the time average of the cost along simulated paths (pure, differentiable).

    (1 / (K - B)) sum_{B <= n < K} c(X_n^i, theta),   X_{n+1} = the solver's step with theta frozen

``average_cost`` takes the increments it is given, so it is a pure function of (theta, x0, dw, dt)
that ``torch.func`` transforms see through: ``grad`` of it is the pathwise (backpropagation-
through-time) gradient of the finite-horizon cost. ``fwdtrain.stationary_cost`` is the convenience
for reports (its own noise, floats out, compiled when long).
"""

from __future__ import annotations

from typing import Any

import torch

from . import _checks
from .problem import SDE
from .sensitivity import Theta
from .solvers import Solver, as_solver
from .step import move


def frozen_step(
    sde: SDE, theta: Theta, x: torch.Tensor, dw: torch.Tensor, dt: Any, solver: Solver
) -> tuple[torch.Tensor, torch.Tensor]:
    """(X_{n+1}, c(X_n) per particle) with theta frozen: ``solver``'s one scheme without a sensitivity."""
    moved = move(sde, theta, solver, x, None, dw, dt)
    return moved.x, moved.value["cost"]


def average_cost(
    sde: SDE,
    theta: Theta,
    x0: torch.Tensor,
    dw: torch.Tensor,
    dt: Any,
    burn_in: int = 0,
    solver: Solver | str | None = None,
) -> torch.Tensor:
    """Per-particle time averages (1 / (K - burn_in)) sum_{burn_in <= n < K} c(X_n^i, theta), shape (N,).

    X_0^i = x0 (d,), X_{n+1} from X_n by ``solver`` (default ``Euler()``) with dw (K, N, m) the increments,
    h = dt, theta frozen, no sensitivity. Pure: ``torch.func.grad(lambda th: average_cost(sde, th, x0, dw,
    dt).mean())`` is the pathwise gradient of the finite-horizon cost.
    """
    dtype, device = _checks.check_theta(theta, allow_low_precision=True)
    _checks.check_dt(dt)
    x0 = _checks.check_tensor(x0, "x0", dtype, device)
    dw = _checks.check_tensor(dw, "dw", dtype, device)
    if x0.ndim != 1 or dw.ndim != 3:
        raise ValueError(
            f"average_cost needs x0 of shape (d,) and dw of shape (steps, particles, m), "
            f"got {tuple(x0.shape)} and {tuple(dw.shape)}"
        )
    steps = dw.shape[0]
    if isinstance(burn_in, bool) or not isinstance(burn_in, int) or not 0 <= burn_in < steps:
        raise ValueError(f"need an integer 0 <= burn_in < steps = {steps}, got burn_in={burn_in!r}")
    scheme = as_solver(solver)
    x = x0.expand(dw.shape[1], -1)
    total = torch.zeros(dw.shape[1], dtype=dtype, device=device)
    for n in range(steps):
        x, cost = frozen_step(sde, theta, x, dw[n], dt, scheme)
        if n >= burn_in:
            total = total + cost
    return total / (steps - burn_in)


__all__ = ["average_cost", "frozen_step"]
