"""Total derivatives of the coefficients along the sensitivity Xtilde = dX/dtheta.

For any h(x, theta) the derivative along the sensitivity is

    D h = h_x Xtilde + h_theta = d/dtheta' h(X + Xtilde (theta' - theta), theta') |_{theta'=theta}

and mu, sigma and c are differentiated together by ``torch.func``, one code
path per mode:

- reverse (``jacrev``, one backward pass per output number): the partial
  Jacobians h_x and h_theta of (mu, sigma, c) in one pass over both arguments,
  then D h = h_x Xtilde + h_theta by one contraction. Differentiating the
  composed function instead is the same maths, but under ``vmap`` its backward
  pass through the shift Xtilde (theta' - theta) broadcasts Xtilde over the
  output basis: 10x slower for the 10-D benchmark, one thread
  (benchmarks/bench_strategies.py).
- forward (``jacfwd``, one forward pass per parameter): the composed function
  above, whose tangent along e_j is (Xtilde e_j, e_j), so no contraction at all.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, NamedTuple

import torch
from torch.func import jacfwd, jacrev, vmap

from ._tree import contract, size, tree_map
from .problem import Coefficients, Theta

Mode = Literal["auto", "reverse", "forward"]
MODES = ("auto", "reverse", "forward")


class Linearisation(NamedTuple):
    """Coefficients at (x, theta) and their total derivatives D mu, D sigma, D c.

    For a parameter leaf of shape s: D mu (d, *s); D sigma (d, m, *s) or (d, *s)
    for diagonal noise; D c (*s). With particles every tensor gains a leading N.
    """

    value: Coefficients
    total: Coefficients


def linearise(
    coefficients: Callable[[Theta, torch.Tensor], Coefficients],
    theta: Theta,
    x: torch.Tensor,
    x_tilde: Any,
    mode: Literal["reverse", "forward"] = "reverse",
) -> Linearisation:
    """(mu, sigma, c) at (x, theta) and D(mu, sigma, c) along ``x_tilde``, one particle."""
    if mode == "reverse":
        return _linearise_reverse(coefficients, theta, x, x_tilde)
    return _linearise_forward(coefficients, theta, x, x_tilde)


def _linearise_reverse(coefficients, theta: Theta, x: torch.Tensor, x_tilde: Any) -> Linearisation:
    """D h = h_x Xtilde + h_theta from the partial Jacobians of one ``jacrev`` over (theta, x)."""

    def evaluate(theta_: Theta, x_: torch.Tensor) -> tuple[Coefficients, Coefficients]:
        out = Coefficients(*coefficients(theta_, x_))
        return out, out

    jacobians, value = jacrev(evaluate, argnums=(0, 1), has_aux=True)(theta, x)
    total = Coefficients(*(
        tree_map(lambda h_theta, xt: h_theta + torch.tensordot(h_x, xt, dims=1), h_theta_tree, x_tilde)
        for h_theta_tree, h_x in jacobians
    ))
    return Linearisation(value, total)


def _linearise_forward(coefficients, theta: Theta, x: torch.Tensor, x_tilde: Any) -> Linearisation:
    """D h by ``jacfwd`` of the composed function theta' -> h(x + Xtilde (theta' - theta), theta')."""

    def along_sensitivity(theta_prime: Theta) -> tuple[Coefficients, Coefficients]:
        shift = tree_map(torch.sub, theta_prime, theta)
        out = Coefficients(*coefficients(theta_prime, x + contract(x_tilde, shift)))
        return out, out

    total, value = jacfwd(along_sensitivity, has_aux=True)(theta)
    return Linearisation(value, total)


def linearise_particles(
    coefficients: Callable[[Theta, torch.Tensor], Coefficients],
    theta: Theta,
    x: torch.Tensor,
    x_tilde: Any,
    mode: Literal["reverse", "forward"] = "reverse",
) -> Linearisation:
    """``linearise`` for N particles, ``x`` (N, d), shared ``theta``: one ``vmap``."""
    return vmap(lambda xi, xti: linearise(coefficients, theta, xi, xti, mode))(x, x_tilde)


def resolve_mode(mode: Mode, outputs: int, parameters: int) -> Literal["reverse", "forward"]:
    """``mode`` itself, or for "auto" the cheaper one: reverse mode costs one pass per output
    number, forward mode one per parameter."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode != "auto":
        return mode
    return "reverse" if outputs <= parameters else "forward"


def choose_mode(mode: Mode, theta: Theta, value: Coefficients) -> Literal["reverse", "forward"]:
    """``resolve_mode`` with outputs d + numel(sigma) + numel(c) read off evaluated coefficients."""
    return resolve_mode(mode, value.mu.numel() + value.sigma.numel() + value.cost.numel(), size(theta))
