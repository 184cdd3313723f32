"""``fwdtrain.pointprocess``: point processes fitted to observed events, the names of ``fwdtrain.events`` at their
public path: K-type marked point processes fitted from raw timestamps by the exact continuous-time likelihood,
in batch or online, with standard errors and goodness of fit.

The step-grid fit of 0.4 (``IntensityFit``, ``bin_events``, ``check_events``, ``hawkes_theta``,
``standard_errors``, ``grid_hawkes``, ``grid_intensity_model``, ``grid_simulate``) is a one-release alias: each
name still works and warns (``DeprecationWarning``) with its replacement in ``fwdtrain.events``; it goes in 0.6.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from .events import *  # noqa: F403  # every public name of fwdtrain.events, once
from .events import __all__ as __all__

EVENTS = "fwdtrain.events."
GRID = {  # the 0.4 name -> (its name in fwdtrain.problems.pointprocess, what replaces it)
    "IntensityFit": ("IntensityFit", f"{EVENTS}fit(model, times, end_time=T, method='online') (or 'batch')"),
    "bin_events": ("bin_events", f"raw event times, which {EVENTS}fit, simulate and goodness take (from_table)"),
    "check_events": ("check_events", f"{EVENTS}as_events / from_table, which check raw event times"),
    "hawkes_theta": ("hawkes_theta", f"{EVENTS}hawkes()'s params {{'baseline', 'adjacency', 'decay'}}"),
    "standard_errors": ("standard_errors", f"{EVENTS}fit(...).stderr (the observed information: information)"),
    "grid_hawkes": ("hawkes", f"{EVENTS}hawkes(dimension=1) (adjacency = alpha / beta)"),
    "grid_intensity_model": ("intensity_model", f"{EVENTS}intensity_model(rate, parameters=..., decay=...)"),
    "grid_simulate": ("simulate", f"{EVENTS}simulate(model, params, end_time, seed=...)"),
}


def __getattr__(name: str) -> Any:
    """The 0.4 step-grid names (``GRID``), with a ``DeprecationWarning`` that names the replacement."""
    if name not in GRID:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home, replacement = GRID[name]
    warnings.warn(
        f"fwdtrain.pointprocess.{name} is the step-grid fit of 0.4 and goes in fwdtrain 0.6; use {replacement}",
        DeprecationWarning,
        stacklevel=2,
    )
    with warnings.catch_warnings():  # one warning per use: not the module's own at its first import
        warnings.simplefilter("ignore", DeprecationWarning)
        module = importlib.import_module("fwdtrain.problems.pointprocess")
    return getattr(module, home)
