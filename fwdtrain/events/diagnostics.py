"""A fitted model judged on any events: the log-likelihood (held-out days too), AIC and BIC, the intensity on a
time grid, and an exponential kernel's branching matrix and spectral radius.

- ``log_likelihood(model, params, events)``: log L at ``params`` (natural units) of any events (``EventData``,
  tick's layout, a table, raw times, or a ``prepare``d object);
- ``evaluate``: log L with AIC = 2 p - 2 log L and BIC = p log n - 2 log L (p parameters, n events);
- ``intensity(model, params, events, grid)``: lambda_k(t-) at the grid's times, the left limit (an event at a
  grid time is not yet seen), from the state Y after the last event before each grid time, flowed to it;
- ``branching``: the L1 norms int_0^inf phi_ij(t) dt = sum_u alpha_iju of an exponential kernel (tick's
  parameterisation), and ``spectral_radius``: the process is stationary when it is < 1.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch.func import vmap

from .data import EventData, as_events, as_parameter
from .expsums import linear_scan
from .likelihood import Prepared, flow, prepare
from .likelihood import log_likelihood as _prepared_log_likelihood
from .models import AdditiveModel, EventModel, ExponentialHawkes, GeneralModel, kernel_rate, size


def _theta(params: dict[str, Any], events: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """theta as tensors beside ``events`` (``data.as_parameter``: numbers in the events' dtype, tensors as they
    are, so they stay differentiable, if they match the events)."""
    return {k: as_parameter(v, f"params[{k!r}]", events) for k, v in params.items()}


def _data(model: EventModel, events: Any, end_time: Any, start_time: Any) -> EventData:
    data = as_events(events, end_time, start_time, model.type_count)
    if data.dimension > model.type_count:
        raise ValueError(
            f"the events have {data.dimension} types (0..{data.dimension - 1}) but the model has {model.type_count}: "
            "build the model with more types or relabel the events"
        )
    return data._replace(dimension=model.type_count)


def log_likelihood(
    model: EventModel, params: dict[str, Any], events: Any, end_time: Any = None, start_time: Any = 0.0
) -> torch.Tensor:
    """log L (0-d, summed over realizations) of ``events`` under ``model`` at ``params`` (natural units; tensors
    stay differentiable). ``events``: anything ``as_events`` takes, or a ``prepare``d object."""
    prepared = events if isinstance(events, Prepared) else prepare(model, _data(model, events, end_time, start_time))
    return _prepared_log_likelihood(model, _theta(params, prepared.data.times), prepared)


class Evaluation(NamedTuple):
    """log L of some events at given parameters, with p the number of parameters, n the number of events,
    AIC = 2 p - 2 log L and BIC = p log n - 2 log L (smaller is better)."""

    log_likelihood: float
    parameters: int
    events: int
    aic: float
    bic: float


def evaluate(
    model: EventModel, params: dict[str, Any], events: Any, end_time: Any = None, start_time: Any = 0.0
) -> Evaluation:
    """log L, AIC and BIC of ``events`` (a held-out day, or the fitted ones) under ``model`` at ``params``."""
    data = _data(model, events, end_time, start_time)
    value = float(log_likelihood(model, params, data))
    p, n = size(model), data.events
    return Evaluation(value, p, n, 2 * p - 2 * value, p * math.log(n) - 2 * value)


def _flow(model: EventModel, theta: Any, y: torch.Tensor, gap: torch.Tensor) -> torch.Tensor:
    """Y (B, d) after ``gap`` (B,) with no events: closed form for a decay, else the likelihood's own flow."""
    decay = getattr(model, "decay", None)
    if isinstance(model, ExponentialHawkes) or decay is not None:
        return y * torch.exp(-gap[:, None] * model.decay(theta))  # type: ignore[attr-defined]
    assert isinstance(model, GeneralModel)
    if model.drift is None or y.shape[0] == 0:
        return y
    return flow(model, theta, y, gap, max(1, math.ceil(float(gap.max()) / model.step)))


