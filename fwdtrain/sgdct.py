"""Stochastic gradient descent in continuous time (Sirignano & Spiliopoulos): drift estimation from a path.

Given an observed path of dX = mu*(X) dt + sigma(X) dW and a model drift mu(x, theta),
the online estimator follows the gradient of the continuous-time log-likelihood:

    dtheta = alpha_t (d mu(X_t; theta) / d theta)' (sigma sigma')^{-1}(X_t) (dX_t - mu(X_t; theta) dt)

discretised on the observation grid: with residual r_n = dX_n - mu(X_n; theta_n) h,

    theta_{n+1} = theta_n + alpha(t_n) J_n' a_n^{-1} r_n,   J_n = d mu / d theta at (X_n, theta_n), a = sigma sigma'

J' v is one vector-Jacobian product of the drift (``torch.func.vjp``): no Jacobian is formed.
The model is an ``fwdtrain.SDE``: its drift(theta, x) is estimated, its diffusion(theta, x) is the
(known) noise and is not differentiated, its cost is not used.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch.func import vjp, vmap

from . import _checks
from ._tree import squared_norm, tree_map
from .driver import History, _build_history
from .problem import SDE, Theta
from .state import evaluate_once
from .euler import LearningRate, learning_rate


class SGDCTState(NamedTuple):
    """theta (a pytree of tensors) and the time t (0-d tensor) of the estimator."""

    theta: Theta
    t: torch.Tensor


class SGDCTInfo(NamedTuple):
    """At step n: ``loss`` = r' a^{-1} r / (2 h) (the negative log-likelihood increment up to constants)
    and ``direction`` = J' a^{-1} r / h (the ascent direction, a pytree like theta)."""

    loss: torch.Tensor
    direction: Any


def init(theta: Theta, *, allow_low_precision: bool = False) -> SGDCTState:
    """The estimator at t = 0 with a copy (``clone``: transparent to ``torch.func`` transforms) of theta.

    theta must be float32 or float64 unless ``allow_low_precision=True``.
    """
    dtype, device = _checks.check_theta(theta, allow_low_precision=allow_low_precision)
    return SGDCTState(tree_map(torch.clone, theta), torch.zeros((), dtype=dtype, device=device))


