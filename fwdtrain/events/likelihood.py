"""The exact log-likelihood of events under an ``EventModel``, with no time grid.

    log L(theta) = sum_i log lambda_{k_i}(theta, Y(t_i-))  -  int_start^end sum_k lambda_k(theta, Y(t)) dt

An engine walks the events in chunks, carrying the state (``Carry``) from chunk to chunk; each chunk returns
log lambda_{k_i}(t_i-) (R, b) and the compensator of each type over the interval that ends at each event
(R, b, K), and ``tail`` the compensator from the last event to the window's end. One engine per model kind:

- ``ExponentialHawkes``: the state S is the exponential sums, computed for a whole chunk at once (``expsums``);
  the compensator is exact, int beta S dt = S(after the previous event) - S(t_i-);
- ``AdditiveModel``: Y(t_i-) is a linear recursion, scanned over a chunk; each interval's compensator by
  8-point Gauss-Legendre on pieces of at most ``model.step``, all intervals at once;
- ``GeneralModel``: the states after the events solved for the whole chunk by Newton's method on the
  recursion (``recursion``: no Python per event), Y in closed form between events for a ``decay``
  (Gauss-Legendre as above), else by RK4 steps of at most ``model.step`` on (Y, Lambda); its gradient and
  Hessian by the adjoint of the recursion (``general_derivatives``).

At tied times the intensity is the left limit of the tie: an event does not see the jumps of events at its own time.
Everything is a pure torch function of theta, so torch.func gives the gradient (forward mode carries dY/dtheta
along the events) and the observed information.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.func import vmap

from .. import _compat
from . import recursion
from .data import EventData, ties
from .expsums import exponential_sum_jets, exponential_sums, linear_scan
from .models import (
    AdditiveModel,
    EventModel,
    ExponentialHawkes,
    GeneralModel,
    check_additive,
    season_exposure,
    season_pieces,
)

_NODES, _WEIGHTS = (torch.from_numpy(a) for a in np.polynomial.legendre.leggauss(8))


class Piece(NamedTuple):
    """Events b of a chunk, for all realizations: their data and what the engines precompute from them."""

    times: torch.Tensor  # (R, b)
    types: torch.Tensor  # (R, b)
    marks: torch.Tensor  # (R, b, q)
    mask: torch.Tensor  # (R, b)
    earlier: torch.Tensor  # (R, b, K) earlier events at the same time, by type
    tied: torch.Tensor  # (R, b) the event's time equals the previous event's
    substeps: tuple[int, ...]  # integration pieces of each interval (the sequential engine)


class Carry(NamedTuple):
    """What a chunk hands to the next: the state (a tuple of tensors that depend on theta) and its time (R,)."""

    state: tuple[torch.Tensor, ...]
    time: torch.Tensor


class Prepared(NamedTuple):
    """The data of a fit, checked against the model, with the engines' precomputed columns."""

    data: EventData
    piece: Piece  # all events
    tail_substeps: int


def prepare(model: EventModel, data: EventData) -> Prepared:
    """Check that ``data`` fits ``model`` (an ``AdditiveModel``'s jump at its start theta: ``check_additive``)
    and precompute the ties and integration pieces."""
    if not isinstance(model, ExponentialHawkes | AdditiveModel | GeneralModel):
        raise TypeError(f"a model must be an ExponentialHawkes, AdditiveModel or GeneralModel, got {type(model)}")
    if data.dimension > model.type_count:
        raise ValueError(
            f"the events have {data.dimension} types (0..{data.dimension - 1}) but the model has "
            f"{model.type_count}: build the model with more types or relabel the events"
        )
    if data.dimension < model.type_count:
        data = data._replace(dimension=model.type_count)
    if isinstance(model, AdditiveModel):
        check_additive(model, model.start(data), data.marks.shape[-1])
    times = data.times
    previous = torch.cat([data.start[:, None], times[:, :-1]], 1)
    gaps = (times - previous).max(0).values
    pieces: tuple[int, ...] = ()
    if isinstance(model, ExponentialHawkes):
        tail = 1
    else:
        step = float(model.step)
        pieces = tuple(max(1, math.ceil(float(g) / step)) for g in gaps)
        tail = max(1, math.ceil(float((data.end - times[:, -1]).max()) / step))
    tied = torch.zeros_like(data.mask)
    tied[:, 1:] = times[:, 1:] == times[:, :-1]
    piece = Piece(times, data.types, data.marks, data.mask, ties(data), tied, pieces)
    return Prepared(data, piece, tail)


