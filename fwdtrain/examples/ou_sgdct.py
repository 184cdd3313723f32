"""SGDCT on an Ornstein-Uhlenbeck path: recover (kappa, mean) of dX = kappa (mean - X) dt + scale dW.

The observed path is simulated exactly (the OU transition is Gaussian:
X_{n+1} = mean + (X_n - mean) e^{-kappa h} + scale sqrt((1 - e^{-2 kappa h}) / (2 kappa)) Z_n),
so the data carry no discretisation error; the estimator (``fwdtrain.sgdct``) sees only the
increments and the known scale. For a path of length T the maximum-likelihood estimate of
kappa has standard deviation about sqrt(2 kappa / T), and of the mean about scale / (kappa sqrt(T)):
no online estimator can beat these, so tolerances are stated in those units.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..core import schedules
from ..core.problem import SDE
from ..problems import sgdct
from ._example import Example, summary


def ou_path(
    kappa: float,
    mean: float,
    scale: float,
    x0: float,
    steps: int,
    dt: float,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    paths: int = 1,
) -> torch.Tensor:
    """(steps, paths, 1) increments X_{n+1} - X_n of exactly simulated independent OU paths from x0."""
    rng = np.random.default_rng(seed)
    rho = math.exp(-kappa * dt)
    noise = scale * math.sqrt((1 - rho * rho) / (2 * kappa)) * rng.standard_normal((steps, paths))
    path = np.empty((steps + 1, paths))
    path[0] = x0
    for n in range(steps):
        path[n + 1] = mean + (path[n] - mean) * rho + noise[n]
    return torch.as_tensor(np.diff(path, axis=0), dtype=dtype).reshape(steps, paths, 1)


def ou_model(scale: float) -> SDE:
    """The model dX = kappa (mean - X) dt + scale dW with theta = {"kappa", "mean"} (scale known)."""
    return SDE(
        drift=lambda th, x: th["kappa"] * (th["mean"] - x),
        diffusion=lambda th, x: scale * torch.ones_like(x),
        cost=lambda th, x: x.sum() * 0,
        noise_type="additive",
    )


@summary("estimate an OU drift online (SGDCT) from simulated observed paths")
def sgdct_ou(
    *,
    kappa: float = 1.0,
    mean: float = 1.0,
    scale: float = 1.0,
    particles: int = 1,
    dt: float = 0.01,
    steps: int = 100_000,
    lr: float = 1.0,
    offset: float = 5.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Example:
    """Estimate an OU drift online from ``particles`` simulated paths of ``steps`` observations each.

    theta starts at {"kappa": 0.5, "mean": 0}; lr(t) = lr offset / (offset + t), the Robbins-Monro
    C / (C0 + t) with C = lr offset ~ 1 / Fisher information (1 / E[(mean - X)^2 / scale^2] = 2 for the
    defaults), which gives the maximum-likelihood rate. ``noise(seed, steps)`` simulates the observed paths
    with ``seed``: ``fwdtrain.run(example.trainable, example.initial_state(), steps, example.dt, example.lr,
    example.noise(seed, steps))`` estimates from them; reference: the true kappa and mean.
    """
    if kappa <= 0 or scale <= 0:
        raise ValueError(f"need kappa > 0 and scale > 0, got kappa={kappa}, scale={scale}")
    model = ou_model(float(scale))
    schedule = schedules.inverse_time(lr * offset, offset)
    if isinstance(particles, bool) or not isinstance(particles, int) or particles < 1:
        raise ValueError(f"particles (the number of observed paths) must be a positive integer, got {particles!r}")
    x0 = (
        torch.full((particles, 1), float(mean), dtype=dtype)
        if particles > 1
        else torch.tensor([float(mean)], dtype=dtype)
    )

    def data(seed: int, steps: int) -> torch.Tensor:  # the observed increments, (steps, paths, 1)
        return ou_path(kappa, mean, scale, float(mean), steps, dt, seed, dtype, paths=particles)

    def start(state):  # the estimator at the paths' first points
        return sgdct.as_state(sgdct.init(state.theta), x0)

    return Example(
        name="sgdct-ou",
        sde=model,
        theta={"kappa": torch.tensor(0.5, dtype=dtype), "mean": torch.tensor(0.0, dtype=dtype)},
        x0=x0[0] if particles > 1 else x0,
        particles=particles,
        dt=dt,
        steps=steps,
        lr=schedule,
        reference={"kappa": float(kappa), "mean": float(mean)},
        evaluate=lambda theta, solver=None: {"kappa": float(theta["kappa"]), "mean": float(theta["mean"])},
        problem=sgdct.DriftEstimation(model, single=particles == 1),
        start=start,
        data=data,
    )
