"""``fwdtrain.pointprocess``: point processes fitted to observed events.

Event streams (``fwdtrain.events``): K-type marked point processes fitted from raw timestamps by the exact
continuous-time likelihood, in batch or online, with standard errors and goodness of fit: ``fit``, ``hawkes``,
``intensity_model``, ``order_book``, ``simulate``, the data builders and ``goodness``.

The step-grid fit of 0.4 (``fwdtrain.problems.pointprocess``): ``IntensityFit``, ``bin_events``,
``check_events``, ``hawkes_theta``, ``standard_errors``, and ``grid_hawkes``, ``grid_intensity_model``,
``grid_simulate`` (0.4's ``hawkes``, ``intensity_model`` and ``simulate``).
"""

from .events import *  # noqa: F403  # every public name of fwdtrain.events, once
from .events import __all__ as _events_all
from .problems.pointprocess import (
    IntensityFit,
    bin_events,
    check_events,
    hawkes_theta,
    standard_errors,
)
from .problems.pointprocess import hawkes as grid_hawkes
from .problems.pointprocess import intensity_model as grid_intensity_model
from .problems.pointprocess import simulate as grid_simulate

__all__ = [  # noqa: PLE0604
    *_events_all,
    "IntensityFit",
    "bin_events",
    "check_events",
    "grid_hawkes",
    "grid_intensity_model",
    "grid_simulate",
    "hawkes_theta",
    "standard_errors",
]
