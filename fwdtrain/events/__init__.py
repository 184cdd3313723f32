"""Event streams: multivariate marked point processes fitted from raw timestamps by the exact likelihood.

``data`` (event layouts and checks), ``models`` (one class per kind: ``ExponentialHawkes``, ``AdditiveModel``,
``GeneralModel``), ``expsums`` (the closed-form state of exponential kernels), ``likelihood`` (the exact
log-likelihood with no grid), ``fitting`` (batch MLE and online fits, standard errors), ``rescaling``
(time-rescaling residuals), ``thinning`` (simulation).
"""

from .data import EventData, as_events, from_table, from_tick, read_lobster
from .fitting import FitResult, fit, information
from .likelihood import log_likelihood, prepare
from .models import (
    AdditiveModel,
    EventModel,
    ExponentialHawkes,
    ExponentialKernel,
    GeneralModel,
    Parameter,
    hawkes,
    intensity_model,
    order_book,
    pack,
    unpack,
)
from .rescaling import Goodness, goodness, ks_exponential, qq_plot
from .thinning import simulate

__all__ = [
    "AdditiveModel",
    "EventData",
    "EventModel",
    "ExponentialHawkes",
    "ExponentialKernel",
    "FitResult",
    "GeneralModel",
    "Goodness",
    "Parameter",
    "as_events",
    "fit",
    "from_table",
    "from_tick",
    "goodness",
    "hawkes",
    "information",
    "intensity_model",
    "ks_exponential",
    "log_likelihood",
    "order_book",
    "pack",
    "prepare",
    "qq_plot",
    "read_lobster",
    "simulate",
    "unpack",
]
