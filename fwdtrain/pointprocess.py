"""``fwdtrain.pointprocess``: point processes fitted to observed events.

Event streams (``fwdtrain.events``): K-type marked point processes fitted from raw timestamps by the exact
continuous-time likelihood, in batch or online, with standard errors and goodness of fit: ``fit``, ``hawkes``,
``intensity_model``, ``order_book``, ``simulate``, the data builders and ``goodness``.

The step-grid fit of 0.4 (``fwdtrain.problems.pointprocess``): ``IntensityFit``, ``bin_events``,
``check_events``, ``hawkes_theta``, ``standard_errors``, and ``grid_hawkes``, ``grid_intensity_model``,
``grid_simulate`` (0.4's ``hawkes``, ``intensity_model`` and ``simulate``).
"""

from .events import (
    EventData,
    EventModel,
    FitResult,
    Goodness,
    Parameter,
    as_events,
    fit,
    from_table,
    from_tick,
    goodness,
    hawkes,
    information,
    intensity_model,
    log_likelihood,
    order_book,
    qq_plot,
    read_lobster,
    simulate,
)
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

__all__ = [
    "EventData",
    "EventModel",
    "FitResult",
    "Goodness",
    "IntensityFit",
    "Parameter",
    "as_events",
    "bin_events",
    "check_events",
    "fit",
    "from_table",
    "from_tick",
    "goodness",
    "grid_hawkes",
    "grid_intensity_model",
    "grid_simulate",
    "hawkes",
    "hawkes_theta",
    "information",
    "intensity_model",
    "log_likelihood",
    "order_book",
    "qq_plot",
    "read_lobster",
    "simulate",
    "standard_errors",
]
