"""Online calibration of an SDE's stationary distribution: objectives nonlinear in expectations.

    dX = mu(X, theta) dt + sigma(X, theta) dW,      phi(theta, x) in R^k (observables)
    J(theta) = sum_j w_j (E_theta[phi_j(X)] - m_j)^2,   E_theta the stationary expectation
    grad J   = 2 sum_j w_j (E phi_j - m_j) dE[phi_j]/dtheta,   dE[phi_j]/dtheta = lim_t E[D phi_j(X_t)]

with D phi = phi_x Xtilde + phi_theta the total derivative along the sensitivity
(``fwdtrain.sensitivity``). The gradient is a product of two expectations; the
mean of a product of estimates taken from the same particles is biased by their
covariance (Cov(phi, D phi) / N per step, which time averaging does not remove),
so the step splits the N particles into two independent halves A and B:

    G = sum_j w_j [ (phibar_j^A - m_j) Dphibar_j^B + (phibar_j^B - m_j) Dphibar_j^A ]

With theta fixed the halves are driven by independent noise, so each product is an
unbiased estimate of (E phi_j - m_j) dE[phi_j]/dtheta and G of grad J. (A running
average of phi would also work, but it lags theta and needs its own time scale; the
split needs nothing and costs no extra particles beyond an even N.)
X and Xtilde are advanced by the same Euler-Maruyama update as in ``fwdtrain.step``;
theta <- theta - alpha h G. A ``Calibration`` is a ``fwdtrain.trainable.Trainable``: ``fwdtrain.run``
trains it like an SDE (compiled, fused and distributed included; ``run`` below is that call).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch

from . import _checks
from ._tree import tree_map
from .problem import SDE, Coefficients, Theta
from .sensitivity import MODES, Mode, choose_mode, linearise_particles
from .state import State, init as _init_state, noise_dim
from .driver import run as driver_run
from .euler import GradientReduce, LearningRate, StepInfo, euler_update, learning_rate, update_parameters
from .optim import GradientTransformation
from .history import History
from .stepping import check_step_inputs

Observables = Callable[[Theta, torch.Tensor], torch.Tensor]


class Calibration(NamedTuple):
    """What to calibrate: the SDE (its ``cost`` is not used), observables phi(theta, x) -> (k,), targets m (k,)
    and weights w (k,)."""

    sde: SDE
    observables: Observables
    targets: torch.Tensor
    weights: torch.Tensor
    optimizer: GradientTransformation | None = None  # the update rule (fwdtrain.optim); None: plain sgd

    def with_optimizer(self, optimizer: GradientTransformation | None) -> "Calibration":
        """This calibration updated by ``optimizer`` (its state in ``State.opt_state``)."""
        return self._replace(optimizer=optimizer)

    # ---- the fwdtrain.trainable.Trainable protocol: what fwdtrain.run needs ----
    def check(self, state: State, dt: Any, lr: Any) -> None:
        """The input checks of ``step`` (an even N included), for a step of size dt at rate lr."""
        m = noise_dim(self.sde, state.theta, state.x)
        check_inputs(self, state, torch.zeros((state.particles, m), dtype=state.x.dtype, device=state.x.device),
                     dt, lr)

    def resolve_mode(self, state: State, mode: Mode) -> str:
        """The derivative mode "auto" stands for (the cheaper for these outputs), or ``mode`` itself."""
        return resolve_mode(self, state, mode)

    def noise_shape(self, state: State) -> tuple[int, ...]:
        """(N, m): Brownian increments of the SDE."""
        return (state.particles, noise_dim(self.sde, state.theta, state.x))

    def advance(self, state: State, dw: torch.Tensor, dt: Any, alpha: Any, mode: str,
                reduce: GradientReduce | None = None) -> tuple[State, StepInfo]:
        """``calibration.advance`` with its info read as ``StepInfo(cost=objective, gradient=G)``."""
        new_state, info = advance(self, state, dw, dt, alpha, mode, reduce)
        return new_state, StepInfo(info.objective, info.gradient)

    def record(self, state: State) -> Any:
        """theta, recorded in the history."""
        return state.theta


class CalibrationInfo(NamedTuple):
    """At time n: ``moments`` (k,) particle means of phi; ``objective`` the unbiased two-group estimate
    sum_j w_j (phibar_j^A - m_j)(phibar_j^B - m_j) of J; ``gradient`` G (a pytree like theta)."""

    moments: torch.Tensor
    objective: torch.Tensor
    gradient: Any


def _zero_cost(theta: Theta, x: torch.Tensor) -> torch.Tensor:
    return x.sum() * 0


def calibration(drift, diffusion, observables: Observables, targets, weights=None, *,
                optimizer: GradientTransformation | None = None) -> Calibration:
    """Build a ``Calibration`` from drift(theta, x), diffusion(theta, x), phi(theta, x) and targets (k,).

    weights default to ones; ``optimizer`` is the update rule (a ``fwdtrain.optim`` transformation; None: plain sgd). targets and weights are cast to the parameters' dtype when used.
    """
    if not callable(observables):
        raise TypeError(f"observables must be a function (theta, x) -> (k,) tensor, got {type(observables).__name__}")
    targets = torch.as_tensor(targets)
    if targets.ndim != 1 or targets.numel() == 0:
        raise ValueError(f"targets must be a non-empty 1-d tensor (one per observable), got shape {tuple(targets.shape)}")
    weights = torch.ones_like(targets) if weights is None else torch.as_tensor(weights, dtype=targets.dtype)
    if weights.shape != targets.shape or bool((weights < 0).any()):
        raise ValueError(f"weights must be non-negative with the shape of targets {tuple(targets.shape)}, "
                         f"got {weights.tolist()}")
    if optimizer is not None and not isinstance(optimizer, GradientTransformation):
        raise TypeError(f"optimizer must be a fwdtrain.optim.GradientTransformation or None, "
                        f"got {type(optimizer).__name__}")
    return Calibration(SDE(drift, diffusion, _zero_cost), observables, targets, weights, optimizer)


def _coefficients(problem: Calibration):
    def coefficients(theta: Theta, x: torch.Tensor) -> Coefficients:
        return Coefficients(problem.sde.drift(theta, x), problem.sde.diffusion(theta, x), problem.observables(theta, x))
    return coefficients


def init(problem: Calibration, theta: Theta, x0: torch.Tensor, particles: int | None = None, *,
         average_from: Any = None, allow_low_precision: bool = False) -> State:
    """``fwdtrain.init`` for a calibration: N must be even (two independent halves); phi is checked to be (k,).

    The opt_state is that of ``problem.optimizer`` (``calibration(..., optimizer=...)`` or
    ``problem.with_optimizer(rule)``); ``average_from=t0`` starts a Polyak-Ruppert average."""
    if not isinstance(problem, Calibration):
        raise TypeError(f"init(problem, ...) expects a fwdtrain.calibration.Calibration, got {type(problem).__name__}")
    state = _init_state(problem.sde, theta, x0, particles, optimizer=problem.optimizer, average_from=average_from,
                        allow_low_precision=allow_low_precision)
    if state.particles % 2:
        raise ValueError(f"a calibration needs an even number of particles (two independent halves), "
                         f"got {state.particles}")
    phi = problem.observables(state.theta, state.x[0])
    if not isinstance(phi, torch.Tensor) or phi.shape != problem.targets.shape:
        raise ValueError(f"observables returned {tuple(getattr(phi, 'shape', ()))} but targets have shape "
                         f"{tuple(problem.targets.shape)}")
    return state


def advance(problem: Calibration, state: State, dw: torch.Tensor, dt: Any, alpha: Any,
            mode: str, reduce: GradientReduce | None = None) -> tuple[State, CalibrationInfo]:
    """The calibration step without input checks (see the module docstring).

    ``reduce`` maps G before the update (as in ``fwdtrain.euler.advance``); None keeps it.
    Pure and transformable (``torch.func.grad``, ``vmap``, ...), like ``fwdtrain.euler.advance``.
    """
    value, total = linearise_particles(_coefficients(problem), state.theta, state.x, state.x_tilde, mode)
    x, x_tilde = euler_update(state, value, total, dw, dt)
    half = state.particles // 2
    targets = problem.targets.to(value.cost)
    weights = problem.weights.to(value.cost)
    error_a = value.cost[:half].mean(0) - targets
    error_b = value.cost[half:].mean(0) - targets

    def gradient_leaf(d_phi: torch.Tensor) -> torch.Tensor:  # (N, k, *s) -> (*s)
        mean_a, mean_b = d_phi[:half].mean(0), d_phi[half:].mean(0)
        return torch.tensordot(weights * error_a, mean_b, dims=1) + torch.tensordot(weights * error_b, mean_a, dims=1)

    gradient = tree_map(gradient_leaf, total.cost)
    if reduce is not None:
        gradient = reduce(gradient)
    new_state = update_parameters(state, gradient, alpha, dt, problem.optimizer)._replace(x=x, x_tilde=x_tilde)
    info = CalibrationInfo(value.cost.mean(0), (weights * error_a * error_b).sum(), gradient)
    return new_state, info


def resolve_mode(problem: Calibration, state: State, mode: Mode) -> str:
    """The derivative mode for this problem and state: ``mode``, or for "auto" the cheaper by output count."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return choose_mode(mode, state.theta, _coefficients(problem)(state.theta, state.x[0]))


