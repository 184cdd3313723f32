"""``Example``: a built-in problem with defaults that train and what is known about its optimum."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ..core.problem import SDE
from ..core.state import State, init
from ..core.step import LearningRate


class Example(NamedTuple):
    """A ready-to-train problem with defaults and what is known about its optimum.

    ``reference`` maps names (e.g. "optimal_cost", "optimal_slope") to known values;
    ``evaluate(theta, solver=None)`` measures the same quantities for a trained theta (it may
    simulate, e.g. a stationary cost with theta frozen, with the solver the run trained with),
    so that a driver can print learned against reference side by side.

    Every example is trained by ``fwdtrain.run``::

        ft.run(ex.trainable, ex.initial_state(), ex.steps, ex.dt, ex.lr, ex.noise(seed, ex.steps))

      problem: what ``run`` trains (a ``fwdtrain.problems.Trainable``: a ``Calibration``, an
               ``sgdct.DriftEstimation``); None means ``sde`` itself (the cost form).
      start:   maps ``fwdtrain.init(sde, theta, x0, particles)`` to the problem's first state
               (None: that state itself); e.g. SGDCT starts from the observed paths' first points.
      data:    ``data(seed, steps) -> noise`` for problems whose noise is data (the observed
               increments of SGDCT, one row per step); None: Brownian noise from the seed.
    """

    name: str
    sde: SDE
    theta: Any
    x0: torch.Tensor
    particles: int
    dt: float
    steps: int
    lr: LearningRate
    reference: dict[str, float]
    evaluate: Callable[..., dict[str, float]]
    problem: Any = None
    start: Callable[[State], State] | None = None
    data: Callable[[int, int], torch.Tensor] | None = None

    @property
    def trainable(self) -> Any:
        """What ``run`` trains: ``problem``, or the SDE."""
        return self.sde if self.problem is None else self.problem

    def initial_state(self, state: State | None = None) -> State:
        """The problem's first state, from ``state`` (default ``fwdtrain.init(sde, theta, x0, particles)``);
        its opt_state and average are kept."""
        state = init(self.sde, self.theta, self.x0, self.particles) if state is None else state
        if self.start is None:
            return state
        return self.start(state)._replace(opt_state=state.opt_state, average=state.average)  # the rule's state kept

    def measure(self, theta: Any, solver: Any = None) -> dict[str, float]:
        """``evaluate(theta, solver)``, or ``evaluate(theta)`` for an ``evaluate`` that takes no solver."""
        parameters = inspect.signature(self.evaluate).parameters
        takes_solver = "solver" in parameters or len(parameters) > 1
        return self.evaluate(theta, solver) if takes_solver else self.evaluate(theta)

    def noise(self, seed: int, steps: int | None = None) -> Any:
        """What ``run`` takes as ``noise``: the seed, or for data-driven problems the data of ``seed``."""
        return seed if self.data is None else self.data(seed, self.steps if steps is None else steps)


def summary(text: str) -> Callable[[Callable[..., Example]], Callable[..., Example]]:
    """Attach a one-line command-line help ``text`` to an example builder (``builder.summary``)."""

    def attach(builder: Callable[..., Example]) -> Callable[..., Example]:
        builder.summary = text  # type: ignore[attr-defined]
        return builder

    return attach
