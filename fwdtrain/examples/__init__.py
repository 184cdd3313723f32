"""Built-in problems. Each returns an ``Example``: the SDE, a starting point, defaults that train,
and what is known about the optimum. ``REGISTRY`` maps command-line names to the builders.

Builders take keyword arguments particles, dt, steps, lr, seed, dtype (and their own) and carry a one-line
``summary`` (the command line's help). Every example trains through ``fwdtrain.run``::

    ft.run(ex.trainable, ex.initial_state(), ex.steps, ex.dt, ex.lr, ex.noise(seed))

calibration and SGDCT examples name their ``problem`` (a ``fwdtrain.problems.Trainable``), SGDCT also its
``start`` and observed ``data``. ``EVENT_REGISTRY`` maps the event-stream examples (``python -m fwdtrain hawkes``,
``hawkes-2d``, ``order-book``) to their builders: point processes fitted by the exact likelihood, not by ``run``."""

from collections.abc import Callable

from ._example import Example
from .calibration import double_well_calibration, double_well_moments, ou_calibration
from .events import EVENT_REGISTRY, EventExample, hawkes_1d, hawkes_2d, order_book_events
from .lqr import linear_control_cost, linear_slope, lqr_1d
from .lqr_jumps import jump_linear_cost, jump_lqr, jump_lqr_proportional, jump_lqr_sde, jump_optimal_gain
from .lqr_riccati import LQR, lqr_nd, lqr_problem, random_lqr, riccati
from .noisy import noisy_control, noisy_cost, noisy_optimal_gain
from .ou_sgdct import ou_path, sgdct_ou

REGISTRY: dict[str, Callable[..., Example]] = {
    "lqr-1d": lqr_1d,
    "lqr-nd": lqr_nd,
    "jump-lqr": jump_lqr,
    "jump-lqr-proportional": jump_lqr_proportional,
    "noisy-control": noisy_control,
    "ou-calibration": ou_calibration,
    "double-well-calibration": double_well_calibration,
    "sgdct-ou": sgdct_ou,
}
DEFAULT = "lqr-1d"

__all__ = [
    "DEFAULT",
    "EVENT_REGISTRY",
    "LQR",
    "REGISTRY",
    "EventExample",
    "Example",
    "double_well_calibration",
    "double_well_moments",
    "hawkes_1d",
    "hawkes_2d",
    "jump_linear_cost",
    "jump_lqr",
    "jump_lqr_proportional",
    "jump_lqr_sde",
    "jump_optimal_gain",
    "linear_control_cost",
    "linear_slope",
    "lqr_1d",
    "lqr_nd",
    "lqr_problem",
    "noisy_control",
    "noisy_cost",
    "noisy_optimal_gain",
    "order_book_events",
    "ou_calibration",
    "ou_path",
    "random_lqr",
    "riccati",
    "sgdct_ou",
]
