"""Optimisers for the online update: pure gradient transformations in optax's shape.

The continuous-time update dtheta = -alpha_t G_t dt, discretised, is

    theta_{n+1} = theta_n + s_n,    s_n = -alpha(t_n) h P_n(G_n, ..., G_0)

where P_n is the rule's direction: G_n itself for ``sgd`` (the plain
update, ``fwdtrain.core.step.descend``), a momentum trace, or Adam's/RMSprop's normalised moments.
The learning rate stays the schedule alpha(t); the rule only shapes the direction.

A transformation is ``GradientTransformation(init, update)``:

    init(theta) -> opt_state
    update(gradient, opt_state, theta, rate) -> (updates, opt_state)

``rate`` is the product alpha(t_n) * h, not alpha alone: the caller knows h, the
product is what torch.optim calls ``lr`` (so the numbers match it with lr = alpha h),
and ``sgd`` then multiplies in exactly the order ``descend`` does, (alpha h) G.
Transformations that only reshape the gradient (clipping, moments) ignore ``rate``;
``scale_by_rate`` turns a direction into the step -rate * direction and ends every
alias. ``apply_updates`` is the one place where theta changes.

Every function is pure and branch-free on tensor values, so a run of updates
composes with ``torch.func.grad``, ``jacfwd`` and ``vmap``. Hyperparameters are
Python numbers, checked when the transformation is built.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import optree
import torch

PyTree = Any
OptState = Any
InitFn = Callable[[PyTree], OptState]
UpdateFn = Callable[[PyTree, OptState, PyTree, Any], tuple[PyTree, OptState]]


class GradientTransformation(NamedTuple):
    """A pair of pure functions: ``init(theta) -> state``, ``update(g, state, theta, rate) -> (updates, state)``."""

    init: InitFn
    update: UpdateFn


class EmptyState(NamedTuple):
    """The state of a stateless transformation."""


class MomentumState(NamedTuple):
    """Heavy-ball trace b_n = mu b_{n-1} + G_n (b_{-1} = 0), one tensor per leaf of theta."""

    trace: PyTree


class AdamState(NamedTuple):
    """Step count n (0-d int64) and the first and second moment estimates m_n, v_n."""

    count: torch.Tensor  # type: ignore[assignment]  # a field named like tuple.count: checkpoints keep the name
    mu: PyTree
    nu: PyTree


class RmsState(NamedTuple):
    """Running mean of squared gradients v_n, and of gradients m_n (zeros unless centered)."""

    nu: PyTree
    mu: PyTree


class Average(NamedTuple):
    """Polyak-Ruppert running mean of theta, the number of iterates in it (0-d int64) and, when the
    average travels in a ``State``, its start time t0 (0-d float64; ``()``: given to ``average_update``).

    ``()``, not None, marks "absent": torch.func.vmap refuses None among its outputs."""

    mean: PyTree
    count: torch.Tensor  # type: ignore[assignment]  # a field named like tuple.count: checkpoints keep the name
    start: Any = ()


def tree_map(fn: Callable[..., Any], tree: PyTree, *rest: PyTree) -> PyTree:
    return optree.tree_map(fn, tree, *rest)


def squared_norm(tree: PyTree) -> torch.Tensor:
    """sum over every leaf of the squared entries (the global norm squared)."""
    terms = [leaf.square().sum() for leaf in optree.tree_leaves(tree)]
    return sum(terms[1:], terms[0])


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _zeros(theta: PyTree) -> PyTree:
    return tree_map(torch.zeros_like, theta)


def _sqrt(v: torch.Tensor) -> torch.Tensor:
    """sqrt(v) for v >= 0, with derivative 0 (not inf, which times 0 is NaN) where v = 0.

    The same values as ``v.sqrt()`` bitwise; v = 0 occurs whenever a gradient entry is exactly
    0 (e.g. a parameter the cost reaches only through the sensitivity, on the first step).
    """
    positive = v > 0
    return torch.where(positive, torch.where(positive, v, torch.ones_like(v)).sqrt(), torch.zeros_like(v))


# ---------------------------------------------------------------- the step and theta


def scale_by_rate() -> GradientTransformation:
    """s = -(rate * P), rate = alpha(t_n) h multiplied first, each leaf kept in the direction's dtype.

    alpha(t_n) from a schedule is float64 like the clock; the cast stops it
    promoting a 0-d float32 leaf (the same arithmetic as ``fwdtrain.core.step.descend``).
    """

    def init(theta: PyTree) -> EmptyState:
        return EmptyState()

    def update(direction: PyTree, state: EmptyState, theta: PyTree, rate: Any) -> tuple[PyTree, EmptyState]:
        return tree_map(lambda p: -(rate * p).to(p.dtype), direction), state

    return GradientTransformation(init, update)


def apply_updates(theta: PyTree, updates: PyTree) -> PyTree:
    """theta_{n+1} = theta_n + s_n, each leaf kept in theta's dtype (a new pytree; inputs untouched)."""
    return tree_map(lambda th, s: th + s.to(th.dtype), theta, updates)


