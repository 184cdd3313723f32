"""Goodness of fit by time rescaling: the compensator of type k between its consecutive events,

    tau = Lambda_k(t_{i+1}^k) - Lambda_k(t_i^k),   Lambda_k(t) = int_start^t lambda_k ds,

is i.i.d. Exp(1) under the true model (the time-rescaling theorem); the first tau of each type runs from the
window's start. ``goodness`` gives the residuals of each type, their Kolmogorov-Smirnov distance to Exp(1) and its
p-value; ``qq_plot`` draws them against Exp(1)'s quantiles.

Ties: an event at the same time as the previous event of its type has the residual 0 under any model, an atom
that Exp(1) has not, so the KS distance is at least about the share of such events. ``goodness`` warns when that
share for a type exceeds ``tie_threshold(n)`` = max(1%, half the 5% KS critical value 1.36 / sqrt(n)): the ties
alone can then decide the test. For order-book data, merge the fills of one order (``read_lobster(merge=True)``).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import numpy as np
import torch

from .data import as_events, as_parameter
from .likelihood import forward, prepare
from .models import EventModel


class Goodness(NamedTuple):
    """Per type: the rescaled inter-event times (residuals), the KS statistic to Exp(1) and its p-value."""

    residuals: list[np.ndarray]
    ks: list[float]
    pvalue: list[float]


def ks_exponential(values: np.ndarray) -> tuple[float, float]:
    """(D, p): the Kolmogorov-Smirnov distance of ``values`` to Exp(1) and its asymptotic p-value."""
    n = values.size
    if n == 0:
        return float("nan"), float("nan")
    x = np.sort(values)
    cdf = 1 - np.exp(-x)
    distance = float(max((np.arange(1, n + 1) / n - cdf).max(), (cdf - np.arange(n) / n).max()))
    scaled = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * distance
    p = 2 * sum((-1) ** (j - 1) * math.exp(-2 * j * j * scaled * scaled) for j in range(1, 101))
    return distance, float(min(max(p, 0.0), 1.0))


def goodness(model: EventModel, params: dict[str, Any], events: Any, end_time: Any = None) -> Goodness:
    """The time-rescaling residuals of ``events`` under ``model`` at ``params`` (natural units)."""
    prepared = prepare(model, as_events(events, end_time, types=model.type_count))
    theta = {name: as_parameter(value, f"params[{name!r}]", prepared.data.times) for name, value in params.items()}
    with torch.no_grad():
        run = forward(model, theta, prepared)
    data = prepared.data
    cumulative = torch.cumsum(run.compensators, 1)  # (R, n, K): Lambda_k at each event
    residuals, tied = [], []
    for k in range(model.type_count):
        pieces, count = [], 0
        for r in range(data.realizations):
            mine = (data.types[r] == k) & data.mask[r]
            pieces.append(np.diff(cumulative[r, :, k][mine].cpu().double().numpy(), prepend=0.0))
            count += int((torch.diff(data.times[r][mine]) == 0).sum())
        residuals.append(np.concatenate(pieces))
        tied.append(count)
    _warn_ties(residuals, tied)
    tests = [ks_exponential(values) for values in residuals]
    return Goodness(residuals, [d for d, _ in tests], [p for _, p in tests])


def tie_threshold(n: int) -> float:
    """The share of tied residuals above which ``goodness`` warns: max(0.01, 0.68 / sqrt(n)), half the 5% KS
    critical value of n residuals (or 1%)."""
    return max(0.01, 0.68 / math.sqrt(max(n, 1)))


def _warn_ties(residuals: list[np.ndarray], tied: list[int]) -> None:
    for k, (values, count) in enumerate(zip(residuals, tied, strict=True)):
        share = count / max(values.size, 1)
        if values.size and share > tie_threshold(values.size):
            warnings.warn(
                f"fwdtrain: {count} of the {values.size} type-{k} events ({share:.1%}) are at the same time as the "
                f"previous one: their residuals are 0 under any model, so the KS distance is at least about "
                f"{share:.2f} from the ties alone; merge simultaneous events (for LOBSTER fills of one order: "
                "read_lobster(merge=True)) or break the ties before judging the fit",
                UserWarning,
                stacklevel=3,
            )


def qq_plot(fit: Goodness, ax: Any = None) -> Any:
    """Each type's sorted residuals against the Exp(1) quantiles -log(1 - (i - 1/2) / n), with the diagonal."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(4, 4))
    top = 0.0
    for k, values in enumerate(fit.residuals):
        n = values.size
        quantiles = -np.log(1 - (np.arange(1, n + 1) - 0.5) / n)
        ax.plot(quantiles, np.sort(values), ".", ms=2, label=f"type {k} (KS {fit.ks[k]:.3f})")
        top = max(top, float(quantiles.max(initial=0)))
    ax.plot([0, top], [0, top], "k--", lw=1)
    ax.set_xlabel("Exp(1) quantile")
    ax.set_ylabel("rescaled inter-event time")
    ax.legend()
    return ax


__all__ = ["Goodness", "goodness", "ks_exponential", "qq_plot", "tie_threshold"]