def pieces(prepared: Prepared, size: int) -> Iterator[Piece]:
    """The chunks of at most ``size`` events."""
    whole = prepared.piece
    n = whole.times.shape[1]
    for a in range(0, n, size):
        b = min(a + size, n)
        yield Piece(
            whole.times[:, a:b],
            whole.types[:, a:b],
            whole.marks[:, a:b],
            whole.mask[:, a:b],
            whole.earlier[:, a:b],
            whole.tied[:, a:b],
            whole.substeps[a:b] if whole.substeps else (),
        )


def init(model: EventModel, theta: Any, data: EventData) -> Carry:
    """The state at the windows' starts: 0 (Y(start) = 0 for every model)."""
    y = data.times.new_zeros((data.realizations, model.state_size))
    if isinstance(model, ExponentialHawkes):  # the sums after the last event, and the strict sums it saw
        decays = model.kernel.decays(theta)
        shape = (data.realizations, decays.shape[0], model.type_count)
        zero = y.reshape(shape) * decays.new_zeros(())
        return Carry((zero, zero), data.start)
    return Carry((y, y), data.start)


def chunk(model: EventModel, theta: Any, carry: Carry, piece: Piece) -> tuple[Carry, torch.Tensor, torch.Tensor]:
    """(the carry after the chunk, log lambda_{k_i}(t_i-) (R, b) (0 on padding), compensators (R, b, K))."""
    if isinstance(model, ExponentialHawkes):
        return _exponential_chunk(model, theta, carry, piece)
    if isinstance(model, AdditiveModel):
        return _additive_chunk(model, theta, carry, piece)
    assert isinstance(model, GeneralModel)
    return _general_chunk(model, theta, carry, piece)


def tail(model: EventModel, theta: Any, carry: Carry, end: torch.Tensor, substeps: int) -> torch.Tensor:
    """The compensator (R, K) from the carry's time to ``end`` (R,), with no events."""
    if isinstance(model, ExponentialHawkes):
        kernel = model.kernel
        decays = kernel.decays(theta)
        gap = end - carry.time
        fade = 1 - torch.exp(-gap[:, None] * decays)  # (R, U)
        excess = torch.einsum("iuj,ruj->ri", kernel.weights(theta), carry.state[0] * fade[..., None])
        exposure = season_exposure(kernel.knots, end) - season_exposure(kernel.knots, carry.time)  # (R, P)
        return exposure @ kernel.baseline(theta).T + excess
    assert isinstance(model, AdditiveModel | GeneralModel)
    _, compensator = _advance(model, theta, carry.state[0], end - carry.time, substeps)
    return compensator


def _exponential_jumps(model: ExponentialHawkes, theta: Any, piece: Piece) -> torch.Tensor:
    """Each event's jump in the sums of its type (R, b, K): one, or ``jump_size`` of its mark; 0 on padding."""
    onehot = torch.nn.functional.one_hot(piece.types, model.type_count).to(piece.times.dtype) * piece.mask[..., None]
    size = model.kernel.jump_size
    if size is None:
        return onehot
    return onehot * torch.where(piece.mask, size(theta, piece.marks), 0.0)[..., None]


def _exponential_chunk(model: ExponentialHawkes, theta: Any, carry: Carry, piece: Piece):
    """The sums before each event by one scan (``expsums``), the strict sums of each event (those of its tie's
    first event: ``_left_limits``), then the rates and the exact compensators."""
    jumps = _exponential_jumps(model, theta, piece)
    sums, last = exponential_sums(model.kernel.decays(theta), piece.times, jumps, carry.time, carry.state[0])
    r, b = piece.times.shape
    strict = _left_limits(sums.reshape(r, b, -1), piece, carry.state[1].reshape(r, -1)).reshape(sums.shape)
    log_rate, compensator = _exponential_terms(model, theta, piece, carry, sums, strict, jumps)
    return Carry((last, strict[:, -1]), piece.times[:, -1]), log_rate, compensator


