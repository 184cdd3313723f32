"""The seed's problem: 1-D ergodic LQR with a ReLU-network control.

    dX = (-X + u) dt + dW,   cost X^2 + u^2,   u = f(theta, X), f: 1 -> 16 -> 1 ReLU MLP

The best control is linear, u = -(sqrt(2) - 1) x, with stationary cost
sqrt(2) - 1; a stable linear control u = -k x costs (1 + k^2) / (2 (1 + k)).
"""

from __future__ import annotations

import math

import torch

from ..core import schedules
from ..core.model import mlp
from ..core.problem import ControlledSDE
from ..driver.evaluate import stationary_cost
from ._example import Example, summary

OPTIMAL_GAIN = math.sqrt(2.0) - 1.0


def linear_control_cost(k: float) -> float:
    """Stationary cost (1 + k^2) / (2 (1 + k)) of u = -k x, for k > -1."""
    if k <= -1:
        raise ValueError(f"u = -k x is unstable for k <= -1, got k = {k}")
    return (1 + k * k) / (2 * (1 + k))


@summary("the seed problem's 1-D LQR: dX = (-X + u) dt + dW, cost X^2 + u^2, u a small MLP")
def lqr_1d(
    *,
    hidden: int = 16,
    particles: int = 256,
    dt: float = 0.01,
    steps: int = 6_000,
    lr: float = 10.0,
    lr_offset: float = 20.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Example:
    """The seed's 1-D LQR with a 1 -> hidden -> 1 ReLU control (no output bias) and training defaults.

    The learning rate is alpha_t = lr / (lr_offset + t). ``evaluate(theta)`` returns the
    least-squares slope of the control on [-1, 1] and its stationary cost (Monte Carlo,
    theta frozen, same dt: Euler-Maruyama biases the cost by about +0.7% at dt = 0.01).
    """
    control = mlp([1, hidden, 1], activation="relu", output_bias=False, seed=seed, dtype=dtype, output_scale=0.1)
    sde = ControlledSDE(
        control=control.apply,
        drift=lambda x, u: -x + u,
        diffusion=lambda x, u: torch.ones_like(x),
        cost=lambda x, u: (x.square() + u.square()).sum(),
        noise_type="additive",
    )
    return Example(
        name="lqr-1d",
        sde=sde,
        theta=control.theta,
        x0=torch.ones(1, dtype=dtype),
        particles=particles,
        dt=dt,
        steps=steps,
        lr=schedules.inverse_time(lr, lr_offset),
        reference={"slope": -OPTIMAL_GAIN, "cost": OPTIMAL_GAIN},
        evaluate=lambda theta, solver=None: {
            "slope": linear_slope(control.apply, theta),
            "cost": stationary_cost(
                sde,
                theta,
                torch.zeros(1, dtype=dtype),
                particles=1000,
                dt=dt,
                steps=6000,
                burn_in=1000,
                seed=seed + 1,
                solver=solver,
            ).mean,
        },
    )


def linear_slope(control, theta, lo: float = -1.0, hi: float = 1.0, points: int = 201) -> float:
    """Least-squares slope of x -> control(theta, x) on [lo, hi] (1-D state and control)."""
    dtype = next(iter(theta.values())).dtype
    xs = torch.linspace(lo, hi, points, dtype=dtype)
    with torch.no_grad():
        us = torch.stack([control(theta, x.reshape(1)).reshape(()) for x in xs])
    xc = xs - xs.mean()
    return float((xc * (us - us.mean())).sum() / xc.square().sum())