def check_inputs(problem: Calibration, state: State, dw: torch.Tensor, dt: Any, lr: Any) -> None:
    """Raise a clear error for anything ``step`` cannot use (an odd N, a dw of the wrong shape, ...)."""
    if not isinstance(problem, Calibration):
        raise TypeError(f"expected a fwdtrain.calibration.Calibration, got {type(problem).__name__}")
    check_step_inputs(problem.sde, state, dw, dt, lr, problem.optimizer)
    if state.particles % 2:
        raise ValueError(f"a calibration needs an even number of particles, got {state.particles}")
    m = noise_dim(problem.sde, state.theta, state.x)
    if dw.shape[1] != m:
        raise ValueError(f"dw has shape {tuple(dw.shape)} but the diffusion needs ({state.particles}, {m})")


def step_with_info(problem: Calibration, state: State, dw: torch.Tensor, dt: Any, lr: LearningRate,
                   *, mode: Mode = "auto") -> tuple[State, CalibrationInfo]:
    """One pure calibration step and its ``CalibrationInfo`` at time n."""
    check_inputs(problem, state, dw, dt, lr)
    alpha = learning_rate(lr, state.t)
    _checks.check_alpha(alpha, state.t, lr)
    return advance(problem, state, dw, dt, alpha, resolve_mode(problem, state, mode))


def step(problem: Calibration, state: State, dw: torch.Tensor, dt: Any, lr: LearningRate,
         *, mode: Mode = "auto") -> State:
    """One pure Euler-Maruyama calibration step: (X, Xtilde, theta, t) at n -> n + 1 (see the module docstring)."""
    return step_with_info(problem, state, dw, dt, lr, mode=mode)[0]


def run(problem: Calibration, state: State, steps: int, dt: float, lr: LearningRate, seed: int = 0,
        **options: Any) -> tuple[State, History]:
    """``fwdtrain.run(problem, state, steps, dt, lr, seed, **options)``: train a calibration.

    The returned ``fwdtrain.History`` records the two-group estimate of J as ``cost`` (averaged
    since the previous record) and |G| as ``grad_norm``; noise, checks, checkpoints and the
    other options are those of ``fwdtrain.run``.
    """
    return driver_run(problem, state, steps, dt, lr, seed, **options)


__all__ = ["Calibration", "CalibrationInfo", "calibration", "init", "step",
           "step_with_info", "advance", "check_inputs", "resolve_mode", "run"]
