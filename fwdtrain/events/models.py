"""Models of K event types driven by a state Y that the events move.

Between events dY = drift(theta, Y) dt (``decay``: dY = -decay(theta) * Y, in closed form); at an event of
type k with mark z, Y(t_i) = Y(t_i-) + jump(theta, Y(t_i-), k, z); the intensities are
lambda(theta, Y(t-)) (K,). theta is a dict of tensors in natural units; each parameter has a shape and is
``positive``, ``nonnegative`` or real, and the fits move u (log of the positive ones, the others as they are).

``hawkes(dimension=K)`` is tick's exponential Hawkes process,

    lambda_i(t) = mu_i + sum_j alpha_ij beta exp(-beta (t - t_m)) summed over past type-j events t_m,

with the state S_uj = sum over past type-j events of exp(-beta_u (t - t_m)); ``decay="row"`` gives one beta_i
per row and ``decays=(b_1, ..., b_U)`` tick's sum-of-exponential kernels phi_ij = sum_u alpha_iju b_u exp(-b_u t)
with the b_u fixed. Such models carry an ``ExponentialKernel``: the vectorised exact engine.
``order_book`` is a state-dependent model, lambda = softplus(b + W Y), of a book imbalance Y that decays at rate
kappa and is moved by signed event sizes. ``intensity_model`` builds a user's model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from .data import D64, EventData


class Parameter(NamedTuple):
    """A parameter's shape and its domain: real, ``positive`` (> 0, fitted through its logarithm) or
    ``nonnegative`` (>= 0, fitted in natural units with a bound at 0, where its MLE may sit exactly)."""

    shape: tuple[int, ...]
    positive: bool = False
    nonnegative: bool = False


class ExponentialKernel(NamedTuple):
    """lambda_i = baseline_i + sum_{u, j} weights_iuj decays_u S_uj, S_uj the exponential sums of decay u over
    past type-j events: ``decays(theta) -> (U,)``, ``weights(theta) -> (K, U, K)``, ``baseline(theta) -> (K,)``."""

    decays: Callable[[Any], torch.Tensor]
    weights: Callable[[Any], torch.Tensor]
    baseline: Callable[[Any], torch.Tensor]


class EventModel(NamedTuple):
    """A model of K event types (see the module's docstring). ``start(data) -> theta`` gives a default start."""

    types: int
    dimension: int
    rate: Callable[[Any, torch.Tensor], torch.Tensor]
    jump: Callable[[Any, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    parameters: dict[str, Parameter]
    start: Callable[[EventData], dict[str, torch.Tensor]]
    drift: Callable[[Any, torch.Tensor], torch.Tensor] | None = None
    decay: Callable[[Any], torch.Tensor] | None = None
    kernel: ExponentialKernel | None = None
    step: float = 0.1
    bound: Callable[[Any, torch.Tensor, float], torch.Tensor] | None = None
    additive: bool = False  # jump(theta, y, k, z) does not depend on y (with a decay: a vectorised engine)


def pack(model: EventModel, theta: dict[str, Any]) -> torch.Tensor:
    """The vector u (p,) of theta (log of the positive parameters; the nonnegative ones keep their bound at 0)."""
    pieces = []
    for name, spec in model.parameters.items():
        if name not in theta:
            raise KeyError(f"theta has no {name!r}; the model's parameters are {list(model.parameters)}")
        value = torch.as_tensor(theta[name], dtype=D64)
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


def _hawkes_start(k: int, u: int, per_decay: Sequence[float] | None, row: bool):
    def start(data: EventData) -> dict[str, torch.Tensor]:
        span = float((data.end - data.start).sum())
        rates = data.counts().sum(0) / span
        theta = {"baseline": (0.5 * rates).clamp(min=1e-3)}
        if per_decay is None:
            theta["adjacency"] = torch.full((k, k), 0.4 / k, dtype=D64)
            scale = float(rates.sum()) + 1e-3
            theta["decay"] = torch.full((k,) if row else (), scale, dtype=D64)
        else:
            theta["adjacency"] = torch.full((k, k, u), 0.4 / (k * u), dtype=D64)
        return theta

    return start


def hawkes(dimension: int = 1, decay: str = "shared", decays: Sequence[float] | None = None) -> EventModel:
    """tick's K-dimensional exponential Hawkes process, theta = {"baseline" (K,), "adjacency" (K, K),
    "decay" () or (K,) for ``decay="row"``}; with ``decays`` fixed, sum-of-exponential kernels with
    "adjacency" (K, K, U). Stationary when the spectral radius of sum_u adjacency[..., u] is < 1."""
    k = int(dimension)
    if k < 1:
        raise ValueError(f"hawkes(dimension=...) must be >= 1, got {dimension}")
    if decay not in ("shared", "row"):
        raise ValueError(f"hawkes(decay=...) must be 'shared' or 'row', got {decay!r}")
    if decays is not None:
        fixed = torch.as_tensor(decays, dtype=D64).reshape(-1)
        if fixed.numel() == 0 or not bool((fixed > 0).all()):
            raise ValueError(f"hawkes(decays=...) must be positive numbers, got {list(decays)}")
        u = fixed.numel()
        parameters = {"baseline": Parameter((k,), True), "adjacency": Parameter((k, k, u), nonnegative=True)}
        kernel = ExponentialKernel(
            lambda theta: fixed, lambda theta: theta["adjacency"].permute(0, 2, 1), lambda theta: theta["baseline"]
        )
    elif decay == "row":
        u = k
        parameters = {
            "baseline": Parameter((k,), True),
            "adjacency": Parameter((k, k), nonnegative=True),
            "decay": Parameter((k,), True),
        }
        eye = torch.eye(k, dtype=D64)
        kernel = ExponentialKernel(
            lambda theta: theta["decay"],
            lambda theta: theta["adjacency"][:, None, :] * eye[:, :, None],
            lambda theta: theta["baseline"],
        )
    else:
        u = 1
        parameters = {
            "baseline": Parameter((k,), True),
            "adjacency": Parameter((k, k), nonnegative=True),
            "decay": Parameter((), True),
        }
        kernel = ExponentialKernel(
            lambda theta: theta["decay"].reshape(1),
            lambda theta: theta["adjacency"][:, None, :],
            lambda theta: theta["baseline"],
        )
    return EventModel(
        types=k,
        dimension=u * k,
        rate=lambda theta, y: kernel_rate(kernel, theta, y),
        jump=lambda theta, y, kind, z: torch.nn.functional.one_hot(kind, k).to(y.dtype).repeat(u),
        parameters=parameters,
        start=_hawkes_start(k, u, decays, decay == "row"),
        decay=lambda theta: kernel.decays(theta).repeat_interleave(k),
        kernel=kernel,
        bound=lambda theta, y, horizon: kernel_rate(kernel, theta, y),
    )


def kernel_rate(kernel: ExponentialKernel, theta: Any, y: torch.Tensor) -> torch.Tensor:
    """lambda (K,) of an exponential-kernel model at its state y (U K,) = S flattened (u major)."""
    decays = kernel.decays(theta)
    s = y.reshape(decays.shape[0], -1)
    return kernel.baseline(theta) + torch.einsum("iuj,u,uj->i", kernel.weights(theta), decays, s)


def intensity_model(
    rate: Callable[[Any, torch.Tensor], torch.Tensor],
    *,
    parameters: dict[str, Any],
    types: int = 1,
    dimension: int = 1,
    drift: Callable[[Any, torch.Tensor], torch.Tensor] | None = None,
    decay: Callable[[Any], torch.Tensor] | None = None,
    jump: Callable[[Any, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    start: dict[str, Any] | Callable[[EventData], dict[str, Any]] | None = None,
    step: float = 0.1,
    bound: Callable[[Any, torch.Tensor, float], torch.Tensor] | None = None,
    additive: bool = False,
) -> EventModel:
    """A user's model: ``rate(theta, y) -> (K,)`` for y (d,) (``dimension`` d, ``types`` K), the flow between
    events by ``decay(theta) -> (d,)`` (closed form) or ``drift(theta, y) -> (d,)`` (RK4 steps of at most
    ``step``; None and no decay: Y constant), ``jump(theta, y, k, z) -> (d,)`` (k a 0-d int tensor, z the mark
    (q,); None: no jumps). ``parameters`` maps names to ``Parameter(shape, positive)`` (or a shape tuple:
    real). ``start``: a default theta. ``bound(theta, y, horizon) -> (K,)``: bounds of the intensities over
    ``horizon`` (for ``simulate``). ``additive=True`` declares that ``jump`` does not depend on y: with a ``decay``,
    the likelihood is then vectorised over the events (a scan) instead of a loop."""
    if not callable(rate):
        raise TypeError(f"intensity_model(rate=...) must be a function (theta, y) -> (K,), got {type(rate).__name__}")
    if drift is not None and decay is not None:
        raise ValueError("give drift= or decay=, not both (decay is the closed-form flow dY = -decay * Y)")
    specs = {
        name: spec if isinstance(spec, Parameter) else Parameter(tuple(spec), False)
        for name, spec in parameters.items()
    }
    d = int(dimension)
    no_jump = lambda theta, y, kind, z: torch.zeros_like(y)

    def default_start(data: EventData) -> dict[str, torch.Tensor]:
        if start is None:
            return {
                name: torch.ones(spec.shape, dtype=D64) * (1.0 if spec.positive else 0.0)
                for name, spec in specs.items()
            }
        given = start(data) if callable(start) else start
        return {name: torch.as_tensor(value, dtype=D64) for name, value in given.items()}

    return EventModel(
        int(types), d, rate, no_jump if jump is None else jump, specs, default_start, drift, decay, None, step, bound
    )


def order_book(hidden: int = 0, sizes: bool = True) -> EventModel:
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
        theta = {name: torch.zeros(spec.shape, dtype=D64) for name, spec in parameters.items()}
        theta["baseline"] = torch.log(torch.expm1(rates.clamp(min=1e-3)))
        theta["kappa"] = torch.tensor(1.0, dtype=D64)
        return theta

    def bound(theta: Any, y: torch.Tensor, horizon: float) -> torch.Tensor:
        # Y decays monotonically towards 0, so each component of W Y lies between W Y(t) and 0
        if hidden:
            return torch.nn.functional.softplus(theta["baseline"] + theta["w2"].abs().sum(1))
        now = theta["weights"] @ y
        return torch.nn.functional.softplus(theta["baseline"] + now.clamp(min=0))

    return EventModel(
        types=2,
        dimension=1,
        rate=lambda theta, y: torch.nn.functional.softplus(network(theta, y)),
        jump=jump,
        parameters=parameters,
        start=start,
        decay=lambda theta: theta["kappa"].reshape(1),
        step=1.0,  # 8 Gauss-Legendre nodes per unit of time: the flow is a smooth exponential
        bound=bound,
        additive=True,
    )


__all__ = [
    "EventModel",
    "ExponentialKernel",
    "Parameter",
    "hawkes",
    "intensity_model",
    "kernel_rate",
    "order_book",
    "pack",
    "size",
    "unpack",
]