def _exponential_terms(
    model: ExponentialHawkes,
    theta: Any,
    piece: Piece,
    carry: Carry,
    sums: torch.Tensor,
    strict: torch.Tensor,
    jumps: torch.Tensor,
):
    """log lambda_{k_i}(t_i-) and the compensators of a chunk from its exponential sums before each event and the
    strict ones (R, b, U, K), and the jumps (R, b, K). The baseline integrates through ``season_exposure``."""
    kernel = model.kernel
    decays, weights, baseline = kernel.decays(theta), kernel.weights(theta), kernel.baseline(theta)
    r, b = piece.times.shape
    coefficients = (weights * decays[:, None]).reshape(model.type_count, -1)  # (K, U K)
    season = season_pieces(kernel.knots, piece.times) @ baseline.T  # (R, b, K)
    intensities = season + strict.reshape(r, b, -1) @ coefficients.T
    chosen = torch.gather(intensities, 2, piece.types[..., None])[..., 0]
    log_rate = _masked_log(chosen, piece.mask)
    after = torch.cat([carry.state[0][:, None], (sums + jumps[:, :, None, :])[:, :-1]], 1)
    exposure = season_exposure(kernel.knots, piece.times)
    exposure = exposure - torch.cat([season_exposure(kernel.knots, carry.time)[:, None], exposure[:, :-1]], 1)
    excess = (after - sums).reshape(r, b, -1) @ weights.reshape(model.type_count, -1).T
    return log_rate, exposure @ baseline.T + excess


class Jet(NamedTuple):
    """A tensor and its first two derivatives in the decays, each S_u depending on decay u alone."""

    value: torch.Tensor
    first: torch.Tensor
    second: torch.Tensor

    def at(self, shift: torch.Tensor) -> torch.Tensor:
        """The second-order Taylor polynomial at decays0 + shift (U,), for tensors (..., U, K): exact value,
        gradient and Hessian at shift = 0."""
        d = shift[:, None]
        return self.value + self.first * d + self.second * d * d / 2


class KernelJets(NamedTuple):
    """What log L of an exponential-kernel model needs, as jets in the decays at ``decays``: the features of
    the real events (N, P + 3 U K) = (the event's piece of the day one-hot (P,), then S, dS/db_u, d^2S/db_u^2 of
    the strict sums, (u, j, order) flattened), their types one-hot (N, K), the sums after each realization's
    last event (R, U, K), the time from that event to the end (R,), the counts of each type (K,) and the
    observed time in each piece of the day (P,) (``season_exposure``)."""

    decays: torch.Tensor
    features: torch.Tensor
    onehot: torch.Tensor
    last: Jet
    remaining: torch.Tensor
    counts: torch.Tensor
    exposure: torch.Tensor


def kernel_jets(model: ExponentialHawkes, decays: torch.Tensor, prepared: Prepared, size: int = 1 << 15) -> KernelJets:
    """The jets of an exponential-kernel model at ``decays`` (see ``KernelJets``): the sums' derivatives in the
    decays (``expsums.exponential_sum_jets``), carried along the events chunk to chunk. Only for jumps that do
    not depend on theta (``ExponentialHawkes.jets``)."""
    if not model.jets:
        raise ValueError("kernel_jets needs jumps that do not depend on theta: a mark-scaled model has no jets")
    data = prepared.data
    knots = model.kernel.knots
    k = model.type_count
    carry: tuple[torch.Tensor, ...] = tuple(
        data.times.new_zeros((data.realizations, decays.shape[0], k)) for _ in range(3)
    )
    time = data.start
    strict = []
    for piece in pieces(prepared, size):
        onehot = torch.nn.functional.one_hot(piece.types, k).to(data.dtype) * piece.mask[..., None]
        sums, carry = exponential_sum_jets(decays, piece.times, onehot, time, carry)
        earlier = piece.earlier[:, :, None, :]
        strict.append(torch.stack([sums[0] - earlier, sums[1], sums[2]], -1)[piece.mask])
        time = piece.times[:, -1]
    joined = torch.cat(strict)
    season = season_pieces(knots, data.times[data.mask])
    features = torch.cat([season, joined.reshape(joined.shape[0], -1)], 1)
    return KernelJets(
        decays=decays,
        features=features,
        onehot=torch.nn.functional.one_hot(data.types[data.mask], k).to(data.dtype),
        last=Jet(*carry),
        remaining=data.end - time,
        counts=data.counts().sum(0),
        exposure=(season_exposure(knots, data.end) - season_exposure(knots, data.start)).sum(0),
    )


