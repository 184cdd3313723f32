"""Evaluation with theta frozen: Monte Carlo estimates of the stationary cost."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch.func import vmap

from . import _checks
from .problem import SDE, Coefficients, Theta
from .state import evaluate_once
from .euler import noise_term


class CostEstimate(NamedTuple):
    """Time-and-particle average of c after burn-in, with its standard error over particles."""

    mean: float
    stderr: float


def stationary_cost(
    sde: SDE,
    theta: Theta,
    x0: torch.Tensor,
    *,
    particles: int = 1000,
    dt: float = 0.01,
    steps: int = 20_000,
    burn_in: int = 2_000,
    seed: int = 1,
) -> CostEstimate:
    """J(theta) ~ (1 / (N (steps - burn_in))) sum_i sum_{n >= burn_in} c(X_n^i, theta), theta frozen.

    Simulates X alone (no sensitivity), Euler-Maruyama with step dt.
    """
    dtype, device = _checks.check_theta(theta)
    _checks.check_dt(dt)
    particles = _checks.check_count(particles, "particles")
    if not 0 <= burn_in < steps:
        raise ValueError(f"need 0 <= burn_in < steps, got burn_in={burn_in}, steps={steps}")
    x0 = _checks.check_tensor(x0, "x0", dtype, device)
    m = evaluate_once(sde, theta, x0).sigma.shape[-1]  # sigma (d, m), or (d,) for diagonal noise (m = d)
    coefficients = vmap(lambda x: Coefficients(*sde.coefficients(theta, x)))
    generator = torch.Generator(device=device).manual_seed(seed)
    x = x0.expand(particles, -1).clone()
    per_particle = torch.zeros(particles, dtype=torch.float64, device=device)
    with torch.no_grad():
        for n in range(steps):
            mu, sig, cost = coefficients(x)
            if n >= burn_in:
                per_particle += cost.double()
            dw = torch.randn((particles, m), generator=generator, dtype=dtype, device=device) * math.sqrt(dt)
            x = x + mu * dt + noise_term(sig, dw)
    per_particle /= steps - burn_in
    return CostEstimate(per_particle.mean().item(), (per_particle.std() / math.sqrt(particles)).item())
