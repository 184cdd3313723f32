"""Event streams: multivariate marked point processes fitted from raw timestamps by the exact likelihood.

``data`` (event layouts and checks), ``models`` (one class per kind: ``ExponentialHawkes``, ``AdditiveModel``,
``GeneralModel``), ``expsums`` (the closed-form state of exponential kernels), ``likelihood`` (the exact
log-likelihood with no grid), ``fitting`` (batch MLE and online fits, standard errors), ``newton`` (the projected
Newton), ``online`` (the second-order online fit), ``rescaling`` (time-rescaling residuals), ``thinning``
(simulation), ``diagnostics`` (log L of any events, AIC/BIC, the intensity on a grid, branching matrix),
``neural`` (a neural intensity of decayed counts at several scales), ``synthetic`` (a simulated LOBSTER
message file).
"""

from . import synthetic
from .data import EventData, as_events, from_table, from_tick, merge_fills, read_lobster
from .diagnostics import Evaluation, branching, evaluate, intensity, log_likelihood, spectral_radius
from .fitting import FitResult, fit, information
from .likelihood import prepare
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
from .neural import neural_intensity
from .rescaling import Goodness, goodness, ks_exponential, qq_plot, tie_threshold
from .thinning import simulate

__all__ = [
    "AdditiveModel",
    "Evaluation",
    "EventData",
    "EventModel",
    "ExponentialHawkes",
    "ExponentialKernel",
    "FitResult",
    "GeneralModel",
    "Goodness",
    "Parameter",
    "as_events",
    "branching",
    "evaluate",
    "fit",
    "from_table",
    "from_tick",
    "goodness",
    "hawkes",
    "information",
    "intensity",
    "intensity_model",
    "ks_exponential",
    "log_likelihood",
    "merge_fills",
    "neural_intensity",
    "order_book",
    "pack",
    "prepare",
    "qq_plot",
    "read_lobster",
    "simulate",
    "spectral_radius",
    "synthetic",
    "tie_threshold",
    "unpack",
]