def _jet_table(model: ExponentialHawkes, theta: Any, jets: KernelJets) -> tuple[torch.Tensor, torch.Tensor]:
    """(the coefficients (K, F) with lambda_i = features_i . table_{k_i}, the compensator (0-d)) at theta, the
    sums replaced by their jets. The compensator telescopes: int beta_u S_uj dt over [start, end] = N_j -
    S_uj(end); the baseline's is its pieces times their observed time."""
    kernel = model.kernel
    decays, weights, baseline = kernel.decays(theta), kernel.weights(theta), kernel.baseline(theta)
    shift = decays - jets.decays
    powers = torch.stack([torch.ones_like(shift), shift, shift * shift / 2], -1)  # (U, 3)
    coefficients = ((weights * decays[:, None])[..., None] * powers[:, None, :]).reshape(model.type_count, -1)
    at_end = (jets.last.at(shift) * torch.exp(-jets.remaining[:, None] * decays)[..., None]).sum(0)  # (U, K)
    compensator = (baseline.sum(0) * jets.exposure).sum() + (weights * (jets.counts - at_end)).sum()
    return torch.cat([baseline, coefficients], 1), compensator


def jet_log_likelihood(model: ExponentialHawkes, theta: Any, jets: KernelJets) -> torch.Tensor:
    """log L(theta) with the exponential sums replaced by their jets: equal to log L, with its gradient and
    Hessian, at a theta whose decays are ``jets.decays``."""
    table, compensator = _jet_table(model, theta, jets)
    intensities = ((jets.features @ table.T) * jets.onehot).sum(1)
    return torch.log(intensities).sum() - compensator


def type_columns(rows: torch.Tensor, types: torch.Tensor, count: int) -> tuple[torch.Tensor, ...]:
    """The rows (N, F) of each type's events, as columns (F, N_k), k = 0..count-1."""
    order = torch.argsort(types, stable=True)
    columns = rows[order].T.contiguous()
    return tuple(torch.split(columns, torch.bincount(types, minlength=count).tolist(), 1))


def type_sums(groups: tuple[torch.Tensor, ...], table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Phi = sum_i log(x_i . T_{k_i}), dPhi/dT (K, F), d^2 Phi / dT_k^2 (K, F, F)) of a table T (K, F), the
    features of each type's events as columns (F, N_k) (``type_columns``): d/dT_k = sum_{k_i = k} x_i / lambda_i,
    d^2/dT_k^2 = -sum x_i x_i' / lambda_i^2."""
    value = table.new_zeros(())
    slopes, curvatures = [], []
    for x, row in zip(groups, table, strict=True):
        rates = row @ x
        value = value + torch.log(rates).sum()
        scaled = x / rates
        slopes.append(scaled.sum(1))
        curvatures.append(-scaled @ scaled.T)
    return value, torch.stack(slopes), torch.stack(curvatures)


