"""A control problem whose noise depends on the state and on the parameters.

    dX = (-X + u) dt + (1 + beta u) dW,   cost X^2 + u^2,   u = -k X,   theta = {"gain": k}

The diffusion 1 - beta k X depends on x and on theta, so the sensitivity needs the
diffusion term (sigma_x Xtilde + sigma_theta) dW: without it the gradient is the
beta = 0 one and training stops at sqrt(2) - 1 instead of the optimum below.

Closed form (linear SDE with multiplicative noise, dX = a X dt + (1 + c X) dW with
a = -(1 + k), c = -beta k): the stationary second moment solves
0 = d E[X^2]/dt = (2a + c^2) E[X^2] + 1, so

    J(k) = (1 + k^2) / (2 (1 + k) - beta^2 k^2)          (when the denominator is > 0)

and J'(k) = 0 gives k^2 + (2 + beta^2) k - 1 = 0, i.e.

    k* = (sqrt((2 + beta^2)^2 + 4) - (2 + beta^2)) / 2,   J* = J(k*).
"""

from __future__ import annotations

import math

import torch

from ..core import schedules
from ..core.problem import ControlledSDE
from ._example import Example, summary


def noisy_cost(k: float, beta: float) -> float:
    """J(k) = (1 + k^2) / (2 (1 + k) - beta^2 k^2), the stationary cost of u = -k x."""
    denominator = 2 * (1 + k) - beta * beta * k * k
    if denominator <= 0:
        raise ValueError(f"u = -k x with k = {k}, beta = {beta} has no stationary second moment")
    return (1 + k * k) / denominator


def noisy_cost_derivative(k: float, beta: float) -> float:
    """J'(k) = 2 (k^2 + (2 + beta^2) k - 1) / (2 (1 + k) - beta^2 k^2)^2."""
    denominator = 2 * (1 + k) - beta * beta * k * k
    return 2 * (k * k + (2 + beta * beta) * k - 1) / denominator**2


def noisy_optimal_gain(beta: float) -> float:
    """k* = (sqrt((2 + beta^2)^2 + 4) - (2 + beta^2)) / 2."""
    b = 2 + beta * beta
    return (math.sqrt(b * b + 4) - b) / 2


def noisy_sde(beta: float) -> ControlledSDE:
    """dX = (-X + u) dt + (1 + beta u) dW, cost X^2 + u^2, u = -gain X."""
    return ControlledSDE(
        control=lambda theta, x: -theta["gain"] * x,
        drift=lambda x, u: -x + u,
        diffusion=lambda x, u: 1 + beta * u,
        cost=lambda x, u: (x.square() + u.square()).sum(),
    )


@summary("1-D control with control-dependent noise (multiplicative), against its optimal gain")
def noisy_control(
    *,
    beta: float = 1.0,
    gain: float = 1.0,
    particles: int = 64,
    dt: float = 0.01,
    steps: int = 30_000,
    lr: float = 0.5,
    decay: float = 4.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Example:
    """The problem above with theta = {"gain": k} started at ``gain``; lr(t) = lr / (1 + t / decay).

    The defaults give the Robbins-Monro alpha = C / (C0 + t) with C = lr decay = 2 ~ 1 / J''(k*)
    (J''(k*) = 1.14 at beta = 1): a C much larger than 1 / J'' inflates the asymptotic variance of k
    in proportion to C; one below 1 / (2 J'') slows the rate below 1 / sqrt(t).

    ``reference`` = {"gain": k*, "cost": J*}; ``evaluate`` returns the learned gain and its exact
    J(k) from the closed form. (``seed`` only labels the run: the problem has no random parts.)
    """
    beta = float(beta)
    optimum = noisy_optimal_gain(beta)
    return Example(
        name=f"noisy-control (beta={beta:g})",
        sde=noisy_sde(beta),
        theta={"gain": torch.tensor(float(gain), dtype=dtype)},
        x0=torch.zeros(1, dtype=dtype),
        particles=particles,
        dt=dt,
        steps=steps,
        lr=schedules.inverse_time(lr * decay, decay),
        reference={"gain": optimum, "cost": noisy_cost(optimum, beta)},
        evaluate=lambda theta, solver=None: {
            "gain": float(theta["gain"]),
            "cost": noisy_cost(float(theta["gain"]), beta),
        },
    )
