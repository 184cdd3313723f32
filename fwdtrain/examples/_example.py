from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch

from ..driver import run
from ..euler import LearningRate
from ..history import History
from ..problem import SDE
from ..state import State


class Example(NamedTuple):
    """A ready-to-train problem with defaults and what is known about its optimum.

    ``reference`` maps names (e.g. "optimal_cost", "optimal_slope") to known values;
    ``evaluate(theta)`` measures the same quantities for a trained theta (it may
    simulate, e.g. a stationary cost with theta frozen), so that a driver can print
    learned against reference side by side.

    Every example is trained by ``fwdtrain.run`` (``train`` below):
      problem: what ``run`` trains (a ``fwdtrain.trainable.Trainable``: a ``Calibration``, an
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
    evaluate: Callable[[Any], dict[str, float]]
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
        from ..state import init

        state = init(self.sde, self.theta, self.x0, self.particles) if state is None else state
        if self.start is None:
            return state
        return self.start(state)._replace(opt_state=state.opt_state, average=state.average)  # the rule's state kept

    def train(self, state: State | None = None, steps: int | None = None, seed: int = 0,
              **options: Any) -> tuple[State, History]:
        """``fwdtrain.run`` of this example from ``initial_state(state)`` for ``steps`` (default ``self.steps``),
        with its dt, lr and (for data-driven problems) its data for ``seed``; options go to ``run``."""
        steps = self.steps if steps is None else steps
        if self.data is not None and "noise" not in options:
            options["noise"] = self.data(seed, steps)
        return run(self.trainable, self.initial_state(state), steps, self.dt, self.lr, seed, **options)


def summary(text: str) -> Callable[[Callable[..., Example]], Callable[..., Example]]:
    """Attach a one-line command-line help ``text`` to an example builder (``builder.summary``)."""
    def attach(builder: Callable[..., Example]) -> Callable[..., Example]:
        builder.summary = text  # type: ignore[attr-defined]
        return builder
    return attach