def jet_derivatives(
    model: ExponentialHawkes, jets: KernelJets, to_theta: Callable[[torch.Tensor], Any], u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log L, its gradient (p,), its Hessian (p, p)) in u at a u whose decays are ``jets.decays``, theta =
    ``to_theta(u)``. The events enter through Phi(T) = sum_i log(x_i . T_{k_i}) of the table T (K, F), whose
    derivatives are closed-form (``type_sums``), d Phi / d T_k = sum_{k_i = k} x_i / lambda_i and
    d^2 Phi / d T_k^2 = -sum_{k_i = k} x_i x_i^T / lambda_i^2 (one pass over the events, no tangents); u enters
    through the small map u -> (T, compensator), differentiated by torch.func (reverse over reverse) on the surrogate
    Phi(T0) + G . (T - T0) + (T - T0) H (T - T0) / 2 - compensator, equal to log L to second order at u."""
    table0, _ = _jet_table(model, to_theta(u), jets)
    logs, slope, curvature = type_sums(type_columns(jets.features, jets.onehot.argmax(1), model.type_count), table0)

    def surrogate(w: torch.Tensor) -> torch.Tensor:
        table, compensator = _jet_table(model, to_theta(w), jets)
        delta = table - table0
        return (slope * delta).sum() + 0.5 * torch.einsum("kf,kfg,kg->", delta, curvature, delta) - compensator

    gradient = torch.func.grad(surrogate)(u)
    hessian = torch.func.jacrev(torch.func.jacrev(surrogate))(u)  # reverse over reverse: the map is small
    value = logs - _jet_table(model, to_theta(u), jets)[1]
    return value, gradient, hessian


def _rates(model: EventModel, theta: Any, y: torch.Tensor) -> torch.Tensor:
    """lambda at states y (..., d) -> (..., K)."""
    flat = y.reshape(-1, y.shape[-1])
    return vmap(model.rate, in_dims=(None, 0))(theta, flat).reshape(*y.shape[:-1], model.type_count)


def _interval(
    model: AdditiveModel | GeneralModel,
    theta: Any,
    y: torch.Tensor,
    gap: torch.Tensor,
    substeps: torch.Tensor,
    most: int,
    compensate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(Y after ``gap`` (N,) from y (N, d) with no events, the compensator (N, K) over it, or None if not
    ``compensate``), each interval on its own ``substeps`` (N,) pieces (at most ``most``): the closed-form decay with
    8-point Gauss-Legendre on each piece (all pieces of all intervals gathered in one batch, summed back by
    interval), RK4 steps on (Y, Lambda), or (no flow) Y constant. All intervals at once."""
    decay = model.decay
    if decay is not None:
        rates_of_decay = decay(theta)
        moved = y * torch.exp(-gap[:, None] * rates_of_decay)
        if not compensate:
            return moved, None
        owner = torch.repeat_interleave(torch.arange(y.shape[0], device=y.device), substeps)  # each piece's interval
        first = torch.cumsum(substeps, 0) - substeps
        index = (torch.arange(owner.shape[0], device=y.device) - first[owner]).to(gap.dtype)  # its place in it
        count = substeps.to(gap.dtype)[owner]
        nodes, node_weights = (a.to(dtype=gap.dtype, device=gap.device) for a in (_NODES, _WEIGHTS))
        unit = (index[:, None] + (nodes + 1) / 2) / count[:, None]  # (P, Q)
        at = (gap[owner][:, None] * unit)[..., None]
        path = y[owner][:, None, :] * torch.exp(-at * rates_of_decay)  # (P, Q, d)
        weights = node_weights / (2 * count[:, None])
        per_piece = (_rates(model, theta, path) * weights[..., None]).sum(1) * gap[owner][:, None]  # (P, K)
        compensator = per_piece.new_zeros((y.shape[0], per_piece.shape[-1])).index_add(0, owner, per_piece)
        return moved, compensator
    assert isinstance(model, GeneralModel)
    if model.drift is None:
        return y, (_rates(model, theta, y) * gap[:, None]) if compensate else None
    drift = vmap(model.drift, in_dims=(None, 0))
    h = (gap / substeps.to(gap.dtype))[:, None]
    compensator = y.new_zeros((y.shape[0], model.type_count))
    for number in range(most):
        stages = [y]
        slopes = [drift(theta, y)]
        for fraction in (0.5, 0.5, 1.0):
            stages.append(y + fraction * h * slopes[-1])
            slopes.append(drift(theta, stages[-1]))
        active = (number < substeps)[:, None]
        y = torch.where(active, y + h / 6 * (slopes[0] + 2 * slopes[1] + 2 * slopes[2] + slopes[3]), y)
        if compensate:
            r = [_rates(model, theta, stage) for stage in stages]
            compensator = compensator + torch.where(active, h / 6 * (r[0] + 2 * r[1] + 2 * r[2] + r[3]), 0.0)
    return y, compensator if compensate else None


def flow(model: AdditiveModel | GeneralModel, theta: Any, y: torch.Tensor, gap: torch.Tensor, substeps: int):
    """Y (R, d) after ``gap`` (R,) with no events, on ``substeps`` pieces (RK4 steps for a drift)."""
    moved, _ = _interval(model, theta, y, gap, torch.full(gap.shape, substeps, device=gap.device), substeps, False)
    return moved


