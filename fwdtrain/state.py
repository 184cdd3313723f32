"""The immutable training state (X, Xtilde, theta, t) and its construction."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from . import _checks
from ._tree import tree_map
from .problem import SDE, Coefficients, Theta, check_noise_type


class State(NamedTuple):
    """Everything the online algorithm carries from one step to the next.

    x:       (N, d) particles.
    x_tilde: pytree like theta; leaf of shape s -> (N, d, *s), the sensitivity dX/dtheta.
    theta:   the shared parameters (a pytree of tensors).
    t:       0-d tensor, the current time; float64 whatever the dtype of x (a float32 clock
             drifts by ~1e-3 after 10^4 steps and stops at t = 2^18 steps of 0.01).
    """

    x: torch.Tensor
    x_tilde: Any
    theta: Theta
    t: torch.Tensor

    @property
    def particles(self) -> int:
        return self.x.shape[0]

    @property
    def dim(self) -> int:
        return self.x.shape[1]


def evaluate_once(sde: SDE, theta: Theta, x: torch.Tensor, name: str = "x0") -> Coefficients:
    """Evaluate the coefficients at one particle and check their shapes against x (d,)."""
    d = x.shape[-1]
    try:
        value = Coefficients(*sde.coefficients(theta, x))
    except (RuntimeError, IndexError, ValueError) as error:
        raise ValueError(f"the SDE could not be evaluated at {name} of dimension d = {d}: {error}. "
                         f"Check that {name} has one entry per state dimension the model expects.") from error
    for field, tensor in zip(Coefficients._fields, value):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"the SDE's {field} returned {type(tensor).__name__}; it must return a torch.Tensor")
    if value.mu.shape != (d,):
        raise ValueError(f"drift returned shape {tuple(value.mu.shape)} at {name} of shape ({d},); "
                         f"it must return ({d},), one entry per state dimension")
    if value.sigma.shape != (d,) and (value.sigma.ndim != 2 or value.sigma.shape[0] != d):
        raise ValueError(f"diffusion returned shape {tuple(value.sigma.shape)}; it must return a ({d}, m) "
                         f"matrix or a ({d},) vector for diagonal noise")
    if value.cost.shape != ():
        raise ValueError(f"cost returned shape {tuple(value.cost.shape)}; it must return a scalar (0-d tensor)")
    return value


def noise_dim(sde: SDE, theta: Theta, x: torch.Tensor) -> int:
    """m, the dimension of the Brownian motion: sigma's columns, or d for diagonal noise."""
    sigma = Coefficients(*sde.coefficients(theta, x[0] if x.ndim == 2 else x)).sigma
    return sigma.shape[-1]


def init(sde: SDE, theta: Theta, x0: torch.Tensor, particles: int | None = None) -> State:
    """The state at t = 0: x = x0 for every particle, x_tilde = 0.

    x0 is (d,) (copied to every particle; ``particles`` defaults to 1) or (N, d)
    (one row per particle). theta is copied so later changes to it by the
    caller cannot leak into the state.
    """
    if not isinstance(sde, SDE):
        raise TypeError(f"init(sde, ...) expects a fwdtrain.SDE or ControlledSDE, got {type(sde).__name__}")
    dtype, device = _checks.check_theta(theta)
    x0 = _checks.check_tensor(x0, "x0", dtype, device)
    if x0.ndim == 1:
        n = 1 if particles is None else _checks.check_count(particles, "particles")
        x = x0.expand(n, -1).clone()
    elif x0.ndim == 2:
        n = x0.shape[0]
        if particles is not None and _checks.check_count(particles, "particles") != n:
            raise ValueError(f"x0 has {n} rows but particles={particles}; pass x0 of shape (d,) "
                             f"or one row per particle")
        x = x0.clone()
    else:
        raise ValueError(f"x0 must have shape (d,) or (particles, d), got {tuple(x0.shape)}")
    if x.shape[1] == 0:
        raise ValueError("x0 is empty: the state dimension d must be at least 1")
    theta = tree_map(lambda leaf: leaf.detach().clone(), theta)
    evaluate_once(sde, theta, x[0])
    check_noise_type(sde, theta, x[0])
    x_tilde = tree_map(lambda leaf: torch.zeros((n, x.shape[1], *leaf.shape), dtype=dtype, device=device), theta)
    return State(x, x_tilde, theta, torch.zeros((), dtype=torch.float64, device=device))
