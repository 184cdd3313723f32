"""The benchmark's work: controlled LQRs dX = (A X + B u) dt + dW, cost |X|^2 + |u|^2, MLP control.

- "lqr-1d":  the seed's problem, A = -1, B = 1, u = 1 -> 16 -> 1 ReLU MLP: fwdtrain.examples.lqr_1d itself.
- "lqr-10d": d = m = 10, A = -I/2 + (S - S^T)/4 with S ~ N(0, 1/d) fixed by a seed, B = I,
             u = 10 -> 64 -> 10 tanh MLP without output bias.
- "lqr-3d":  a tiny version of the latter (3 -> 4 -> 3) for --quick runs.

Each problem is given as plain numbers (A, B, the network) so that the torch and
JAX implementations build the same functions from the same theta.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

import fwdtrain as ft


class Problem(NamedTuple):
    name: str
    sde: ft.SDE
    theta: dict
    x0: torch.Tensor  # (d,)
    a: torch.Tensor  # (d, d)
    b: torch.Tensor  # (d, d)
    layers: int
    activation: str
    dt: float
    lr: float


def _controlled_lqr(
    name: str, a: torch.Tensor, b: torch.Tensor, sizes: list[int], activation: str, dtype: torch.dtype, seed: int
) -> Problem:
    control = ft.mlp(sizes, activation=activation, output_bias=False, seed=seed, dtype=dtype, output_scale=0.1)
    a, b = a.to(dtype), b.to(dtype)
    sde = ft.ControlledSDE(
        control=control.apply,
        drift=lambda x, u: x @ a.T + u @ b.T,
        diffusion=lambda x, u: torch.ones_like(x),
        cost=lambda x, u: x.square().sum() + u.square().sum(),
    )
    return Problem(
        name, sde, control.theta, torch.ones(sizes[0], dtype=dtype), a, b, len(sizes) - 1, activation, 0.01, 0.5
    )


def lqr(name: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> Problem:
    if name == "lqr-1d":
        example = ft.examples.lqr_1d(dtype=dtype, seed=seed)
        return Problem(
            name,
            example.sde,
            example.theta,
            example.x0,
            -torch.eye(1, dtype=dtype),
            torch.eye(1, dtype=dtype),
            2,
            "relu",
            0.01,
            0.5,
        )
    sizes: dict[str, Any] = {"lqr-10d": (10, 64), "lqr-3d": (3, 4)}
    if name not in sizes:
        raise ValueError(f"unknown benchmark problem {name!r}; choose one of lqr-1d, {', '.join(sizes)}")
    d, hidden = sizes[name]
    s = torch.randn(d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) / d**0.5
    a = -0.5 * torch.eye(d, dtype=torch.float64) + (s - s.T) / 4
    return _controlled_lqr(name, a, torch.eye(d), [d, hidden, d], "tanh", dtype, seed)


def jax_coefficients(problem: Problem):
    """The same (theta, x) -> (mu, sigma, c) in JAX (needs jax)."""
    from . import jax_impl

    control = jax_impl.mlp_apply(problem.layers, problem.activation)
    return jax_impl.lqr_coefficients(problem.a.numpy(), problem.b.numpy(), control)
