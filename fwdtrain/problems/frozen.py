"""A frozen-theta evaluation as a ``Trainable``, so that ``stationary_cost`` runs through ``run``'s loop.

    X_{n+1} = the solver's step with theta frozen (no sensitivity),
    S_{n+1}^i = S_n^i + c(X_n^i, theta) 1[n >= B],   theta_{n+1} = theta_n,   t_{n+1} = t_n + h

The state's sensitivity slot carries the per-particle running sums S (N,) in float64 (there is no
sensitivity to carry); ``run`` draws the noise, chooses eager or compiled steps by its route and keeps one
kernel for every theta (theta is carried in the state, not closed over).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch

from ..core._tree import tree_map
from ..core.evaluate import frozen_step
from ..core.problem import SDE
from ..core.solvers import EULER, Solver
from ..core.state import State, noise_dim
from ..core.step import StepInfo
from .trainable import Trainable


@dataclass(frozen=True)
class FrozenCost(Trainable):
    """The running cost of ``sde`` summed per particle from step ``burn_in`` on, theta frozen, by ``solver``."""

    sde: SDE
    solver: Solver = EULER
    burn_in: int = 0

    def start(self, theta: Any, x0: torch.Tensor, particles: int) -> State:
        """N particles at x0 (d,), the sums at zero, the clock at 0 (float64)."""
        x = x0.expand(particles, -1).clone()
        sums = torch.zeros(particles, dtype=torch.float64, device=x0.device)
        return State(x, sums, theta, torch.zeros((), dtype=torch.float64, device=x0.device))

    def check(self, state: State, dt: Any, lr: Any) -> None:
        self.solver.check(self.sde, state.theta, state.x[0])

    def plan(self, state: State, mode: str = "auto") -> Hashable:
        return None  # nothing is differentiated

    def noise_shape(self, state: State) -> tuple[int, ...]:
        return (state.particles, noise_dim(self.sde, state.theta, state.x))

    def propagate(self, state: State, dw: torch.Tensor, dt: Any, plan: Hashable) -> tuple[State, StepInfo]:
        """X to n + 1 by the solver's scheme with every tangent None; the sums take c(X_n) from step B on."""
        x, cost = frozen_step(self.sde, state.theta, state.x, dw, dt, self.solver)
        counted = state.t >= (self.burn_in - 0.5) * dt  # n >= B on the float64 clock t_n = n h
        sums = torch.where(counted, state.x_tilde + cost.double(), state.x_tilde)
        zero = tree_map(torch.zeros_like, state.theta)  # G = 0: theta is frozen (a gradient shaped like theta)
        return state._replace(x=x, x_tilde=sums), StepInfo(cost.mean(), zero)

    def update(self, moved: State, gradient: Any, alpha: Any, dt: Any) -> State:
        """theta frozen: only the clock moves."""
        return moved._replace(t=moved.t + dt)

    def record(self, state: State) -> Any:
        return ()


__all__ = ["FrozenCost"]
