"""What the SDE is: drift, diffusion and running cost of ONE particle.

    dX = mu(X, theta) dt + sigma(X, theta) dW,      cost c(X, theta)

with X in R^d, W an m-dimensional Brownian motion and theta a pytree.
``sigma`` is a (d, m) matrix, or a (d,) vector for diagonal noise (m = d).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import torch

Theta = Any  # a pytree (dict, list, tuple, NamedTuple) of tensors
Drift = Callable[[Theta, torch.Tensor], torch.Tensor]
Diffusion = Callable[[Theta, torch.Tensor], torch.Tensor]
Cost = Callable[[Theta, torch.Tensor], torch.Tensor]
Control = Callable[[Theta, torch.Tensor], torch.Tensor]


class Coefficients(NamedTuple):
    """The SDE's coefficients at one point: mu (d,), sigma (d, m) or (d,), c ()."""

    mu: torch.Tensor
    sigma: torch.Tensor
    cost: torch.Tensor


@dataclass(frozen=True)
class SDE:
    """A parametric SDE with a running cost, all functions of one particle.

    drift(theta, x) -> (d,); diffusion(theta, x) -> (d, m) or (d,) (diagonal
    noise); cost(theta, x) -> scalar. They must be pure and built from torch
    operations so that ``torch.func`` can differentiate and ``vmap`` them.
    """

    drift: Drift
    diffusion: Diffusion
    cost: Cost

    def __post_init__(self) -> None:
        for name in ("drift", "diffusion", "cost"):
            if not callable(getattr(self, name)):
                raise TypeError(f"SDE({name}=...) must be a function (theta, x) -> tensor, "
                                f"got {type(getattr(self, name)).__name__}")

    def coefficients(self, theta: Theta, x: torch.Tensor) -> Coefficients:
        """(mu, sigma, c) at (x, theta), one particle."""
        return Coefficients(self.drift(theta, x), self.diffusion(theta, x), self.cost(theta, x))


@dataclass(frozen=True, init=False)
class ControlledSDE(SDE):
    """A controlled SDE: u = control(theta, x), mu = b(x, u), sigma = s(x, u), c = r(x, u).

    ``ControlledSDE(control, drift, diffusion, cost)`` takes the control and the
    (x, u) functions b, s, r. It *is* an SDE: its ``drift``, ``diffusion`` and
    ``cost`` are the composed (theta, x) functions; the originals are kept as
    ``controlled_drift``, ``controlled_diffusion`` and ``controlled_cost``.
    ``coefficients`` evaluates the control once per point.
    """

    control: Control = field(default=None)  # type: ignore[assignment]
    controlled_drift: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(default=None, repr=False)  # type: ignore[assignment]
    controlled_diffusion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(default=None, repr=False)  # type: ignore[assignment]
    controlled_cost: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(default=None, repr=False)  # type: ignore[assignment]

    def __init__(
        self,
        control: Control,
        drift: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        diffusion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        cost: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> None:
        for name, fn in (("control", control), ("drift", drift), ("diffusion", diffusion), ("cost", cost)):
            if not callable(fn):
                raise TypeError(f"ControlledSDE({name}=...) must be a function, got {type(fn).__name__}")
        set_field = object.__setattr__
        set_field(self, "control", control)
        set_field(self, "controlled_drift", drift)
        set_field(self, "controlled_diffusion", diffusion)
        set_field(self, "controlled_cost", cost)
        set_field(self, "drift", lambda theta, x: drift(x, control(theta, x)))
        set_field(self, "diffusion", lambda theta, x: diffusion(x, control(theta, x)))
        set_field(self, "cost", lambda theta, x: cost(x, control(theta, x)))

    def coefficients(self, theta: Theta, x: torch.Tensor) -> Coefficients:
        u = self.control(theta, x)
        return Coefficients(
            self.controlled_drift(x, u), self.controlled_diffusion(x, u), self.controlled_cost(x, u)
        )
