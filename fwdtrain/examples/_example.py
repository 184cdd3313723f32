from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch

from ..problem import SDE
from ..euler import LearningRate


class Example(NamedTuple):
    """A ready-to-train problem with defaults and what is known about its optimum.

    ``reference`` maps names (e.g. "optimal_cost", "optimal_slope") to known values;
    ``evaluate(theta)`` measures the same quantities for a trained theta (it may
    simulate, e.g. a stationary cost with theta frozen), so that a driver can print
    learned against reference side by side.

    ``train`` is None for problems trained by the cost-form step (``fwdtrain.run(sde, ...)``).
    Problems trained by another algorithm (calibration, SGDCT) set it to
    ``train(state, steps, seed) -> (state, fwdtrain.History)``, which uses the example's dt and lr;
    ``state`` starts as ``fwdtrain.init(sde, theta, x0, particles)`` and the returned one has
    ``.theta`` and ``.t``.
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
    train: Callable[..., tuple[Any, Any]] | None = None
