"""Calibrating stationary distributions (``fwdtrain.calibration``): OU and a double well.

OU:  dX = kappa (mean - X) dt + scale dW, kappa fixed; fit theta = {"mean", "scale"} so that
     E[X] and E[X^2] hit targets. Closed form: the stationary law is N(mean, scale^2 / (2 kappa)),
     so the answer is mean = m*, scale = sqrt(2 kappa v*). The scale enters only the diffusion.
Double well:  dX = (a X - b X^3) dt + s dW, s fixed; fit theta = {"a", "b"} to E[X^2], E[X^4] of
     a known (a*, b*). The stationary density is proportional to exp((a x^2 - b x^4 / 2) / s^2);
     its moments are computed by quadrature (independent of any simulation).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..core import schedules
from ..problems import calibration as cal
from ._example import Example, summary


def ou_stationary(mean: float, scale: float, kappa: float) -> tuple[float, float]:
    """(E X, Var X) = (mean, scale^2 / (2 kappa)) for dX = kappa (mean - X) dt + scale dW."""
    return mean, scale * scale / (2 * kappa)


@summary("calibrate an OU process's mean and noise scale to a stationary mean and variance")
def ou_calibration(
    *,
    target_mean: float = 1.0,
    target_variance: float = 0.5,
    kappa: float = 1.0,
    particles: int = 64,
    dt: float = 0.01,
    steps: int = 20_000,
    lr: float = 1.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Example:
    """Fit an OU process's mean and noise scale to a stationary mean and variance (closed-form answer).

    theta starts at {"mean": 0, "scale": 0.5}; lr(t) = lr / (1 + t / 10); phi = (x, (x - m*)^2) with
    targets (m*, v*): J = (E X - m*)^2 + (Var X + (E X - m*)^2 - v*)^2 has the Hessian 2 diag(1, (scale / kappa)^2)
    at the optimum (well conditioned; with phi = (x, x^2) it would be 34 times worse). ``reference``/``evaluate``:
    mean, variance (closed form of the learned parameters) and scale, against m*, v* and sqrt(2 kappa v*).
    ``seed`` is the noise seed of the run.
    """
    if target_variance <= 0 or kappa <= 0:
        raise ValueError(f"need target_variance > 0 and kappa > 0, got {target_variance}, {kappa}")
    kappa = float(kappa)
    problem = cal.calibration(
        drift=lambda th, x: kappa * (th["mean"] - x),
        diffusion=lambda th, x: th["scale"] * torch.ones_like(x),
        observables=lambda th, x: torch.cat([x, (x - target_mean).square()]),
        targets=torch.tensor([target_mean, target_variance], dtype=dtype),
    )
    schedule = schedules.inverse_time(lr * 10.0, 10.0)

    def evaluate(theta, solver=None) -> dict[str, float]:
        mean, variance = ou_stationary(float(theta["mean"]), float(theta["scale"]), kappa)
        return {"mean": mean, "variance": variance, "scale": abs(float(theta["scale"]))}

    return Example(
        name="ou-calibration",
        sde=problem.sde,
        theta={"mean": torch.tensor(0.0, dtype=dtype), "scale": torch.tensor(0.5, dtype=dtype)},
        x0=torch.zeros(1, dtype=dtype),
        particles=particles,
        dt=dt,
        steps=steps,
        lr=schedule,
        reference={
            "mean": float(target_mean),
            "variance": float(target_variance),
            "scale": math.sqrt(2 * kappa * target_variance),
        },
        evaluate=evaluate,
        problem=problem,
    )


def double_well_moments(a: float, b: float, s: float = 1.0, powers=(2, 4), points: int = 40_001) -> list[float]:
    """E[X^p] under the density proportional to exp((a x^2 - b x^4 / 2) / s^2), by the trapezoid rule."""
    if b <= 0:
        raise ValueError(f"the double well needs b > 0 (a confining potential), got b = {b}")
    x_max = (abs(a) / b) ** 0.5 + 8.0 * (s * s / b) ** 0.25
    x = np.linspace(-x_max, x_max, points)
    log_density = (a * x**2 - b * x**4 / 2) / (s * s)
    density = np.exp(log_density - log_density.max())
    total = np.trapezoid(density, x)
    return [float(np.trapezoid(density * x**p, x) / total) for p in powers]


@summary("calibrate a double well's drift to the second and fourth stationary moments")
def double_well_calibration(
    *,
    a: float = 1.0,
    b: float = 1.0,
    s: float = 1.0,
    particles: int = 64,
    dt: float = 0.01,
    steps: int = 40_000,
    lr: float = 0.5,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Example:
    """Recover the double-well drift a x - b x^3 from its stationary E[X^2] and E[X^4] (quadrature targets).

    theta starts at {"a": 0.5, "b": 1.5}; lr(t) = lr / (1 + t / 20). ``reference``/``evaluate``:
    a, b and the quadrature moments m2, m4 of the learned parameters.
    """
    m2, m4 = double_well_moments(a, b, s)
    s = float(s)
    problem = cal.calibration(
        drift=lambda th, x: th["a"] * x - th["b"] * x**3,
        diffusion=lambda th, x: s * torch.ones_like(x),
        observables=lambda th, x: torch.cat([x**2, x**4]),
        targets=torch.tensor([m2, m4], dtype=dtype),
    )
    schedule = schedules.inverse_time(lr * 20.0, 20.0)

    def evaluate(theta, solver=None) -> dict[str, float]:
        learned_a, learned_b = float(theta["a"]), float(theta["b"])
        learned_m2, learned_m4 = double_well_moments(learned_a, learned_b, s) if learned_b > 0 else (math.nan,) * 2
        return {"a": learned_a, "b": learned_b, "m2": learned_m2, "m4": learned_m4}

    return Example(
        name="double-well-calibration",
        sde=problem.sde,
        theta={"a": torch.tensor(0.5, dtype=dtype), "b": torch.tensor(1.5, dtype=dtype)},
        x0=torch.zeros(1, dtype=dtype),
        particles=particles,
        dt=dt,
        steps=steps,
        lr=schedule,
        reference={"a": float(a), "b": float(b), "m2": m2, "m4": m4},
        evaluate=evaluate,
        problem=problem,
    )
