"""Total derivatives of the coefficients along the sensitivity Xtilde = dX/dtheta.

For any h(x, theta) the derivative along the sensitivity is

    D h = h_x Xtilde + h_theta = d/dtheta' h(X + Xtilde (theta' - theta), theta') |_{theta'=theta}

so mu, sigma and c are differentiated together, in one pass of one composed
function, by ``torch.func``: reverse mode (``jacrev``, one pass per output
number) or forward mode (``jacfwd``, one pass per parameter).
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

    def along_sensitivity(theta_prime: Theta) -> tuple[Coefficients, Coefficients]:
        shift = tree_map(torch.sub, theta_prime, theta)
        out = Coefficients(*coefficients(theta_prime, x + contract(x_tilde, shift)))
        return out, out

    jacobian = jacrev if mode == "reverse" else jacfwd
    total, value = jacobian(along_sensitivity, has_aux=True)(theta)
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


def choose_mode(mode: Mode, theta: Theta, value: Coefficients) -> Literal["reverse", "forward"]:
    """Reverse mode when the outputs (d + numel(sigma) + 1) are fewer than the parameters p."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode != "auto":
        return mode
    outputs = value.mu.numel() + value.sigma.numel() + 1
    return "reverse" if outputs <= size(theta) else "forward"
