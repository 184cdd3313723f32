"""A Hawkes process fitted online to the events it simulates, against its known parameters.

    lambda(t) = mu + alpha sum_{t_i < t} exp(-beta (t - t_i)),   i.e.  lambda = mu + Y,  dY = -beta Y dt + alpha dN

The data are P paths simulated with (mu, alpha, beta) = (0.5, 0.8, 1.5) (branching ratio alpha / beta = 0.53,
mean intensity mu / (1 - alpha / beta) = 1.07) by the library's jump step; the fit starts at (1, 0.3, 1)
and maximises the point-process log-likelihood online (``fwdtrain.pointprocess.IntensityFit``).
"""

from __future__ import annotations

import math

import torch

from ..core import schedules
from ..problems.pointprocess import IntensityFit, hawkes, hawkes_theta, simulate
from ._example import Example, summary

TRUTH = {"mu": 0.5, "alpha": 0.8, "beta": 1.5}
START = {"mu": 1.0, "alpha": 0.3, "beta": 1.0}


@summary("fit a Hawkes process's (mu, alpha, beta) online to events it simulates, against the truth")
def hawkes_fit(
    *,
    particles: int = 16,
    dt: float = 0.05,
    steps: int = 8_000,
    lr: float = 30.0,
    lr_offset: float = 20.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> Example:
    """P = ``particles`` observed paths of ``steps`` steps of ``dt``; the rate alpha_t = lr / (lr_offset + t)."""
    del seed  # the data's seed is the run's noise seed (``Example.data``)
    model = hawkes()
    truth = hawkes_theta(**TRUTH, dtype=dtype)
    y0 = torch.zeros(1, dtype=dtype)
    return Example(
        name="hawkes",
        sde=model,
        theta=hawkes_theta(**START, dtype=dtype),
        x0=y0,
        particles=particles,
        dt=dt,
        steps=steps,
        lr=schedules.inverse_time(lr, lr_offset),
        reference=dict(TRUTH),
        evaluate=lambda theta: {name: math.exp(float(theta[f"log_{name}"])) for name in TRUTH},
        problem=IntensityFit(model),
        start=lambda state: state._replace(score=()),
        data=lambda seed, count: simulate(model, truth, y0, count, dt, particles, seed),
    )


__all__ = ["START", "TRUTH", "hawkes_fit"]
