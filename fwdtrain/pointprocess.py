"""``fwdtrain.pointprocess``: fitting intensity models (Hawkes, state-dependent) to observed events online.

The names of ``fwdtrain.problems.pointprocess`` at their public path.
"""

from .problems.pointprocess import (
    IntensityFit,
    bin_events,
    check_events,
    hawkes,
    hawkes_theta,
    intensity_model,
    simulate,
    standard_errors,
)

__all__ = [
    "IntensityFit",
    "bin_events",
    "check_events",
    "hawkes",
    "hawkes_theta",
    "intensity_model",
    "simulate",
    "standard_errors",
]