def chain(*transformations: GradientTransformation) -> GradientTransformation:
    """Apply transformations in order: the output of one is the gradient of the next.

    Args:
        *transformations: ``GradientTransformation`` objects; the last one usually turns the direction into
            the step (``scale_by_rate``, which every alias ends with).

    Returns:
        The composed ``GradientTransformation``; its state is the tuple of their states.

    Raises:
        ValueError: An argument that is not a ``GradientTransformation``.
    """
    for i, tr in enumerate(transformations):
        _check(
            isinstance(tr, GradientTransformation),
            f"chain takes GradientTransformations, got {type(tr).__name__} at position {i}",
        )

    def init(theta: PyTree) -> tuple:
        return tuple(tr.init(theta) for tr in transformations)

    def update(gradient: PyTree, state: tuple, theta: PyTree, rate: Any) -> tuple[PyTree, tuple]:
        new_state = []
        for tr, s in zip(transformations, state, strict=True):
            gradient, s = tr.update(gradient, s, theta, rate)
            new_state.append(s)
        return gradient, tuple(new_state)

    return GradientTransformation(init, update)


# ---------------------------------------------------------------- directions


def scale_by_momentum(momentum: float, nesterov: bool = False) -> GradientTransformation:
    """b_n = mu b_{n-1} + G_n; direction b_n (heavy ball) or G_n + mu b_n (Nesterov), as torch.optim.SGD."""
    _check(0.0 <= momentum < 1.0, f"momentum must be in [0, 1), got {momentum}")
    _check(not nesterov or momentum > 0.0, "nesterov=True needs momentum > 0 (with 0 it is plain sgd)")
    momentum = float(momentum)

    def init(theta: PyTree) -> MomentumState:
        return MomentumState(_zeros(theta))

    def update(gradient: PyTree, state: MomentumState, theta: PyTree, rate: Any) -> tuple[PyTree, MomentumState]:
        trace = tree_map(lambda b, g: momentum * b + g, state.trace, gradient)
        if nesterov:
            direction = tree_map(lambda g, b: g + momentum * b, gradient, trace)
        else:
            direction = trace
        return direction, MomentumState(trace)

    return GradientTransformation(init, update)


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> GradientTransformation:
    """m_n = b1 m + (1-b1) G, v_n = b2 v + (1-b2) G^2; direction (m_n / c1) / (sqrt(v_n / c2) + eps).

    c_i = 1 - b_i^n corrects the bias of the zero start; n counts updates from 1.
    """
    _check(0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0, f"adam needs b1, b2 in [0, 1), got b1={b1}, b2={b2}")
    _check(eps > 0.0, f"adam needs eps > 0 (it keeps v = 0 from dividing by zero), got {eps}")
    b1, b2, eps = float(b1), float(b2), float(eps)

    def init(theta: PyTree) -> AdamState:
        return AdamState(torch.zeros((), dtype=torch.int64), _zeros(theta), _zeros(theta))

    def update(gradient: PyTree, state: AdamState, theta: PyTree, rate: Any) -> tuple[PyTree, AdamState]:
        count = state.count + 1
        mu = tree_map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, gradient)
        nu = tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, gradient)

        def direction(m: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            n = count.to(m.dtype)
            c1, c2 = 1 - b1**n, 1 - b2**n
            return (m / c1) / (_sqrt(v) / c2.sqrt() + eps)

        return tree_map(direction, mu, nu), AdamState(count, mu, nu)

    return GradientTransformation(init, update)


def scale_by_rms(decay: float = 0.99, eps: float = 1e-8, centered: bool = False) -> GradientTransformation:
    """v_n = d v + (1-d) G^2 (v_{-1} = 0); direction G / (sqrt(v_n) + eps), or centred G / (sqrt(v_n - m_n^2) + eps).

    ``decay`` is torch.optim.RMSprop's ``alpha`` (renamed: alpha is the learning rate here).
    """
    _check(0.0 <= decay < 1.0, f"rmsprop needs decay in [0, 1), got {decay}")
    _check(eps > 0.0, f"rmsprop needs eps > 0 (it keeps v = 0 from dividing by zero), got {eps}")
    decay, eps = float(decay), float(eps)

    def init(theta: PyTree) -> RmsState:
        return RmsState(_zeros(theta), _zeros(theta))

    def update(gradient: PyTree, state: RmsState, theta: PyTree, rate: Any) -> tuple[PyTree, RmsState]:
        nu = tree_map(lambda v, g: decay * v + (1 - decay) * g * g, state.nu, gradient)
        if centered:
            mu = tree_map(lambda m, g: decay * m + (1 - decay) * g, state.mu, gradient)
            direction = tree_map(lambda g, v, m: g / (_sqrt(v - m * m) + eps), gradient, nu, mu)
        else:
            mu = state.mu
            direction = tree_map(lambda g, v: g / (_sqrt(v) + eps), gradient, nu)
        return direction, RmsState(nu, mu)

    return GradientTransformation(init, update)


def clip_by_global_norm(max_norm: float) -> GradientTransformation:
    """G -> G min(1, c / |G|), |G|^2 = sum over all leaves: caps the global norm at c, small G unchanged (bitwise).

    Branch-free and safe to differentiate: the square root is only taken where |G| > c > 0. Put it first in
    a ``chain``.

    Args:
        max_norm: c, finite and > 0.

    Returns:
        A stateless ``GradientTransformation`` that maps G to the clipped G.

    Raises:
        ValueError: c not finite or not > 0.
    """
    _check(
        math.isfinite(max_norm) and max_norm > 0.0, f"clip_by_global_norm needs a finite max_norm > 0, got {max_norm}"
    )
    max_norm = float(max_norm)

    def init(theta: PyTree) -> EmptyState:
        return EmptyState()

    def update(gradient: PyTree, state: EmptyState, theta: PyTree, rate: Any) -> tuple[PyTree, EmptyState]:
        sq = squared_norm(gradient)
        clipped = sq > max_norm**2
        safe = torch.where(clipped, sq, torch.ones_like(sq))
        scale = torch.where(clipped, max_norm / safe.sqrt(), torch.ones_like(sq))
        return tree_map(lambda g: g * scale.to(g.dtype), gradient), state

    return GradientTransformation(init, update)


# ---------------------------------------------------------------- aliases


def sgd() -> GradientTransformation:
    """Plain SGD: theta_{n+1} = theta_n - alpha(t_n) h G_n, bitwise the update without a rule.

    Returns:
        The ``GradientTransformation`` (its state is ``EmptyState()``).
    """
    return scale_by_rate()


def momentum(momentum: float = 0.9, nesterov: bool = False) -> GradientTransformation:
    """Heavy ball (or Nesterov) momentum: b_n = mu b_{n-1} + G_n, s_n = -alpha(t_n) h b_n.

    The numbers of ``torch.optim.SGD(lr=alpha h, momentum=mu, nesterov=...)``.

    Args:
        momentum: mu in [0, 1) (default 0.9).
        nesterov: The direction G_n + mu b_n instead of b_n (needs mu > 0).

    Returns:
        The ``GradientTransformation``; its state holds the trace b per leaf (``MomentumState``).

    Raises:
        ValueError: mu out of range, or ``nesterov`` with mu = 0.
    """
    return chain(scale_by_momentum(momentum, nesterov), scale_by_rate())


def adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> GradientTransformation:
    """Adam: s_n = -alpha(t_n) h (m_n / c1) / (sqrt(v_n / c2) + eps).

    m_n = b1 m + (1 - b1) G, v_n = b2 v + (1 - b2) G^2, c_i = 1 - b_i^n; the numbers of
    ``torch.optim.Adam(lr=alpha h, betas=(b1, b2), eps=eps)``. The direction is normalised, so the
    step does not shrink with the gradient: with the same decay of alpha it keeps a larger noise ball
    than sgd.

    Args:
        b1: Decay of the first moment, in [0, 1).
        b2: Decay of the second moment, in [0, 1).
        eps: > 0, added to sqrt(v).

    Returns:
        The ``GradientTransformation``; its state is a tuple with an ``AdamState`` (count, m, v).

    Raises:
        ValueError: A hyperparameter out of range.
    """
    return chain(scale_by_adam(b1, b2, eps), scale_by_rate())


def rmsprop(
    decay: float = 0.99, eps: float = 1e-8, centered: bool = False, momentum: float = 0.0
) -> GradientTransformation:
    """RMSprop: s_n = -alpha(t_n) h b_n, b_n = mu b_{n-1} + G_n / (sqrt(v_n) + eps) (b_n = G_n / ... when mu = 0).

    The numbers of ``torch.optim.RMSprop(lr=alpha h, alpha=decay, eps, centered, momentum)``.

    Args:
        decay: Decay of the mean square v, in [0, 1) (torch's ``alpha``, renamed: alpha is the learning
            rate here).
        eps: > 0, added to sqrt(v).
        centered: Divide by sqrt(v - m^2) (m the running mean of G) instead of sqrt(v).
        momentum: mu in [0, 1); 0: no momentum.

    Returns:
        The ``GradientTransformation``.

    Raises:
        ValueError: A hyperparameter out of range.
    """
    parts = [scale_by_rms(decay, eps, centered)]
    if momentum != 0.0:
        parts.append(scale_by_momentum(momentum))
    return chain(*parts, scale_by_rate())


Optimizer = Literal["sgd", "momentum", "adam", "rmsprop"]

OPTIMIZERS: dict[str, Callable[..., GradientTransformation]] = {
    "sgd": sgd,
    "momentum": momentum,
    "adam": adam,
    "rmsprop": rmsprop,
}


def optimizer(name: Optimizer, **options: Any) -> GradientTransformation:
    """The named optimiser built with its options, e.g. ``optimizer("adam", b1=0.8)`` (for the command line).

    Args:
        name: ``"sgd"``, ``"momentum"``, ``"adam"`` or ``"rmsprop"``.
        **options: Keyword arguments of that factory.

    Returns:
        The ``GradientTransformation``.

    Raises:
        ValueError: An unknown name or option.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; expected one of {sorted(OPTIMIZERS)}")
    factory = OPTIMIZERS[name]
    accepted = inspect.signature(factory).parameters
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"optimizer {name!r} takes options {sorted(accepted) or 'none'}, got {unknown}")
    return factory(**options)


# ---------------------------------------------------------------- checks (on structure, before any step)


def _signature(tree: PyTree) -> tuple:
    """(structure, [(shape, dtype) per leaf]): what must agree between a state and a rule's ``init``."""
    flat, spec = optree.tree_flatten(tree, none_is_leaf=False)
    return spec, [
        (tuple(leaf.shape), leaf.dtype) if isinstance(leaf, torch.Tensor) else (type(leaf).__name__,) for leaf in flat
    ]


def _describe(tree: PyTree) -> str:
    """A short name for an optimiser state: "()" or e.g. "a tuple of (EmptyState, AdamState, EmptyState)"."""
    if type(tree) is tuple and not tree:
        return "() (no optimiser state: the plain update theta - alpha h G)"

    def named(node: Any) -> bool:
        return isinstance(node, tuple) and hasattr(node, "_fields")

    kinds = [type(node).__name__ for node in optree.tree_flatten(tree, is_leaf=named)[0] if named(node)]
    return f"a {type(tree).__name__}" + (f" of ({', '.join(kinds)})" if kinds and not named(tree) else "")


def check_optimizer(optimizer: Any) -> GradientTransformation | None:
    """``optimizer`` when it is a ``GradientTransformation`` or None; else ``TypeError`` saying what it is."""
    if optimizer is not None and not isinstance(optimizer, GradientTransformation):
        raise TypeError(
            f"optimizer must be a fwdtrain.optim.GradientTransformation (e.g. fwdtrain.optim.adam()) "
            f"or None, got {type(optimizer).__name__}"
        )
    return optimizer


def check_opt_state(
    optimizer: GradientTransformation | None, opt_state: OptState, theta: PyTree, name: str = "state.opt_state"
) -> None:
    """Raise ``ValueError`` unless ``opt_state`` has the structure, shapes and dtypes of ``optimizer.init(theta)``
    (``()`` for ``optimizer`` None: the plain update ``fwdtrain.core.step.descend``). Checks structure only, so it
    runs inside the user's transforms too."""
    check_optimizer(optimizer)
    expected = () if optimizer is None else optimizer.init(theta)
    if _signature(opt_state) == _signature(expected):
        return
    fix = (
        "make the state with fwdtrain.init(..., optimizer=<the same rule>) (or "
        "state._replace(opt_state=optimizer.init(state.theta))), or step it with the rule it was made for"
    )
    given = "optimizer=None" if optimizer is None else "the optimizer given"
    have, want = _describe(opt_state), _describe(expected)
    if have == want:
        have = f"{have} whose tensors' shapes or dtypes differ from theta's"
    raise ValueError(f"{name} does not fit the optimizer: the state holds {have}, {given} expects {want}; {fix}")


def check_average(average: Any, theta: PyTree, name: str = "state.average") -> None:
    """Raise unless ``average`` is ``()`` (none) or an ``Average`` with a start time and a mean shaped like theta."""
    if isinstance(average, tuple) and not average:
        return
    if not isinstance(average, Average):
        raise TypeError(
            f"{name} must be a fwdtrain.optim.Average (from fwdtrain.init(..., average_from=t0)) "
            f"or None, got {type(average).__name__}"
        )
    if isinstance(average.start, tuple):
        raise ValueError(f"{name} has no start time; build it with average_init(theta, average_from=t0)")
    if _signature(average.mean) != _signature(theta):
        raise ValueError(f"{name}.mean does not have the structure, shapes and dtypes of theta")


# ---------------------------------------------------------------- Polyak-Ruppert averaging


def average_init(theta: PyTree, average_from: Any = None) -> Average:
    """An empty running average: mean 0 (shaped like theta), count 0, start t0 = ``average_from``
    (a number or 0-d tensor, kept as a 0-d float64 tensor; None: passed to each ``average_update``)."""
    first = next(iter(optree.tree_leaves(theta)), None)
    device = first.device if isinstance(first, torch.Tensor) else None
    start: Any = ()
    if average_from is not None:
        if isinstance(average_from, bool) or not isinstance(average_from, (int, float, torch.Tensor)):
            raise TypeError(
                f"average_from must be a number (the time t0 the average starts) or None, "
                f"got {type(average_from).__name__}"
            )
        start = torch.as_tensor(average_from, dtype=torch.float64, device=device).clone()
        if start.ndim != 0:
            raise ValueError(f"average_from must be one number, got shape {tuple(start.shape)}")
    return Average(_zeros(theta), torch.zeros((), dtype=torch.int64, device=device), start)


def average_update(average: Average, theta: PyTree, t: Any, *, average_from: Any = None) -> Average:
    """Include theta_n in the mean when t_n >= t0 = ``average_from`` (default ``average.start``), branch-free:

        k_n = k + 1[t_n >= t0],   mean_n = mean + 1[t_n >= t0] (theta_n - mean) / k_n

    so after the run, mean = (1/K) sum_{n: t_n >= t0} theta_n. Works under vmap (t may be batched).
    """
    start = average.start if average_from is None else average_from
    if isinstance(start, tuple):
        raise ValueError(
            "average_update needs the start time: pass average_from=t0 or build the average "
            "with average_init(theta, average_from=t0)"
        )
    t = t if isinstance(t, torch.Tensor) else torch.as_tensor(t, dtype=torch.float64)
    include = t >= start
    count = average.count + include.to(average.count.dtype)
    denominator = count.clamp(min=1)
    mean = tree_map(lambda m, th: torch.where(include, m + (th - m) / denominator.to(m.dtype), m), average.mean, theta)
    return Average(mean, count, average.start)


__all__ = [
    "OPTIMIZERS",
    "AdamState",
    "Average",
    "EmptyState",
    "GradientTransformation",
    "MomentumState",
    "Optimizer",
    "RmsState",
    "adam",
    "apply_updates",
    "average_init",
    "average_update",
    "chain",
    "check_average",
    "check_opt_state",
    "check_optimizer",
    "clip_by_global_norm",
    "momentum",
    "optimizer",
    "rmsprop",
    "scale_by_adam",
    "scale_by_momentum",
    "scale_by_rate",
    "scale_by_rms",
    "sgd",
]
