"""Models of K event types driven by a state Y (d,) that the events move, one class per kind.

Between events Y flows, at an event of type k with mark z it jumps, Y(t_i) = Y(t_i-) + jump(theta, Y(t_i-), k, z),
and the intensities are lambda(theta, Y(t-)) (K,). theta is a dict of tensors in natural units; each parameter has
a shape and is ``positive``, ``nonnegative`` or real, and the fits move u (log of the positive ones, the others as
they are; ``pack``/``unpack``).

- ``ExponentialHawkes`` (``hawkes``): tick's exponential Hawkes process,

      lambda_i(t) = mu_i + sum_j alpha_ij beta exp(-beta (t - t_m)) summed over past type-j events t_m,

  with the state S_uj = sum over past type-j events of exp(-beta_u (t - t_m)); ``decay="row"`` gives one beta_i
  per row, ``decays=(b_1, ..., b_U)`` sum-of-exponential kernels phi_ij = sum_u alpha_iju b_u exp(-b_u t) (the
  b_u fixed, or fitted with ``fit_decays=True``). Its ``ExponentialKernel`` is the vectorised exact engine.
- ``AdditiveModel``: dY = -decay(theta) Y dt and jumps that do not depend on Y (``order_book``, and
  ``intensity_model(..., decay=..., additive=True)``): the state is a linear recursion, scanned over the events.
- ``GeneralModel``: any rate, a jump that may depend on Y, and dY = drift(theta, Y) dt (or a closed-form decay,
  or none): the event-by-event engine.

K is ``type_count`` (an event's type is a label in 0..K-1) and d is ``state_size``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from .data import D64, EventData, as_parameter


class Parameter(NamedTuple):
    """A parameter's shape and its domain: real, ``positive`` (> 0, fitted through its logarithm) or
    ``nonnegative`` (>= 0, fitted in natural units with a bound at 0, where its MLE may sit exactly)."""

    shape: tuple[int, ...]
    positive: bool = False
    nonnegative: bool = False


class ExponentialKernel(NamedTuple):
    """lambda_i(t) = baseline_ip(t) + sum_{u, j} weights_iuj decays_u S_uj, S_uj the exponential sums of decay u
    over past type-j events, each event's jump ``jump_size(theta, z)`` of its mark z (None: 1), p(t) the piece of
    the day that holds t (``knots`` c_1 < ... < c_{P-1} on the events' clock: piece p is [c_p, c_{p+1})):
    ``decays(theta) -> (U,)``, ``weights(theta) -> (K, U, K)``, ``baseline(theta) -> (K, P)``,
    ``jump_size(theta, z (..., q)) -> (...)``."""

    decays: Callable[[Any], torch.Tensor]
    weights: Callable[[Any], torch.Tensor]
    baseline: Callable[[Any], torch.Tensor]
    knots: tuple[float, ...] = ()
    jump_size: Callable[[Any, torch.Tensor], torch.Tensor] | None = None


def season_pieces(knots: tuple[float, ...], times: torch.Tensor) -> torch.Tensor:
    """The piece of the day of each time, one-hot (..., P): piece p holds [c_p, c_{p+1}) (c_0 = -inf, c_P = inf)."""
    edges = torch.tensor(knots, dtype=times.dtype, device=times.device)
    index = torch.searchsorted(edges, times.contiguous(), right=True)
    return torch.nn.functional.one_hot(index, len(knots) + 1).to(times.dtype)


def season_exposure(knots: tuple[float, ...], times: torch.Tensor) -> torch.Tensor:
    """E(t) (..., P) with int_a^b baseline_p(t) dt = baseline . (E(b) - E(a)): E_0 = min(t, c_1), E_p = the time
    spent in [c_p, c_{p+1}) after c_p up to t, the last E_{P-1} = max(t - c_{P-1}, 0) (no knots: E = t)."""
    if not knots:
        return times[..., None]
    edges = torch.tensor(knots, dtype=times.dtype, device=times.device)
    widths = torch.cat([torch.diff(edges), edges.new_tensor([math.inf])])
    later = torch.minimum((times[..., None] - edges).clamp(min=0), widths)
    return torch.cat([torch.minimum(times, edges[0])[..., None], later], -1)


Rate = Callable[[Any, torch.Tensor], torch.Tensor]
Jump = Callable[[Any, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Bound = Callable[[Any, torch.Tensor, float], torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class EventModel:
    """What every kind has: K = ``type_count`` event types, a state of ``state_size`` d, ``rate(theta, y) -> (K,)``,
    ``jump(theta, y, k, z) -> (d,)``, the ``parameters``, ``start(data) -> theta`` (a default start) and
    ``bound(theta, y, horizon) -> (K,)`` (bounds of the intensities over ``horizon``, for ``simulate``; None: a
    grid along the flow). Build one of the kinds (``ExponentialHawkes``, ``AdditiveModel``, ``GeneralModel``)."""

    type_count: int
    state_size: int
    rate: Rate
    jump: Jump
    parameters: dict[str, Parameter]
    start: Callable[[EventData], dict[str, torch.Tensor]]
    bound: Bound | None = None

    def __post_init__(self) -> None:
        if type(self) is EventModel:
            raise TypeError("EventModel is abstract: build ExponentialHawkes, AdditiveModel or GeneralModel")
        if self.type_count < 1 or self.state_size < 0:
            raise ValueError(f"type_count must be >= 1 and state_size >= 0, got {self.type_count}, {self.state_size}")

    @property
    def types(self) -> int:
        """K under its 0.5 name (``EventData.types`` holds the labels): use ``type_count``."""
        warnings.warn("EventModel.types is now EventModel.type_count", DeprecationWarning, stacklevel=2)
        return self.type_count

    @property
    def dimension(self) -> int:
        """d under its 0.5 name (``hawkes(dimension=K)`` counts types): use ``state_size``."""
        warnings.warn("EventModel.dimension is now EventModel.state_size", DeprecationWarning, stacklevel=2)
        return self.state_size


@dataclass(frozen=True, kw_only=True)
class ExponentialHawkes(EventModel):
    """Exponential kernels (see the module's docstring): lambda from ``kernel``, the state S (U K,) the exponential
    sums, decaying at kernel.decays(theta) (U,) and jumping by one at its type's entries."""

    kernel: ExponentialKernel

    @property
    def jets(self) -> bool:
        """Whether the closed-form jets in the decays give the derivatives (``likelihood.kernel_jets``): the jumps
        do not depend on theta (no ``mark_scaling``)."""
        return self.kernel.jump_size is None

    def decay(self, theta: Any) -> torch.Tensor:
        """The state's decay rates (U K,), u major."""
        return self.kernel.decays(theta).repeat_interleave(self.type_count)

    def general(self, step: float) -> GeneralModel:
        """The same model for the event-by-event engine (a check of the scan), Gauss-Legendre on pieces of ``step``."""
        return GeneralModel(**_common(self), decay=self.decay, step=step)


@dataclass(frozen=True, kw_only=True)
class AdditiveModel(EventModel):
    """dY = -decay(theta) Y dt, jumps that do not depend on Y: the vectorised engine (a scan over the events),
    the compensator by Gauss-Legendre on pieces of at most ``step``."""

    decay: Callable[[Any], torch.Tensor]
    step: float = 0.1

    def general(self, step: float | None = None) -> GeneralModel:
        """The same model for the event-by-event engine (a check of the scan)."""
        return GeneralModel(**_common(self), decay=self.decay, step=self.step if step is None else step)


@dataclass(frozen=True, kw_only=True)
class GeneralModel(EventModel):
    """Any rate and jump; between events Y moves by ``drift(theta, y) -> (d,)`` (RK4 steps of at most ``step``),
    or by the closed form dY = -decay(theta) Y dt, or (neither) stays constant. The event-by-event engine."""

    drift: Callable[[Any, torch.Tensor], torch.Tensor] | None = None
    decay: Callable[[Any], torch.Tensor] | None = None
    step: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.drift is not None and self.decay is not None:
            raise ValueError("give drift= or decay=, not both (decay is the closed-form flow dY = -decay * Y)")


def _common(model: EventModel) -> dict[str, Any]:
    return {field.name: getattr(model, field.name) for field in dataclasses.fields(EventModel)}


def pack(model: EventModel, theta: dict[str, Any], events: torch.Tensor | None = None) -> torch.Tensor:
    """The vector u (p,) of theta (log of the positive parameters; the nonnegative ones keep their bound at 0),
    beside ``events`` (their times: numbers in the events' dtype and device, other tensors refused; None: numbers
    in float64, tensors as they are)."""
    pieces = []
    for name, spec in model.parameters.items():
        if name not in theta:
            raise KeyError(f"theta has no {name!r}; the model's parameters are {list(model.parameters)}")
        value = as_parameter(theta[name], f"theta[{name!r}]", events)
        if tuple(value.shape) != spec.shape:
            raise ValueError(f"theta[{name!r}] must have shape {spec.shape}, got {tuple(value.shape)}")
        if spec.positive and spec.nonnegative:
            raise ValueError(f"parameter {name!r} is declared positive and nonnegative: choose one")
        if spec.positive and not bool((value > 0).all()):
            raise ValueError(f"theta[{name!r}] must be > 0, got {value.tolist()}")
        if spec.nonnegative and not bool((value >= 0).all()):
            raise ValueError(f"theta[{name!r}] must be >= 0, got {value.tolist()}")
        pieces.append((torch.log(value) if spec.positive else value).reshape(-1))
    return torch.cat(pieces)


def unpack(model: EventModel, u: torch.Tensor) -> dict[str, torch.Tensor]:
    """theta in natural units from u (p,): the inverse of ``pack``."""
    out, start = {}, 0
    for name, spec in model.parameters.items():
        size = math.prod(spec.shape)
        piece = u[start : start + size].reshape(spec.shape)
        out[name] = torch.exp(piece) if spec.positive else piece
        start += size
    return out


def size(model: EventModel) -> int:
    """p, the number of scalar parameters."""
    return sum(math.prod(spec.shape) for spec in model.parameters.values())


def _hawkes_start(
    k: int, u: int, per_decay: torch.Tensor | None, row: bool, fitted: bool, shape: tuple[int, ...], marked: bool
):
    def start(data: EventData) -> dict[str, torch.Tensor]:
        span = float((data.end - data.start).sum())
        rates = data.counts().sum(0) / span
        pieces = shape[1] if len(shape) > 1 else 1
        theta = {"baseline": (0.5 * rates).clamp(min=1e-3)[:, None].expand(k, pieces).reshape(shape).clone()}
        if per_decay is None:
            theta["adjacency"] = rates.new_full((k, k), 0.4 / k)
            scale = float(rates.sum()) + 1e-3
            theta["decay"] = rates.new_full((k,) if row else (), scale)
        else:
            theta["adjacency"] = rates.new_full((k, k, u), 0.4 / (k * u))
            if fitted:
                theta["decays"] = per_decay.to(rates, copy=True)
        if marked:
            theta["mark_power"] = rates.new_zeros(())
        return theta

    return start


def hawkes(
    dimension: int = 1,
    decay: str = "shared",
    decays: Sequence[float] | None = None,
    fit_decays: bool = False,
    *,
    baseline_knots: Sequence[float] | None = None,
    mark_scaling: str | None = None,
    mark_reference: float = 1.0,
) -> ExponentialHawkes:
    """tick's K-dimensional exponential Hawkes process, theta = {"baseline" (K,), "adjacency" (K, K),
    "decay" () or (K,) for ``decay="row"``}; with ``decays`` (U,), sum-of-exponential kernels with
    "adjacency" (K, K, U), the decays fixed (tick's), or with ``fit_decays=True`` fitted as theta["decays"] (U,)
    from the given values (a pass costs about U times one decay's: the sums of each decay and their first two
    derivatives in it). Stationary when the spectral radius of sum_u adjacency[..., u] is < 1. ``dimension`` is
    K, the number of event types (tick's word); the model's state has U K entries.

    ``baseline_knots`` c_1 < ... < c_{P-1}: a baseline that varies with the time of day, piecewise constant,
    "baseline" (K, P) with column p on [c_p, c_{p+1}); the knots are on the events' clock (each realization a
    day, its times e.g. seconds after midnight as ``read_lobster`` gives them), shared by all realizations.
    ``mark_scaling="power"``: each event's jump in the exponential sums is (z / ``mark_reference``)^gamma, z its
    first mark (the order size, > 0), gamma = theta["mark_power"] () fitted (0: every event counts one), so
    adjacency is the effect of an event of the reference size (give the mean size)."""
    k = int(dimension)
    if k < 1:
        raise ValueError(f"hawkes(dimension=...) must be >= 1, got {dimension}")
    if decay not in ("shared", "row"):
        raise ValueError(f"hawkes(decay=...) must be 'shared' or 'row', got {decay!r}")
    knots = _knots(baseline_knots)
    if mark_scaling not in (None, "power"):
        raise ValueError(f"hawkes(mark_scaling=...) must be None or 'power', got {mark_scaling!r}")
    if not (math.isfinite(mark_reference) and mark_reference > 0):
        raise ValueError(f"hawkes(mark_reference=...) must be a positive size, got {mark_reference!r}")
    baseline_shape = (k, len(knots) + 1) if knots else (k,)
    jump_size = None
    if mark_scaling == "power":
        reference = float(mark_reference)
        jump_size = lambda theta, z: (z[..., 0] / reference) ** theta["mark_power"]
    fixed = None if decays is None else torch.as_tensor(decays, dtype=D64).reshape(-1)
    kernel, parameters = _exponential_kernel(k, decay, fixed, fit_decays, baseline_shape, knots, jump_size)
    u = fixed.numel() if fixed is not None else k if decay == "row" else 1

    def jump(theta: Any, y: torch.Tensor, kind: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        one = torch.nn.functional.one_hot(kind, k).to(y.dtype).repeat(u)
        return one if jump_size is None else one * jump_size(theta, z)

    return ExponentialHawkes(
        type_count=k,
        state_size=u * k,
        rate=lambda theta, y: kernel_rate(kernel, theta, y),
        jump=jump,
        parameters=parameters,
        start=_hawkes_start(k, u, fixed, decay == "row", fit_decays, baseline_shape, jump_size is not None),
        bound=lambda theta, y, horizon: kernel_bound(kernel, theta, y),
        kernel=kernel,
    )


def _exponential_kernel(
    k: int,
    decay: str,
    fixed: torch.Tensor | None,
    fit_decays: bool,
    baseline_shape: tuple[int, ...],
    knots: tuple[float, ...],
    jump_size: Callable[[Any, torch.Tensor], torch.Tensor] | None,
) -> tuple[ExponentialKernel, dict[str, Parameter]]:
    """``hawkes``'s kernel and parameters for its decay options."""
    baseline = lambda theta: theta["baseline"].reshape(k, -1)
    if fixed is not None:
        if fixed.numel() == 0 or not bool((fixed > 0).all()):
            raise ValueError(f"hawkes(decays=...) must be positive numbers, got {fixed.tolist()}")
        u = fixed.numel()
        parameters = {"baseline": Parameter(baseline_shape, True), "adjacency": Parameter((k, k, u), nonnegative=True)}
        if fit_decays:
            parameters["decays"] = Parameter((u,), True)
        kernel = ExponentialKernel(
            (lambda theta: theta["decays"]) if fit_decays else (lambda theta: _beside(fixed, theta["adjacency"])),
            lambda theta: theta["adjacency"].permute(0, 2, 1),
            baseline,
            knots,
            jump_size,
        )
    elif fit_decays:
        raise ValueError("hawkes(fit_decays=True) needs the starting decays: hawkes(decays=(b_1, ..., b_U), ...)")
    elif decay == "row":
        u = k
        parameters = {
            "baseline": Parameter(baseline_shape, True),
            "adjacency": Parameter((k, k), nonnegative=True),
            "decay": Parameter((k,), True),
        }
        eye = torch.eye(k, dtype=D64)
        kernel = ExponentialKernel(
            lambda theta: theta["decay"],
            lambda theta: theta["adjacency"][:, None, :] * _beside(eye, theta["adjacency"])[:, :, None],
            baseline,
            knots,
            jump_size,
        )
    else:
        u = 1
        parameters = {
            "baseline": Parameter(baseline_shape, True),
            "adjacency": Parameter((k, k), nonnegative=True),
            "decay": Parameter((), True),
        }
        kernel = ExponentialKernel(
            lambda theta: theta["decay"].reshape(1),
            lambda theta: theta["adjacency"][:, None, :],
            baseline,
            knots,
            jump_size,
        )
    if jump_size is not None:
        parameters["mark_power"] = Parameter(())
    return kernel, parameters


def _beside(constant: torch.Tensor, parameter: torch.Tensor) -> torch.Tensor:
    """A model's constant in a parameter's dtype, on its device."""
    return constant.to(dtype=parameter.dtype, device=parameter.device)


def _knots(given: Sequence[float] | None) -> tuple[float, ...]:
    if given is None:
        return ()
    knots = tuple(float(c) for c in given)
    if not knots or not all(math.isfinite(c) for c in knots) or any(b <= a for a, b in itertools.pairwise(knots)):
        raise ValueError(
            f"hawkes(baseline_knots=...) must be increasing finite times of day (at least one), got {list(given)}"
        )
    return knots


def kernel_rate(
    kernel: ExponentialKernel, theta: Any, y: torch.Tensor, time: torch.Tensor | None = None
) -> torch.Tensor:
    """lambda (K,) of an exponential-kernel model at its state y (U K,) = S flattened (u major) at ``time`` (0-d);
    None: a baseline that does not vary with the time of day (the state does not hold the time)."""
    if time is None and kernel.knots:
        raise ValueError(
            "this Hawkes model's baseline varies with the time of day (baseline_knots), so its intensity needs the "
            "time: use likelihood.forward, diagnostics.goodness or simulate, not rate(theta, y)"
        )
    baseline = kernel.baseline(theta)
    season = baseline[:, 0] if time is None else baseline @ season_pieces(kernel.knots, time)
    return season + _excitation(kernel, theta, y)


def kernel_bound(kernel: ExponentialKernel, theta: Any, y: torch.Tensor) -> torch.Tensor:
    """A bound (K,) of the intensities from state y on: the day's largest baseline plus the excitation, which
    only decays until the next event."""
    return kernel.baseline(theta).max(1).values + _excitation(kernel, theta, y)


def _excitation(kernel: ExponentialKernel, theta: Any, y: torch.Tensor) -> torch.Tensor:
    decays = kernel.decays(theta)
    return torch.einsum("iuj,u,uj->i", kernel.weights(theta), decays, y.reshape(decays.shape[0], -1))


def intensity_model(
    rate: Rate,
    *,
    parameters: dict[str, Any],
    type_count: int = 1,
    state_size: int = 1,
    drift: Callable[[Any, torch.Tensor], torch.Tensor] | None = None,
    decay: Callable[[Any], torch.Tensor] | None = None,
    jump: Jump | None = None,
    start: dict[str, Any] | Callable[[EventData], dict[str, Any]] | None = None,
    step: float = 0.1,
    bound: Bound | None = None,
    additive: bool = False,
    **renamed: Any,
) -> AdditiveModel | GeneralModel:
    """A user's model: ``rate(theta, y) -> (K,)`` for y (d,) (``state_size`` d, ``type_count`` K), the flow between
    events by ``decay(theta) -> (d,)`` (closed form) or ``drift(theta, y) -> (d,)`` (RK4 steps of at most
    ``step``; None and no decay: Y constant), ``jump(theta, y, k, z) -> (d,)`` (k a 0-d int tensor, z the mark
    (q,); None: no jumps). ``parameters`` maps names to ``Parameter(shape, positive)`` (or a shape tuple:
    real). ``start``: a default theta. ``bound(theta, y, horizon) -> (K,)``: bounds of the intensities over
    ``horizon`` (for ``simulate``). ``additive=True`` declares that ``jump`` does not depend on y: the model is
    then an ``AdditiveModel`` (the likelihood a scan over the events; checked at the start theta before any work),
    else a ``GeneralModel`` (event by event)."""
    for old, new in (("types", "type_count"), ("dimension", "state_size")):
        if old in renamed:
            warnings.warn(f"intensity_model({old}=...) is now {new}=...", DeprecationWarning, stacklevel=2)
            if new == "type_count":
                type_count = renamed.pop(old)
            else:
                state_size = renamed.pop(old)
    if renamed:
        raise TypeError(f"intensity_model() got unknown options {sorted(renamed)}")
    if not callable(rate):
        raise TypeError(f"intensity_model(rate=...) must be a function (theta, y) -> (K,), got {type(rate).__name__}")
    if drift is not None and decay is not None:
        raise ValueError("give drift= or decay=, not both (decay is the closed-form flow dY = -decay * Y)")
    if additive and drift is not None:
        raise ValueError(
            "additive=True needs the closed-form flow decay= (or no flow), not drift=: the scan over the events "
            "solves the linear recursion of a decaying state; with a drift, drop additive=True"
        )
    specs = {
        name: spec if isinstance(spec, Parameter) else Parameter(tuple(spec), False)
        for name, spec in parameters.items()
    }
    d = int(state_size)

    def default_start(data: EventData) -> dict[str, torch.Tensor]:
        times = getattr(data, "times", None)  # the events' dtype and device (a given start may be read without them)
        if start is None:
            return {
                name: _follow(torch.full(spec.shape, 1.0 if spec.positive else 0.0), times)
                for name, spec in specs.items()
            }
        given = start(data) if callable(start) else start
        return {name: _follow(value, times) for name, value in given.items()}

    common: dict[str, Any] = {
        "type_count": int(type_count),
        "state_size": d,
        "rate": rate,
        "jump": _no_jump if jump is None else jump,
        "parameters": specs,
        "start": default_start,
        "bound": bound,
    }
    if additive:
        return AdditiveModel(**common, decay=_no_decay(d) if decay is None else decay, step=step)
    return GeneralModel(**common, drift=drift, decay=decay, step=step)


def _follow(value: Any, times: torch.Tensor | None) -> torch.Tensor:
    """A start value in the events' dtype and device (float64 without events)."""
    dtype, device = (D64, None) if times is None else (times.dtype, times.device)
    if isinstance(value, torch.Tensor):
        return value.to(dtype=dtype, device=device)
    return torch.as_tensor(value, dtype=dtype, device=device)  # numbers straight to the dtype, not through float32


def _no_jump(theta: Any, y: torch.Tensor, kind: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(y)


def _no_decay(d: int) -> Callable[[Any], torch.Tensor]:
    return lambda theta: torch.zeros(d, **_kind_of(theta))


def _kind_of(theta: Any) -> dict[str, Any]:
    """The dtype and device of theta's first tensor (float64 on the default device if it has none)."""
    first = next((value for value in theta.values() if isinstance(value, torch.Tensor)), None)
    return {"dtype": D64, "device": None} if first is None else {"dtype": first.dtype, "device": first.device}


def check_additive(model: AdditiveModel, theta: Any, marks: int) -> None:
    """Refuse a jump declared additive that depends on y: jump(theta, y, k, 0) at y = 0 and at y = (0.37, 0.74, ..)
    for every type k must agree."""
    kind_of = _kind_of(theta)
    z = torch.zeros(marks, **kind_of)
    here = torch.zeros(model.state_size, **kind_of)
    there = 0.37 * torch.arange(1, model.state_size + 1, **kind_of)
    for k in range(model.type_count):
        kind = torch.tensor(k, device=here.device)
        a, b = model.jump(theta, here, kind, z), model.jump(theta, there, kind, z)
        if a.shape != b.shape or not bool(torch.allclose(a, b, rtol=1e-12, atol=1e-12)):
            raise ValueError(
                f"the model declares additive=True (jump(theta, y, k, z) does not depend on y), but at k = {k} "
                f"the jump is {a.tolist()} at y = {here.tolist()} and {b.tolist()} at y = {there.tolist()}: "
                "drop additive=True (the event-by-event engine takes any jump)"
            )


def order_book(hidden: int = 0, sizes: bool = True) -> AdditiveModel:
    """Two types (0 buy, 1 sell) driven by a book imbalance Y (1,): dY = -kappa Y dt, Y jumps by +z at a buy and
    -z at a sell (z the mark: the size; ``sizes=False``: 1), lambda = softplus(network(theta, Y)) with
    network = b + W Y (``hidden`` = 0) or b + W2 tanh(W1 Y + c) (a hidden layer). theta: "baseline" b (2,),
    "weights" W (2, 1) (or "w1" (h, 1), "c" (h,), "w2" (2, h)), "kappa" () > 0."""
    parameters: dict[str, Parameter] = {"baseline": Parameter((2,))}
    if hidden:
        parameters.update(w1=Parameter((hidden, 1)), c=Parameter((hidden,)), w2=Parameter((2, hidden)))
    else:
        parameters["weights"] = Parameter((2, 1))
    parameters["kappa"] = Parameter((), True)

    def network(theta: Any, y: torch.Tensor) -> torch.Tensor:
        if hidden:
            return theta["baseline"] + theta["w2"] @ torch.tanh(theta["w1"] @ y + theta["c"])
        return theta["baseline"] + theta["weights"] @ y

    def jump(theta: Any, y: torch.Tensor, kind: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        size = z[:1] if sizes else torch.ones_like(y)
        return (1 - 2 * kind).to(y.dtype) * size

    def start(data: EventData) -> dict[str, torch.Tensor]:
        rates = data.counts().sum(0) / float((data.end - data.start).sum())
        theta = {name: rates.new_zeros(spec.shape) for name, spec in parameters.items()}
        theta["baseline"] = torch.log(torch.expm1(rates.clamp(min=1e-3)))
        theta["kappa"] = rates.new_tensor(1.0)
        return theta

    def bound(theta: Any, y: torch.Tensor, horizon: float) -> torch.Tensor:
        # Y decays monotonically towards 0, so each component of W Y lies between W Y(t) and 0
        if hidden:
            return torch.nn.functional.softplus(theta["baseline"] + theta["w2"].abs().sum(1))
        now = theta["weights"] @ y
        return torch.nn.functional.softplus(theta["baseline"] + now.clamp(min=0))

    return AdditiveModel(
        type_count=2,
        state_size=1,
        rate=lambda theta, y: torch.nn.functional.softplus(network(theta, y)),
        jump=jump,
        parameters=parameters,
        start=start,
        decay=lambda theta: theta["kappa"].reshape(1),
        step=1.0,  # 8 Gauss-Legendre nodes per unit of time: the flow is a smooth exponential
        bound=bound,
    )


__all__ = [
    "AdditiveModel",
    "EventModel",
    "ExponentialHawkes",
    "ExponentialKernel",
    "GeneralModel",
    "Parameter",
    "check_additive",
    "hawkes",
    "intensity_model",
    "kernel_bound",
    "kernel_rate",
    "order_book",
    "pack",
    "season_exposure",
    "season_pieces",
    "size",
    "unpack",
]