def _advance(model: AdditiveModel | GeneralModel, theta: Any, y: torch.Tensor, gap: torch.Tensor, substeps: int):
    """(Y after ``gap`` (R,) with no events, the compensator (R, K) over it), on ``substeps`` pieces."""
    moved, compensator = _interval(model, theta, y, gap, torch.full(gap.shape, substeps, device=gap.device), substeps)
    assert compensator is not None
    return moved, compensator


def _left_limits(before: torch.Tensor, piece: Piece, left0: torch.Tensor) -> torch.Tensor:
    """Y(t_i-) seen by each event (R, b, d): at a tie, the state before the tie's first event (``left0`` when the
    tie began in an earlier chunk)."""
    r, b = piece.times.shape
    group = torch.cummax(torch.where(piece.tied, 0, torch.arange(b, device=before.device).expand(r, b)), 1).values
    left = torch.gather(before, 1, group[..., None].expand(r, b, before.shape[-1]))
    return torch.where(piece.tied[:, :1, None] & (group[..., None] == 0), left0[:, None], left)


def _log_rates(model: EventModel, theta: Any, left: torch.Tensor, piece: Piece) -> torch.Tensor:
    rates = torch.gather(_rates(model, theta, left), 2, piece.types[..., None])[..., 0]
    return _masked_log(rates, piece.mask)


