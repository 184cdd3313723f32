"""Exact simulation of an ``EventModel`` by Ogata's thinning, seeded.

From the state y at time t, with bounds M_k >= lambda_k over the next ``window`` (``model.bound``; Hawkes: the
intensities now, which only decay), a candidate waits s ~ Exp(sum M); if s passes the window the state flows to
its end and the draw restarts; else the state flows to t + s and the candidate is an event with probability
sum lambda / sum M, of type k with probability lambda_k / sum lambda, with a mark from ``marks(rng, k)``; the
state then jumps. A model with no ``bound`` is bounded by 1.5 times the largest intensity on a grid of the
window along the flow, and a candidate whose intensity exceeds its bound stops the simulation with an error
(the draw would not be exact), so a result is always exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .data import D64, EventData, from_tick
from .likelihood import flow
from .models import AdditiveModel, EventModel, ExponentialHawkes, GeneralModel, check_additive, kernel_rate


def _flow(model: EventModel, theta: Any, y: torch.Tensor, span: float) -> torch.Tensor:
    """Y after ``span`` with no events: the likelihood's own flow (``likelihood.flow``), for one state."""
    if span <= 0:
        return y
    if isinstance(model, ExponentialHawkes):
        return y * torch.exp(-model.decay(theta) * span)
    assert isinstance(model, AdditiveModel | GeneralModel)
    steps = max(1, int(np.ceil(span / model.step)))
    return flow(model, theta, y[None], torch.full((1,), span, dtype=D64), steps)[0]


def _bound(model: EventModel, theta: Any, y: torch.Tensor, window: float) -> torch.Tensor:
    if model.bound is not None:
        return model.bound(theta, y, window)
    grid, peak, h = 16, model.rate(theta, y), window / 16
    for _ in range(grid):
        y = _flow(model, theta, y, h)
        peak = torch.maximum(peak, model.rate(theta, y))
    return 1.5 * peak


def _path(
    model: EventModel,
    theta: Any,
    start: float,
    end: float,
    rng: np.random.Generator,
    marks: Any,
    window: float,
    limit: int,
):
    y, t = torch.zeros(model.state_size, dtype=D64), start
    times, kinds, values = [], [], []
    while t < end:
        span = min(window, end - t)
        bound = float(_bound(model, theta, y, span).sum())
        wait = rng.exponential(1 / bound) if bound > 0 else np.inf
        if wait >= span:
            y, t = _flow(model, theta, y, span), t + span
            continue
        y, t = _flow(model, theta, y, wait), t + wait
        rates = (
            kernel_rate(model.kernel, theta, y, torch.tensor(t, dtype=D64))
            if isinstance(model, ExponentialHawkes)
            else model.rate(theta, y)
        )
        total = float(rates.sum())
        if total > bound * (1 + 1e-9):
            raise RuntimeError(
                f"the intensity {total:g} at t = {t:g} exceeds its bound {bound:g}: give the model a bound= "
                "(intensity_model(..., bound=...)) or a shorter window"
            )
        if rng.uniform() * bound >= total:
            continue
        kind = int(rng.choice(model.type_count, p=(rates / rates.sum()).numpy()))
        mark = torch.as_tensor(np.asarray(marks(rng, kind) if marks is not None else [], dtype=np.float64))
        y = y + model.jump(theta, y, torch.tensor(kind), mark)
        times.append(t)
        kinds.append(kind)
        values.append(mark.numpy())
        if len(times) > limit:
            raise RuntimeError(f"more than max_events = {limit} events: the process may be explosive")
    return np.asarray(times), np.asarray(kinds, dtype=np.int64), values


def simulate(
    model: EventModel,
    theta: dict[str, Any],
    end_time: float,
    *,
    seed: int = 0,
    realizations: int = 1,
    marks: Callable[[np.random.Generator, int], Any] | None = None,
    window: float = 1.0,
    max_events: int = 1_000_000,
) -> EventData:
    """Events of ``realizations`` independent paths of ``model`` on [0, end_time] at ``theta`` (natural units),
    from Y(0) = 0, seeded by ``seed``; ``marks(rng, k)`` draws the mark (q,) of a type-k event (numpy's rng; e.g.
    a Bernoulli side ``lambda rng, k: [rng.integers(2)]``)."""
    if not (np.isfinite(end_time) and end_time > 0):
        raise ValueError(f"end_time must be a positive number, got {end_time!r}")
    theta = {name: torch.as_tensor(value, dtype=D64) for name, value in theta.items()}
    if isinstance(model, AdditiveModel):
        width = np.asarray(marks(np.random.default_rng(seed), 0) if marks is not None else []).size
        check_additive(model, theta, width)
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        paths = [
            _path(model, theta, 0.0, float(end_time), rng, marks, float(window), max_events)
            for _ in range(realizations)
        ]
    data = from_tick(
        [[times[kinds == k] for k in range(model.type_count)] for times, kinds, _ in paths], end_time=end_time
    )
    q = max((len(v[0]) for _, _, v in paths if v), default=0)
    if q == 0:
        return data
    out = torch.zeros((*data.times.shape, q), dtype=D64)
    for r, (times, _, values) in enumerate(paths):  # drawn times increase strictly: the marks are in time order
        out[r, : len(times)] = torch.as_tensor(np.asarray(values))
    return data._replace(marks=out)


__all__ = ["simulate"]