def _after_events(model: EventModel, theta: Any, data: EventData) -> torch.Tensor:
    """Y just after each event (R, n, d), Y(start) = 0; padding leaves it unchanged."""
    r, n = data.times.shape
    gaps = torch.diff(data.times, dim=1, prepend=data.start[:, None])
    jump = vmap(model.jump, in_dims=(None, 0, 0, 0))
    if isinstance(model, ExponentialHawkes | AdditiveModel):  # jumps that do not depend on Y: one scan
        zeros = data.times.new_zeros((r * n, model.state_size))
        flat = jump(theta, zeros, data.types.reshape(-1), data.marks.reshape(r * n, -1)).reshape(r, n, -1)
        fades = torch.exp(-gaps[..., None] * model.decay(theta))
        return linear_scan(fades, flat * data.mask[..., None].to(data.dtype))
    y = data.times.new_zeros((r, model.state_size))
    out = []
    for i in range(n):
        y = _flow(model, theta, y, gaps[:, i])
        y = y + data.mask[:, i, None].to(data.dtype) * jump(theta, y, data.types[:, i], data.marks[:, i])
        out.append(y)
    return torch.stack(out, 1)


def intensity(
    model: EventModel,
    params: dict[str, Any],
    events: Any,
    grid: Any,
    end_time: Any = None,
    start_time: Any = 0.0,
) -> torch.Tensor:
    """lambda(t-) (R, G, K) of ``events`` under ``model`` at ``params`` at the times ``grid`` ((G,) for every
    realization or (R, G)), each at least its realization's start: the left limit, which excludes an event at
    the grid time itself. Y is carried over the events once and flowed from the last event before each time."""
    data = _data(model, events, end_time, start_time)
    theta = _theta(params, data.times)
    r = data.realizations
    times = torch.as_tensor(grid, dtype=data.dtype, device=data.device)
    times = times.expand(r, -1).contiguous() if times.ndim == 1 else times
    if times.ndim != 2 or times.shape[0] != r:
        raise ValueError(f"grid must be (G,) or (R, G) = ({r}, G) times, got shape {tuple(times.shape)}")
    early = times < data.start[:, None]
    if bool(early.any()):
        row, col = (int(i) for i in torch.nonzero(early)[0])
        raise ValueError(
            f"grid[{row}, {col}] = {float(times[row, col]):g} is before the window's start {float(data.start[row]):g}"
        )
    after = _after_events(model, theta, data)
    last = torch.searchsorted(data.times, times, right=False) - 1  # the last event strictly before each time
    seen = (last >= 0)[..., None]
    index = last.clamp(min=0)
    state = torch.where(seen, torch.gather(after, 1, index[..., None].expand(-1, -1, model.state_size)), 0.0)
    since = torch.where(seen[..., 0], torch.gather(data.times, 1, index), data.start[:, None])
    flat = _flow(model, theta, state.reshape(-1, model.state_size), (times - since).reshape(-1))
    if isinstance(model, ExponentialHawkes):  # its baseline may vary with the time of day, which Y does not hold
        rates = vmap(lambda y, t: kernel_rate(model.kernel, theta, y, t))(flat, times.reshape(-1))
    else:
        rates = vmap(model.rate, in_dims=(None, 0))(theta, flat)
    return rates.reshape(r, times.shape[1], model.type_count)


def branching(model: EventModel, params: dict[str, Any]) -> torch.Tensor:
    """The branching matrix (K, K) of an exponential-kernel model: entry (i, j) the L1 norm of phi_ij, the mean
    number of type-i events each type-j event triggers directly (tick's adjacency, summed over the decays)."""
    if not isinstance(model, ExponentialHawkes):
        raise TypeError(
            "branching needs a model with exponential kernels (events.hawkes); this model's excitation is not a "
            "kernel of past events, so it has no L1 norms"
        )
    return model.kernel.weights(_theta(params)).sum(1)


def spectral_radius(model: EventModel, params: dict[str, Any]) -> float:
    """The spectral radius of ``branching``: the process is stationary (its mean rates (I - B)^-1 mu finite)
    when it is < 1."""
    return float(torch.linalg.eigvals(branching(model, params)).abs().max())


__all__ = ["Evaluation", "branching", "evaluate", "intensity", "log_likelihood", "spectral_radius"]
