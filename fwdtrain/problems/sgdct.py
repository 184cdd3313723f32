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

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.func import vjp, vmap

from ..core import _checks
from ..core._tree import tree_map
from ..core.noise import Noise, NoiseLike, TensorNoise
from ..core.problem import SDE
from ..core.sensitivity import Theta
from ..core.state import State, evaluate_once
from ..core.step import LearningRate, StepInfo, learning_rate
from ..optim import GradientTransformation
from .cost import check_training_state
from .trainable import Trainable


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
    """The estimator at t = 0.

    Args:
        theta: The initial drift parameters, float32 or float64 (copied with ``clone``: transparent to
            ``torch.func`` transforms).
        allow_low_precision: Keyword only. Accept bfloat16/float16.

    Returns:
        ``SGDCTState(theta, t=0)`` with a float64 clock (no drift over long runs); ``as_state`` makes it
        a start for ``fwdtrain.run``.
    """
    _, device = _checks.check_theta(theta, allow_low_precision=allow_low_precision)
    return SGDCTState(tree_map(torch.clone, theta), torch.zeros((), dtype=torch.float64, device=device))


def _weighted_residual(sigma: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """a^{-1} r with a = sigma sigma' (sigma (d, m) full or (d,) diagonal)."""
    if sigma.ndim == 1:
        return residual / sigma.square()
    return torch.linalg.solve(sigma @ sigma.T, residual)


def _one_path(sde: SDE, theta: Theta, x: torch.Tensor, dx: torch.Tensor, dt: Any) -> tuple[Any, torch.Tensor]:
    """(J' a^{-1} r, r' a^{-1} r) for one observation x (d,) and increment dx (d,)."""
    mu, pullback = vjp(lambda th: sde.drift(th, x), theta)  # type: ignore[misc]  # no has_aux: two values
    residual = dx - mu * dt
    weighted = _weighted_residual(sde.diffusion(theta, x), residual)
    (ascent,) = pullback(weighted)
    return ascent, (residual * weighted).sum()


def _ascent(sde: SDE, theta: Theta, x: torch.Tensor, dx: torch.Tensor, dt: Any) -> tuple[Any, torch.Tensor]:
    """(J' a^{-1} r, r' a^{-1} r) for one path x (d,), or their means over P paths x (P, d)."""
    if x.ndim == 1:
        return _one_path(sde, theta, x, dx, dt)
    ascent, quadratic = vmap(lambda xi, dxi: _one_path(sde, theta, xi, dxi, dt))(x, dx)
    return tree_map(lambda g: g.mean(0), ascent), quadratic.mean()


@dataclass(frozen=True)
class DriftEstimation(Trainable):
    """SGDCT on observed paths as a ``fwdtrain.problems.Trainable``, so that ``fwdtrain.run`` trains it.

    The loop's state is ``State(x=X_n, x_tilde=(), theta, t)`` (see ``as_state``): x is the current
    observation of P paths, (P, d); the "noise" of step n is the observed increment dX_n, (P, d):
    ``increments`` (n, P, d) when given here (then ``run`` needs no ``noise=``), else pass them as
    ``noise=``. The step is the estimator's update with x <- x + dX_n; the recorded cost is the step's
    ``loss`` and the gradient G = -direction. ``single=True``: one path, held as (1, d) and stepped
    as the (d,) observation of ``step``. ``optimizer``: a ``fwdtrain.optim`` rule applied to G
    (None: theta - alpha h G = theta + alpha J' a^{-1} r, SGDCT's own update). Across processes the
    gradient hook averages G over the ranks' paths, as for P paths in one process.
    """

    sde: SDE
    single: bool = False
    optimizer: GradientTransformation | None = None
    increments: torch.Tensor | None = None

    def check(self, state: State, dt: Any, lr: Any) -> None:
        """The input checks of ``step`` for the observation state.x, and the optimiser state's fit."""
        if self.sde.jumps is not None:
            raise ValueError(
                "SGDCT estimates a drift from continuous observed paths; an SDE with jumps is not one. "
                "Fit event data with fwdtrain.pointprocess"
            )
        if not isinstance(state, State):
            raise TypeError(f"expected a fwdtrain.State (from sgdct.as_state), got {type(state).__name__}")
        x = state.x[0] if self.single else state.x
        check_inputs(self.sde, SGDCTState(state.theta, state.t), x, torch.zeros_like(x), dt, lr)
        check_training_state(state, self.optimizer)
        if self.increments is not None:
            _checks.check_tensor(self.increments, "increments", state.x.dtype, state.x.device)

    def plan(self, state: State, mode: str = "auto") -> str:
        """SGDCT takes one vector-Jacobian product; it has no forward mode."""
        if mode not in ("auto", "reverse"):
            raise ValueError(f"SGDCT differentiates the drift in reverse mode only; pass mode='auto', got {mode!r}")
        return "reverse"

    def noise_shape(self, state: State) -> tuple[int, ...]:
        """The shape of one observed increment: that of the observation x."""
        return tuple(state.x.shape)

    def noise_source(self, noise: NoiseLike | int, dt: Any, state: State, saved: dict | None) -> Noise:
        """The observed increments given to the problem (for an int ``noise``), else the user's ``noise``."""
        if self.increments is not None and isinstance(noise, int) and not isinstance(noise, bool):
            data = self.increments[:, None] if self.single and self.increments.ndim == 2 else self.increments
            return TensorNoise(data).expect(tuple(self.noise_shape(state)), state.x.dtype, state.x.device)
        return super().noise_source(noise, dt, state, saved)

    def propagate(self, state: State, dw: torch.Tensor, dt: Any, plan: Any) -> tuple[State, StepInfo]:
        """x <- x + dX_n and StepInfo(loss, G = -direction)."""
        x, dx = (state.x[0], dw[0]) if self.single else (state.x, dw)
        ascent, quadratic = _ascent(self.sde, state.theta, x, dx, dt)
        direction = tree_map(lambda g: g / dt, ascent)
        return state._replace(x=state.x + dw), StepInfo(quadratic / (2 * dt), tree_map(torch.neg, direction))


def as_state(state: SGDCTState, x0: torch.Tensor) -> State:
    """The driver's state for ``DriftEstimation``, from the estimator and the first observations.

    Args:
        state: The estimator (``init``).
        x0: The first observation: (P, d) for P paths, or (d,) for a single path (held as (1, d)).

    Returns:
        ``State(x=x0, x_tilde=(), theta, t)``; add an update rule's state with
        ``fwdtrain.core.state.with_optimizer``.
    """
    return State(x0[None] if x0.ndim == 1 else x0, (), state.theta, state.t)


def check_inputs(sde: SDE, state: SGDCTState, x: Any, dx: Any, dt: Any, lr: Any) -> None:
    """Raise a clear error for anything ``step`` cannot use.

    Raises:
        TypeError: ``sde`` is not an SDE, ``state`` not an ``SGDCTState``, or tensors of another dtype.
        ValueError: A non-positive dt, a bad learning rate, or x and dx not both (d,) or (P, d).
    """
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
        raise ValueError(
            f"x and dx must be an observation and its increment, both of shape (d,) "
            f"(or (paths, d)); got {tuple(x.shape)} and {tuple(dx.shape)}"
        )
    evaluate_once(sde, state.theta, x if x.ndim == 1 else x[0], name="x")


def step_with_info(
    sde: SDE, state: SGDCTState, x: torch.Tensor, dx: torch.Tensor, dt: Any, lr: LearningRate
) -> tuple[SGDCTState, SGDCTInfo]:
    """``step`` that also returns the ``SGDCTInfo`` at step n: ``DriftEstimation``'s step on the observation x."""
    check_inputs(sde, state, x, dx, dt, lr)
    alpha = learning_rate(lr, state.t)
    _checks.check_alpha(alpha, state.t, lr)
    single = x.ndim == 1
    problem = DriftEstimation(sde, single=single)
    start = State(x[None] if single else x, (), state.theta, state.t)
    new, info = problem.advance(start, dx[None] if single else dx, dt, alpha, "reverse")
    return SGDCTState(new.theta, new.t), SGDCTInfo(info.cost, tree_map(torch.neg, info.gradient))


def step(sde: SDE, state: SGDCTState, x: torch.Tensor, dx: torch.Tensor, dt: Any, lr: LearningRate) -> SGDCTState:
    """One pure SGDCT update: theta_{n+1} = theta_n + alpha(t_n) J_n' a_n^{-1} (dx - mu(x; theta_n) h).

    Args:
        sde: The model; its drift is estimated, its diffusion is the known noise.
        state: The estimator (``SGDCTState``).
        x: The observation X_n, shape (d,), or (P, d) for P independent paths (their updates are averaged).
        dx: Its increment X_{n+1} - X_n, shaped like x.
        dt: The observation step h > 0.
        lr: The learning rate: a number, a 0-d tensor or a schedule t -> alpha(t).

    Returns:
        The new ``SGDCTState``.

    Raises:
        TypeError, ValueError: As ``check_inputs``.
    """
    return step_with_info(sde, state, x, dx, dt, lr)[0]


__all__ = [
    "DriftEstimation",
    "SGDCTInfo",
    "SGDCTState",
    "as_state",
    "check_inputs",
    "init",
    "step",
    "step_with_info",
]
