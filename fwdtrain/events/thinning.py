"""Exact simulation of an ``EventModel`` by Ogata's thinning, seeded.

From the state y at time t, with a bound M >= sum_k lambda_k over the next ``window``, a candidate waits
s ~ Exp(M); if s passes the window the state flows to its end and the draw restarts; else the state flows to t + s
and the candidate is an event with probability sum lambda / M, of type k with probability lambda_k / sum lambda,
with a mark from ``marks(rng, k)``; the state then jumps. Each candidate draws, in this order, its wait
(``standard_exponential``), its acceptance (``random``) and, if accepted, its type (``random``) and its mark.

- ``ExponentialHawkes``: the loop runs on Python floats, no torch call per candidate. With E_iu the excitation of
  type i by decay u (sum_j weights_iuj decays_u S_uj), each E_iu and T_u = sum_i E_iu decay as exp(-b_u s), so the
  bound (the day's largest baseline plus sum_u T_u, which only decays until the next event) and sum lambda cost U
  exponentials per candidate; E (K, U) is brought forward only at an accepted event (to choose its type) and each
  event adds size * weights_iuk decays_u to E_iu (size 1, or ``kernel.jump_size`` of its mark).
- ``AdditiveModel``, ``GeneralModel``: torch, ``model.rate`` once per candidate. With ``model.bound`` the bound is
  taken from the state at each candidate; without it, once per window (and after each event): 1.5 times the
  largest intensity on a grid of 17 points of the window along the flow, and a candidate whose intensity exceeds
  its bound stops the simulation with an error (the draw would not be exact), so a result is always exact.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.func import vmap

from .data import D64, EventData, from_tick
from .likelihood import flow
from .models import AdditiveModel, EventModel, ExponentialHawkes, GeneralModel, check_additive

GRID = 16  # pieces of the window on which a model without ``bound`` is bounded

Marks = Callable[[np.random.Generator, int], Any] | None
Path = tuple[np.ndarray, np.ndarray, list[np.ndarray]]


def _pick(u: float, rates: list[float]) -> int:
    """The type of an accepted candidate from a uniform u: the first k with u < cdf_k, cdf the cumulative
    lambda / sum lambda (numpy's ``Generator.choice(K, p=...)`` on the same uniform)."""
    total = sum(rates)
    cdf = list(itertools.accumulate(r / total for r in rates))
    return next((k for k, c in enumerate(cdf) if u < c / cdf[-1]), len(rates) - 1)


def _mark(rng: np.random.Generator, marks: Marks, kind: int) -> np.ndarray:
    return np.asarray(marks(rng, kind) if marks is not None else [], dtype=np.float64)


class _Kernel(NamedTuple):
    """An exponential-kernel model's numbers at theta as Python floats: ``decays`` b_u (U,), ``excite[u][k][i]``
    = weights_iuk b_u (an event of type k's effect on E_iu), ``total[u][k]`` = sum_i excite[u][k][i],
    ``baseline[p][i]`` (P, K), ``base_total[p]`` its row sums, ``ceiling`` = sum_i max_p baseline_ip, ``knots``."""

    decays: list[float]
    excite: list[list[list[float]]]
    total: list[list[float]]
    baseline: list[list[float]]
    base_total: list[float]
    ceiling: float
    knots: list[float]


def _kernel_numbers(model: ExponentialHawkes, theta: Any) -> _Kernel:
    kernel = model.kernel
    decays = kernel.decays(theta).reshape(-1)
    excite = (kernel.weights(theta) * decays[None, :, None]).permute(1, 2, 0)  # (U, K, K): [u][k][i]
    baseline = kernel.baseline(theta).reshape(model.type_count, -1)
    return _Kernel(
        decays=decays.tolist(),
        excite=excite.tolist(),
        total=excite.sum(2).tolist(),
        baseline=baseline.T.tolist(),
        base_total=baseline.sum(0).tolist(),
        ceiling=float(baseline.max(1).values.sum()),
        knots=list(kernel.knots),
    )


def _hawkes_path(
    model: ExponentialHawkes,
    theta: Any,
    start: float,
    end: float,
    rng: np.random.Generator,
    marks: Marks,
    window: float,
    limit: int,
) -> Path:
    numbers = _kernel_numbers(model, theta)
    b, knots, size_of = numbers.decays, numbers.knots, model.kernel.jump_size
    units, types = len(b), model.type_count
    current = [0.0] * units  # T_u at t
    excitation = [[0.0] * units for _ in range(types)]  # E_iu at ``anchor``, the last event
    t, anchor = start, start
    times: list[float] = []
    kinds: list[int] = []
    values: list[np.ndarray] = []
    while t < end:
        span = min(window, end - t)
        bound = numbers.ceiling + sum(current)
        wait = (1 / bound) * rng.standard_exponential() if bound > 0 else math.inf
        step = span if wait >= span else wait
        current = [value * math.exp(-rate * step) for value, rate in zip(current, b, strict=True)]
        t = t + step
        if wait >= span:
            continue
        piece = bisect.bisect_right(knots, t)
        if rng.random() * bound >= numbers.base_total[piece] + sum(current):
            continue
        fade = [math.exp(-rate * (t - anchor)) for rate in b]
        excitation = [[e * f for e, f in zip(row, fade, strict=True)] for row in excitation]
        anchor = t
        rates = [base + sum(row) for base, row in zip(numbers.baseline[piece], excitation, strict=True)]
        kind = _pick(rng.random(), rates)
        mark = _mark(rng, marks, kind)
        size = 1.0 if size_of is None else float(size_of(theta, torch.as_tensor(mark, dtype=D64)))
        for u in range(units):
            current[u] += size * numbers.total[u][kind]
            for i in range(types):
                excitation[i][u] += size * numbers.excite[u][kind][i]
        times.append(t)
        kinds.append(kind)
        values.append(mark)
        if len(times) > limit:
            raise RuntimeError(f"more than max_events = {limit} events: the process may be explosive")
    return np.asarray(times), np.asarray(kinds, dtype=np.int64), values


def _flow_of(model: AdditiveModel | GeneralModel, theta: Any) -> Callable[[torch.Tensor, float], torch.Tensor]:
    """(y (d,), span) -> Y after ``span`` with no events: the closed-form decay, or the likelihood's own RK4
    (``likelihood.flow``), or constant."""
    if model.decay is not None:
        negative = -model.decay(theta)
        return lambda y, span: y * torch.exp(negative * span)
    if isinstance(model, GeneralModel) and model.drift is not None:

        def integrate(y: torch.Tensor, span: float) -> torch.Tensor:
            if span <= 0:
                return y
            steps = max(1, math.ceil(span / model.step))
            return flow(model, theta, y[None], torch.full((1,), span, dtype=y.dtype), steps)[0]

        return integrate
    return lambda y, span: y


def _grid_bound(model: EventModel, theta: Any, moved: Callable, y: torch.Tensor, span: float) -> float:
    """1.5 times the largest intensity of each type on GRID + 1 points of [0, span] along the flow from y, summed:
    the states by the flow (RK4 pieces in turn; the closed-form decay at once), the rates by one batched call."""
    h = span / GRID
    if isinstance(model, AdditiveModel | GeneralModel) and model.decay is not None:
        decay = model.decay(theta)
        offsets = h * torch.arange(GRID + 1, dtype=y.dtype)
        states = y * torch.exp(-offsets[:, None] * decay)
    else:
        path = [y]
        for _ in range(GRID):
            path.append(moved(path[-1], h))
        states = torch.stack(path)
    rates = vmap(model.rate, in_dims=(None, 0))(theta, states)
    return float(1.5 * rates.max(0).values.sum())


def _general_path(
    model: AdditiveModel | GeneralModel,
    theta: Any,
    start: float,
    end: float,
    rng: np.random.Generator,
    marks: Marks,
    window: float,
    limit: int,
) -> Path:
    moved = _flow_of(model, theta)
    given = model.bound
    y, t = torch.zeros(model.state_size, dtype=D64), start
    horizon, bound, fresh = t, 0.0, True
    labels = [torch.tensor(k) for k in range(model.type_count)]
    times: list[float] = []
    kinds: list[int] = []
    values: list[np.ndarray] = []
    while t < end:
        if given is not None or fresh or t >= horizon:
            span = min(window, end - t)
            bound = (
                sum(given(theta, y, span).tolist()) if given is not None else _grid_bound(model, theta, moved, y, span)
            )
            horizon, fresh = t + span, False
        else:
            span = horizon - t
        wait = (1 / bound) * rng.standard_exponential() if bound > 0 else math.inf
        if wait >= span:
            y, t = moved(y, span), horizon
            continue
        y, t = moved(y, wait), t + wait
        rates = model.rate(theta, y).tolist()
        total = sum(rates)
        if total > bound * (1 + 1e-9):
            raise RuntimeError(
                f"the intensity {total:g} at t = {t:g} exceeds its bound {bound:g}: give the model a bound= "
                "(intensity_model(..., bound=...)) or a shorter window"
            )
        if rng.random() * bound >= total:
            continue
        kind = _pick(rng.random(), rates)
        mark = _mark(rng, marks, kind)
        y, fresh = y + model.jump(theta, y, labels[kind], torch.from_numpy(mark)), True
        times.append(t)
        kinds.append(kind)
        values.append(mark)
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
    a Bernoulli side ``lambda rng, k: [rng.integers(2)]``). The draw runs in float64 on the CPU (a loop per
    candidate); the events come in the dtype and on the device of theta's tensors (float64 on the CPU for
    numbers)."""
    if not (np.isfinite(end_time) and end_time > 0):
        raise ValueError(f"end_time must be a positive number, got {end_time!r}")
    dtype, device = _kind(theta)
    theta = {
        name: value.to(dtype=D64, device="cpu")
        if isinstance(value, torch.Tensor)
        else torch.as_tensor(value, dtype=D64)
        for name, value in theta.items()
    }
    if isinstance(model, AdditiveModel):
        width = np.asarray(marks(np.random.default_rng(seed), 0) if marks is not None else []).size
        check_additive(model, theta, width)
    rng = np.random.default_rng(seed)
    path = _hawkes_path if isinstance(model, ExponentialHawkes) else _general_path
    with torch.no_grad():
        paths = [
            path(model, theta, 0.0, float(end_time), rng, marks, float(window), max_events)  # type: ignore[arg-type]
            for _ in range(realizations)
        ]
    data = from_tick(
        [[times[kinds == k] for k in range(model.type_count)] for times, kinds, _ in paths], end_time=end_time
    )
    q = max((len(v[0]) for _, _, v in paths if v), default=0)
    if q:
        out = torch.zeros((*data.times.shape, q), dtype=D64)
        for r, (times, _, values) in enumerate(paths):  # drawn times increase strictly: the marks are in time order
            out[r, : len(times)] = torch.as_tensor(np.asarray(values))
        data = data._replace(marks=out)
    return data.to(device, dtype)


def _kind(theta: dict[str, Any]) -> tuple[torch.dtype, Any]:
    """The dtype and device of theta's floating tensors (float64 on the CPU if none): the events' own."""
    kinds = {(v.dtype, v.device) for v in theta.values() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    if len(kinds) > 1:
        found = sorted(f"{dtype} on {device}" for dtype, device in kinds)
        raise ValueError(f"theta mixes {found}: give every parameter in one dtype on one device")
    return next(iter(kinds), (D64, None))


__all__ = ["simulate"]
