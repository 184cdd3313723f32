"""A frozen-theta evaluation as a ``Trainable``, so that ``stationary_cost`` runs through ``run``'s loop.

    X_{n+1} = the solver's step with theta frozen (no sensitivity),
    S_{n+1}^i = S_n^i + c(X_n^i, theta) 1[n >= B],   theta_{n+1} = theta_n,   t_{n+1} = t_n + h

Its state is a ``FrozenPaths`` (x, the per-particle sums S (N,) in float64, theta, t): there is no
sensitivity to carry. ``run`` draws the noise, chooses eager or compiled steps by its route and keeps one
kernel for every theta (theta is carried in the state, not closed over).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch

from ..core._tree import tree_map
from ..core.evaluate import frozen_step
from ..core.problem import SDE
from ..core.solvers import EULER, Solver
from ..core.state import noise_dim
from ..core.step import StepInfo
from .trainable import Trainable


class FrozenPaths(NamedTuple):
    """N paths simulated with theta frozen, and their cost sums: the state of a ``FrozenCost`` run.

    Attributes:
        x: X_n, shape (N, d).
        sums: S_n^i = sum_{B <= k < n} c(X_k^i, theta), shape (N,), float64.
        theta: The parameters, frozen.
        t: The clock t_n = n h, 0-d float64.
    """

    x: torch.Tensor
    sums: torch.Tensor
    theta: Any
    t: torch.Tensor

    @property
    def average(self) -> None:
        """No running average of theta (the loop's records ask)."""
        return None

    @property
    def particles(self) -> int:
        return self.x.shape[0]


@dataclass(frozen=True)
class FrozenCost(Trainable):
    """The running cost of ``sde`` summed per particle from step ``burn_in`` on, theta frozen, by ``solver``."""

    sde: SDE
    solver: Solver = EULER
    burn_in: int = 0
    state_kind: ClassVar[type] = FrozenPaths

    def start(self, theta: Any, x0: torch.Tensor, particles: int) -> FrozenPaths:
        """N particles at x0 (d,), the sums at zero, the clock at 0 (float64)."""
        x = x0.expand(particles, -1).clone()
        sums = torch.zeros(particles, dtype=torch.float64, device=x0.device)
        return FrozenPaths(x, sums, theta, torch.zeros((), dtype=torch.float64, device=x0.device))

    def check(self, state: FrozenPaths, dt: Any, lr: Any) -> None:
        self.solver.check(self.sde, state.theta, state.x[0])

    def plan(self, state: FrozenPaths, mode: str = "auto") -> Hashable:
        return None  # nothing is differentiated

    def noise_shape(self, state: FrozenPaths) -> tuple[int, ...]:
        return (state.particles, noise_dim(self.sde, state.theta, state.x))

    def propagate(self, state: FrozenPaths, dw: torch.Tensor, dt: Any, plan: Hashable) -> tuple[FrozenPaths, StepInfo]:
        """X to n + 1 by the solver's scheme with every tangent None; the sums take c(X_n) from step B on."""
        x, cost = frozen_step(self.sde, state.theta, state.x, dw, dt, self.solver)
        counted = state.t >= (self.burn_in - 0.5) * dt  # n >= B on the float64 clock t_n = n h
        sums = torch.where(counted, state.sums + cost.double(), state.sums)
        zero = tree_map(torch.zeros_like, state.theta)  # G = 0: theta is frozen (a gradient shaped like theta)
        return state._replace(x=x, sums=sums), StepInfo(cost.mean(), zero)

    def update(self, moved: FrozenPaths, gradient: Any, alpha: Any, dt: Any) -> FrozenPaths:
        """theta frozen: only the clock moves."""
        return moved._replace(t=moved.t + dt)

    def record(self, state: FrozenPaths) -> Any:
        return ()

    def checked(self, state: FrozenPaths) -> dict[str, Any]:
        """x, the sums and theta (there is no sensitivity)."""
        return {"x": state.x, "sums": state.sums, "theta": state.theta}


__all__ = ["FrozenCost", "FrozenPaths"]