def _weighted_residual(sigma: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """a^{-1} r with a = sigma sigma' (sigma (d, m) full or (d,) diagonal)."""
    if sigma.ndim == 1:
        return residual / sigma.square()
    return torch.linalg.solve(sigma @ sigma.T, residual)


def _one_path(sde: SDE, theta: Theta, x: torch.Tensor, dx: torch.Tensor, dt: Any) -> tuple[Any, torch.Tensor]:
    """(J' a^{-1} r, r' a^{-1} r) for one observation x (d,) and increment dx (d,)."""
    mu, pullback = vjp(lambda th: sde.drift(th, x), theta)
    residual = dx - mu * dt
    weighted = _weighted_residual(sde.diffusion(theta, x), residual)
    (ascent,) = pullback(weighted)
    return ascent, (residual * weighted).sum()


def advance(sde: SDE, state: SGDCTState, x: torch.Tensor, dx: torch.Tensor, dt: Any,
            alpha: Any) -> tuple[SGDCTState, SGDCTInfo]:
    """One SGDCT step without input checks (see the module docstring).

    x, dx (d,): one path; (P, d): P independent paths observed together, whose updates are averaged.
    Pure and transformable (``torch.func.grad``, ``vmap``, ...): no ``no_grad``, no ``.item()``.
    """
    if x.ndim == 1:
        ascent, quadratic = _one_path(sde, state.theta, x, dx, dt)
    else:
        ascent, quadratic = vmap(lambda xi, dxi: _one_path(sde, state.theta, xi, dxi, dt))(x, dx)
        ascent, quadratic = tree_map(lambda g: g.mean(0), ascent), quadratic.mean()
    theta = tree_map(lambda th, g: th + alpha * g, state.theta, ascent)
    info = SGDCTInfo(quadratic / (2 * dt), tree_map(lambda g: g / dt, ascent))
    return SGDCTState(theta, state.t + dt), info


def _check(sde: SDE, state: SGDCTState, x: Any, dx: Any, dt: Any, lr: Any) -> None:
    if not isinstance(sde, SDE):
        raise TypeError(f"sgdct expects a fwdtrain.SDE (its drift is estimated), got {type(sde).__name__}")
    if not isinstance(state, SGDCTState):
        raise TypeError(f"state must be a fwdtrain.sgdct.SGDCTState (from sgdct.init), got {type(state).__name__}")
    dtype, device = _checks.check_theta(state.theta, "state.theta", allow_low_precision=True)  # opted in at init
    _checks.check_dt(dt)
    _checks.check_lr(lr)
    x = _checks.check_tensor(x, "x", dtype, device)
    dx = _checks.check_tensor(dx, "dx", dtype, device)
    if x.ndim not in (1, 2) or dx.shape != x.shape:
        raise ValueError(f"x and dx must be an observation and its increment, both of shape (d,) "
                         f"(or (paths, d)); got {tuple(x.shape)} and {tuple(dx.shape)}")
    evaluate_once(sde, state.theta, x if x.ndim == 1 else x[0], name="x")


def step_with_info(sde: SDE, state: SGDCTState, x: torch.Tensor, dx: torch.Tensor, dt: Any,
                   lr: LearningRate) -> tuple[SGDCTState, SGDCTInfo]:
    """``step`` that also returns the ``SGDCTInfo`` at step n."""
    _check(sde, state, x, dx, dt, lr)
    alpha = learning_rate(lr, state.t)
    _checks.check_alpha(alpha, state.t, lr)
    return advance(sde, state, x, dx, dt, alpha)


def step(sde: SDE, state: SGDCTState, x: torch.Tensor, dx: torch.Tensor, dt: Any, lr: LearningRate) -> SGDCTState:
    """One pure SGDCT update from the observation x = X_n (d,) and its increment dx = X_{n+1} - X_n (d,).

    With x, dx of shape (P, d) (P independent paths of the same SDE) the P updates are averaged.
    """
    return step_with_info(sde, state, x, dx, dt, lr)[0]


def fit(sde: SDE, state: SGDCTState, x0: torch.Tensor, increments: torch.Tensor, dt: float, lr: LearningRate,
        *, record_every: int = 1000) -> tuple[SGDCTState, History]:
    """Run SGDCT along the path X_0 = x0, X_{n+1} = X_n + increments[n] (increments (n, d), step dt).

    x0 (P, d) with increments (n, P, d): P independent paths, their updates averaged.

    Returns the final state and a ``fwdtrain.History`` built as ``fwdtrain.run`` builds it (cost: the
    mean ``loss`` since the previous record; grad_norm: |direction| at the record; average_cost: the
    float64 running mean of ``loss``).
    """
    record_every = _checks.check_count(record_every, "record_every")
    if not isinstance(x0, torch.Tensor):
        raise TypeError(f"x0 must be a torch.Tensor, got {type(x0).__name__}")
    if not isinstance(increments, torch.Tensor) or increments.ndim != x0.ndim + 1 \
            or increments.shape[1:] != x0.shape:
        raise ValueError(f"increments must have shape (n, *x0.shape) = (n, {', '.join(map(str, x0.shape))}), "
                         f"got {tuple(getattr(increments, 'shape', ()))}")
    if increments.shape[0] == 0:
        raise ValueError("increments is empty: pass at least one observed increment")
    _check(sde, state, x0, increments[0], dt, lr)
    dtype, device = x0.dtype, x0.device
    _checks.check_tensor(increments, "increments", dtype, device)
    records: list = []  # the driver's records: (n, t, cost, grad_norm, average_cost, theta)
    x, total, window = x0, torch.zeros((), dtype=torch.float64, device=device), 0.0
    for n, dx in enumerate(increments, start=1):
        state, info = advance(sde, state, x, dx, dt, learning_rate(lr, state.t))
        x = x + dx
        total = total + info.loss
        if n % record_every == 0 or n == increments.shape[0]:
            since = n - (n - 1) // record_every * record_every  # steps since the previous record
            records.append((n, state.t, ((total - window) / since).to(dtype), squared_norm(info.direction).sqrt(),
                            total / n, state.theta))
            window = total
    return state, _build_history(None, records, None, None, False, dtype, device)


__all__ = ["SGDCTState", "SGDCTInfo", "init", "step", "step_with_info", "advance", "fit"]