def _masked_log(rates: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log(rates) where mask, 0 at padding (the padded entries never reach the log, so no NaN gradient)."""
    return torch.where(mask, torch.log(torch.where(mask, rates, 1.0)), 0.0)


def _substeps(piece: Piece) -> tuple[torch.Tensor, int]:
    """Each interval's pieces (R, b) and the most of them."""
    r, b = piece.times.shape
    steps = torch.tensor(piece.substeps, dtype=torch.long, device=piece.times.device)
    return steps.expand(r, b), max(piece.substeps, default=1)


def _additive_chunk(model: AdditiveModel, theta: Any, carry: Carry, piece: Piece):
    """Jumps that do not depend on Y and a closed-form decay: Y(t_i-) = exp(-decay dt_i) (Y(t_{i-1}-) + J_{i-1})
    is a linear recursion, evaluated as a scan over the whole chunk; the compensators by ``_interval``."""
    y0, left0 = carry.state
    r, b = piece.times.shape
    decay = model.decay(theta)
    flat = piece.marks.reshape(r * b, -1)
    zeros = y0.new_zeros((r * b, model.state_size))
    jumps = vmap(model.jump, in_dims=(None, 0, 0, 0))(theta, zeros, piece.types.reshape(-1), flat)
    jumps = jumps.reshape(r, b, -1) * piece.mask[..., None].to(jumps.dtype)
    gaps = piece.times - torch.cat([carry.time[:, None], piece.times[:, :-1]], 1)  # (R, b)
    fades = torch.exp(-gaps[..., None] * decay)
    after = torch.cat([y0[:, None], jumps[:, :-1]], 1)  # what each interval starts from, beyond the decayed state
    before = linear_scan(fades, fades * after)  # Y(t_i-), in index order
    starts = torch.cat([y0[:, None], (before + jumps)[:, :-1]], 1)  # Y just after the previous event
    left = _left_limits(before, piece, left0)
    substeps, most = _substeps(piece)
    _, compensator = _interval(model, theta, starts.reshape(r * b, -1), gaps.reshape(-1), substeps.reshape(-1), most)
    assert compensator is not None
    end = before[:, -1] + jumps[:, -1]
    return (
        Carry((end, left[:, -1]), piece.times[:, -1]),
        _log_rates(model, theta, left, piece),
        compensator.reshape(r, b, -1),
    )


def _general_after(model: GeneralModel, theta: Any, columns: tuple, most: int) -> Callable[[torch.Tensor, slice], Any]:
    """after(previous, window): the states after the events of ``window`` (R, m, d) from the states after the
    events before them (R, m, d), x_i = flow(x_{i-1}) + jump(flow(x_{i-1})); ``columns`` (gaps, substeps, types,
    marks, mask) of the chunk (R, b, ...)."""

    def after(previous: torch.Tensor, window: slice) -> torch.Tensor:
        gap, steps, kinds, marks, mask = (column[:, window] for column in columns)
        rows, m = gap.shape
        flat = rows * m
        moved, _ = _interval(model, theta, previous.reshape(flat, -1), gap.reshape(-1), steps.reshape(-1), most, False)
        jumps = vmap(model.jump, in_dims=(None, 0, 0, 0))(theta, moved, kinds.reshape(-1), marks.reshape(flat, -1))
        return (moved + mask.reshape(flat, 1) * jumps).reshape(rows, m, -1)

    return after


def _general_columns(piece: Piece, time: torch.Tensor) -> tuple[tuple, int]:
    """((gaps, substeps, types, marks, mask) (R, b, ...), the most substeps) of a chunk that follows ``time`` (R,)."""
    gaps = piece.times - torch.cat([time[:, None], piece.times[:, :-1]], 1)
    substeps, most = _substeps(piece)
    return (gaps, substeps, piece.types, piece.marks, piece.mask[..., None].to(gaps.dtype)), most


def _general_terms(model: GeneralModel, theta: Any, carry: Carry, piece: Piece, path: torch.Tensor):
    """(the carry after the chunk, log lambda_{k_i}(t_i-), compensators) from the states after its events ``path``
    (R, b, d): Y(t_i-), the rates and the compensators of all intervals at once."""
    y0, left0 = carry.state
    r, b = piece.times.shape
    (gaps, substeps, *_), most = _general_columns(piece, carry.time)
    previous = torch.cat([y0[:, None], path[:, :-1]], 1).reshape(r * b, -1)
    before, compensator = _interval(model, theta, previous, gaps.reshape(-1), substeps.reshape(-1), most)
    assert compensator is not None
    left = _left_limits(before.reshape(r, b, -1), piece, left0)
    moved = Carry((path[:, -1], left[:, -1]), piece.times[:, -1])
    return moved, _log_rates(model, theta, left, piece), compensator.reshape(r, b, -1)


def _general_path(model: GeneralModel, theta: Any, carry: Carry, piece: Piece) -> torch.Tensor:
    """The states after the chunk's events (R, b, d), solved for the whole chunk at once by Newton's method
    (``recursion.solve``: no Python per event); ``recursion.settle`` where nothing is differentiated."""
    columns, most = _general_columns(piece, carry.time)
    numbers = {name: _compat.primal(value) for name, value in theta.items()}
    plain = _general_after(model, numbers, tuple(_compat.primal(c) for c in columns), most)
    n = piece.times.shape[1]
    leaves = (*theta.values(), carry.state[0], *columns)
    if not any(_compat.is_wrapped(v) or (isinstance(v, torch.Tensor) and v.requires_grad) for v in leaves):
        return recursion.settle(plain, _compat.primal(carry.state[0]), n)[0]
    return recursion.solve(_general_after(model, theta, columns, most), carry.state[0], n, plain)[0]


def _general_chunk(model: GeneralModel, theta: Any, carry: Carry, piece: Piece):
    """Any jump and flow: the states after the events (``_general_path``), then ``_general_terms``."""
    return _general_terms(model, theta, carry, piece, _general_path(model, theta, carry, piece))


def general_chunk_about(
    model: GeneralModel, to_theta: Callable[[torch.Tensor], Any], u: torch.Tensor, carry: Carry, piece: Piece
) -> Callable[[torch.Tensor, tuple], tuple[Carry, torch.Tensor, torch.Tensor]]:
    """chunk(model, to_theta(w), Carry(state, carry.time), piece) as a function of (w, state) with its value and
    first derivatives at (u, carry.state) (plain numbers): the path solved once on the plain numbers, moved by its
    sensitivities to u and to the start (the linear recursion x'_i = J_i x'_{i-1} + d after_i / du of
    ``recursion.derivatives``, scanned once with p + d columns), so forward mode (the online pass) differentiates
    no solve and no scan."""
    columns, most = _general_columns(piece, carry.time)
    every = slice(0, piece.times.shape[1])
    y0 = carry.state[0]
    path = _general_path(model, to_theta(u), carry, piece)
    previous = torch.cat([y0[:, None], path[:, :-1]], 1)
    after = lambda w, states: _general_after(model, to_theta(w), columns, most)(states, every)
    with torch.no_grad():
        _, jacobian = recursion.jacobians(lambda states: after(u, states), previous)  # (R, b, d, d)
        eye = torch.eye(u.numel(), dtype=u.dtype, device=u.device)
        direct = torch.func.vmap(lambda e: torch.func.jvp(lambda w: after(w, previous), (u,), (e,))[1])(eye)
        entering = torch.cat([jacobian[:, :1], torch.zeros_like(jacobian[:, 1:])], 1)  # the start, through J_0
        sensitivities = recursion.matrix_scan(jacobian, torch.cat([direct.permute(1, 2, 3, 0), entering], -1))
    p = u.numel()
    to_u, to_start = sensitivities[..., :p], sensitivities[..., p:]  # (R, b, d, p), (R, b, d, d)

    def linear(w: torch.Tensor, state: tuple) -> tuple[Carry, torch.Tensor, torch.Tensor]:
        moved = path + to_u @ (w - u) + (to_start @ (state[0] - y0)[:, None, :, None])[..., 0]
        return _general_terms(model, to_theta(w), Carry(state, carry.time), piece, moved)

    return linear


def general_derivatives(
    model: GeneralModel, prepared: Prepared, to_theta: Callable[[torch.Tensor], Any], u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log L, its gradient (p,), its Hessian (p, p)) in u, theta = ``to_theta(u)``, of a general model: the path
    on the plain numbers, then ``recursion.derivatives`` (forward sensitivities and the adjoint along the events,
    second derivatives of the one-event maps only)."""
    piece = prepared.piece
    carry = init(model, to_theta(u), prepared.data)
    path = _general_path(model, to_theta(u), carry, piece)
    columns, most = _general_columns(piece, carry.time)
    every = slice(0, piece.times.shape[1])

    def objective(w: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        theta = to_theta(w)
        moved, log_rate, compensator = _general_terms(model, theta, carry, piece, states)
        rest = tail(model, theta, moved, prepared.data.end, prepared.tail_substeps)
        return log_rate.sum() - compensator.sum() - rest.sum()

    after = lambda w, previous: _general_after(model, to_theta(w), columns, most)(previous, every)
    return recursion.derivatives(after, objective, carry.state[0], path, u)


class Pass(NamedTuple):
    """One pass over the data: log L, log lambda at the events (R, n), compensators (R, n, K), the tail (R, K)."""

    log_likelihood: torch.Tensor
    log_rates: torch.Tensor
    compensators: torch.Tensor
    tail: torch.Tensor


def forward(model: EventModel, theta: Any, prepared: Prepared, size: int = 1 << 15) -> Pass:
    """The whole pass at a fixed theta, in chunks of ``size`` events for exponential kernels and ``size / 8`` for
    the additive-jump scan (their memory bounds); the event loop takes all events at once."""
    carry = init(model, theta, prepared.data)
    log_rates, compensators = [], []
    n = prepared.piece.times.shape[1]
    length = {ExponentialHawkes: size, AdditiveModel: size // 8, GeneralModel: n}[type(model)]
    for piece in pieces(prepared, length):
        carry, log_rate, compensator = chunk(model, theta, carry, piece)
        log_rates.append(log_rate)
        compensators.append(compensator)
    rest = tail(model, theta, carry, prepared.data.end, prepared.tail_substeps)
    log_rate, compensator = torch.cat(log_rates, 1), torch.cat(compensators, 1)
    total = log_rate.sum() - compensator.sum() - rest.sum()
    return Pass(total, log_rate, compensator, rest)


def log_likelihood(model: EventModel, theta: Any, events: Prepared | EventData) -> torch.Tensor:
    """log L(theta), summed over realizations (0-d), on ``events`` (``EventData``, or ``prepare``'s result)."""
    prepared = events if isinstance(events, Prepared) else prepare(model, events)
    return forward(model, theta, prepared).log_likelihood


__all__ = [
    "Carry",
    "Jet",
    "KernelJets",
    "Pass",
    "Piece",
    "Prepared",
    "chunk",
    "flow",
    "forward",
    "general_chunk_about",
    "general_derivatives",
    "init",
    "jet_derivatives",
    "jet_log_likelihood",
    "kernel_jets",
    "log_likelihood",
    "pieces",
    "prepare",
    "tail",
    "type_columns",
    "type_sums",
]
