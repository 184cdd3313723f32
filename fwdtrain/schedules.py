"""``fwdtrain.schedules``: learning-rate schedules, the names of ``fwdtrain.core.schedules`` at their public path."""

from .core.schedules import (
    Parameter,
    Schedule,
    constant,
    inverse_time,
    piecewise_constant,
    staged,
)

__all__ = [
    "Parameter",
    "Schedule",
    "constant",
    "inverse_time",
    "piecewise_constant",
    "staged",
]
