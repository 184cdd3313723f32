"""Built-in problems. Each returns an ``Example``: the SDE, a starting point, defaults that train,
and what is known about the optimum. ``REGISTRY`` maps command-line names to the builders."""

from typing import Callable

from ._example import Example
from .lqr import linear_control_cost, linear_slope, lqr_1d

REGISTRY: dict[str, Callable[..., Example]] = {
    "lqr-1d": lqr_1d,
}
DEFAULT = "lqr-1d"

__all__ = ["Example", "REGISTRY", "DEFAULT", "lqr_1d", "linear_slope", "linear_control_cost"]
