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
X and Xtilde are advanced by the problem's solver (``Euler()`` by default; phi is evaluated at
time n, as the cost is) and theta <- theta - alpha h G. A ``Calibration`` is a
``fwdtrain.problems.Trainable``: ``fwdtrain.run`` trains it like an SDE (compiled and distributed
included).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ..core import _checks
from ..core._tree import size, tree_map
from ..core.problem import SDE
from ..core.sensitivity import MODES, Mode, Plan, Theta, resolve_mode
from ..core.solvers import EULER, Solver, as_solver
from ..core.state import State, noise_dim
from ..core.state import init as init_state
from ..core.step import LearningRate, StepInfo, learning_rate, particle_terms
from ..optim import GradientTransformation, check_optimizer
from .cost import check_solver, check_step_inputs, nonfinite_part
from .trainable import Trainable

Observables = Callable[[Theta, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Calibration(Trainable):
    """A calibration problem for ``fwdtrain.run``: J(theta) = sum_j w_j (E_theta[phi_j(X)] - m_j)^2.

    Build it with ``calibration(...)``, make its state with ``calibration.init``.

    Attributes:
        sde: The SDE whose stationary law is fitted (its ``cost`` is not used).
        observables: phi(theta, x) -> (k,), of one particle x (d,).
        targets: m, shape (k,).
        weights: w >= 0, shape (k,).
        solver: The scheme (default ``Euler()``).
        optimizer: The update rule (a ``fwdtrain.optim`` transformation; None: plain sgd).
    """

    sde: SDE
    observables: Observables
    targets: torch.Tensor
    weights: torch.Tensor
    solver: Solver = EULER
    optimizer: GradientTransformation | None = None

    # ---- the Trainable interface ----
    def check(self, state: State, dt: Any, lr: Any) -> None:
        """The input checks of ``step`` (an even N included), for a step of size dt at rate lr."""
        if self.sde.jumps is not None:
            raise ValueError(
                "calibration fits the stationary law of an SDE without jumps; its two-group estimate does not "
                "carry the events' score. Train an SDE with jumps on its cost (fwdtrain.run(sde, ...))"
            )
        m = noise_dim(self.sde, state.theta, state.x)
        check_inputs(self, state, torch.zeros((state.particles, m), dtype=state.x.dtype, device=state.x.device), dt, lr)
        check_solver(self.solver, self.sde, state.theta, state.x[0])

    def plan(self, state: State, mode: str = "auto") -> Plan:
        """The derivative mode "auto" stands for (the solver's, or the cheaper for these outputs), or ``mode``."""
        return Plan(resolve_mode_for(self, state, self.solver.mode if mode == "auto" else mode))

    def noise_shape(self, state: State) -> tuple[int, ...]:
        """(N, m): Brownian increments of the SDE."""
        return (state.particles, noise_dim(self.sde, state.theta, state.x))

    def propagate(self, state: State, dw: torch.Tensor, dt: Any, plan: Any) -> tuple[State, StepInfo]:
        """X, Xtilde to n + 1 and StepInfo(objective, G) (``calibration.propagate``)."""
        moved, info = propagate(self, state, dw, dt, plan)
        return moved, StepInfo(info.objective, info.gradient)

    def nonfinite(self, state: State) -> str | None:
        return nonfinite_part(
            (("drift", self.sde.drift), ("diffusion", self.sde.diffusion), ("observables", self.observables)), state
        )

    @property
    def observed(self) -> SDE:
        """The SDE with phi as its "cost" term, so that the solver sees mu, sigma and phi (and the Milstein
        correction) through the one term table of ``SDE``; made once, with the calibration."""
        return self.__dict__["_observed"]

    def __post_init__(self) -> None:
        observed = SDE(self.sde.drift, self.sde.diffusion, self.observables, noise_type=self.sde.noise_type)
        object.__setattr__(self, "_observed", observed)


class CalibrationInfo(NamedTuple):
    """At time n: ``moments`` (k,) particle means of phi; ``objective`` the unbiased two-group estimate
    sum_j w_j (phibar_j^A - m_j)(phibar_j^B - m_j) of J; ``gradient`` G (a pytree like theta)."""

    moments: torch.Tensor
    objective: torch.Tensor
    gradient: Any


def _zero_cost(theta: Theta, x: torch.Tensor) -> torch.Tensor:
    return x.sum() * 0


def calibration(
    drift: Callable,
    diffusion: Callable,
    observables: Observables,
    targets: Any,
    weights: Any = None,
    *,
    solver: Solver | str | None = None,
    optimizer: GradientTransformation | None = None,
) -> Calibration:
    """Build a ``Calibration``: fit theta so that stationary expectations of phi hit the targets.

    Args:
        drift: ``drift(theta, x) -> (d,)``, as for ``fwdtrain.SDE``.
        diffusion: ``diffusion(theta, x) -> (d, m)`` or (d,).
        observables: ``phi(theta, x) -> (k,)``, of one particle.
        targets: m, k numbers (cast to the parameters' dtype when used).
        weights: w >= 0, k numbers (default ones).
        solver: Keyword only. The scheme (default ``Euler()``).
        optimizer: Keyword only. The update rule (a ``fwdtrain.optim`` transformation; None: plain sgd).

    Returns:
        The ``Calibration``.

    Raises:
        TypeError: Observables that are not callable, or an optimizer that is not a transformation.
        ValueError: Targets that are not a non-empty 1-d tensor, or weights of another shape or negative.
    """
    if not callable(observables):
        raise TypeError(f"observables must be a function (theta, x) -> (k,) tensor, got {type(observables).__name__}")
    targets = torch.as_tensor(targets)
    if targets.ndim != 1 or targets.numel() == 0:
        raise ValueError(
            f"targets must be a non-empty 1-d tensor (one per observable), got shape {tuple(targets.shape)}"
        )
    weights = torch.ones_like(targets) if weights is None else torch.as_tensor(weights, dtype=targets.dtype)
    check_optimizer(optimizer)
    if weights.shape != targets.shape or bool((weights < 0).any()):
        raise ValueError(
            f"weights must be non-negative with the shape of targets {tuple(targets.shape)}, got {weights.tolist()}"
        )
    return Calibration(SDE(drift, diffusion, _zero_cost), observables, targets, weights, as_solver(solver), optimizer)


def init(
    problem: Calibration,
    theta: Theta,
    x0: torch.Tensor,
    particles: int | None = None,
    *,
    average_from: Any = None,
    allow_low_precision: bool = False,
) -> State:
    """``fwdtrain.init`` for a calibration: the state at t = 0, with an even number of particles.

    Args:
        problem: The ``Calibration``.
        theta: The initial parameters.
        x0: (d,) or (N, d), as for ``fwdtrain.init``.
        particles: N, even (two independent halves).
        average_from: Keyword only. t0: start a Polyak-Ruppert average of theta over t_n >= t0.
        allow_low_precision: Keyword only. As for ``fwdtrain.init``.

    Returns:
        The ``State``; its opt_state is that of ``problem.optimizer``.

    Raises:
        TypeError, ValueError: As ``fwdtrain.init``; an odd N; observables that do not return (k,).
    """
    if not isinstance(problem, Calibration):
        raise TypeError(f"init(problem, ...) expects a fwdtrain.calibration.Calibration, got {type(problem).__name__}")
    state = init_state(
        problem.sde,
        theta,
        x0,
        particles,
        optimizer=problem.optimizer,
        average_from=average_from,
        allow_low_precision=allow_low_precision,
    )
    if state.particles % 2:
        raise ValueError(
            f"a calibration needs an even number of particles (two independent halves), got {state.particles}"
        )
    phi = problem.observables(state.theta, state.x[0])
    if not isinstance(phi, torch.Tensor) or phi.shape != problem.targets.shape:
        raise ValueError(
            f"observables returned {tuple(getattr(phi, 'shape', ()))} but targets have shape "
            f"{tuple(problem.targets.shape)}"
        )
    return state


def propagate(
    problem: Calibration, state: State, dw: torch.Tensor, dt: Any, plan: Plan
) -> tuple[State, CalibrationInfo]:
    """X and Xtilde at n + 1 (the problem's solver) and the ``CalibrationInfo`` at n; theta untouched."""

    terms = particle_terms(problem.observed, state.theta, plan)
    moved = problem.solver.step(terms, state.x, state.x_tilde, dw, dt)
    half = state.particles // 2
    phi = moved.value["cost"]
    targets, weights = problem.targets.to(phi), problem.weights.to(phi)
    error_a = phi[:half].mean(0) - targets
    error_b = phi[half:].mean(0) - targets

    def gradient_leaf(d_phi: torch.Tensor) -> torch.Tensor:  # (N, k, *s) -> (*s)
        mean_a, mean_b = d_phi[:half].mean(0), d_phi[half:].mean(0)
        return torch.tensordot(weights * error_a, mean_b, dims=1) + torch.tensordot(weights * error_b, mean_a, dims=1)

    gradient = tree_map(gradient_leaf, moved.total["cost"])
    info = CalibrationInfo(phi.mean(0), (weights * error_a * error_b).sum(), gradient)
    return state._replace(x=moved.x, x_tilde=moved.x_tilde), info


def resolve_mode_for(problem: Calibration, state: State, mode: Mode | str) -> str:
    """The derivative mode for this problem and state: ``mode``, or for "auto" the cheaper by output count."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    value = problem.observed.terms(state.theta, state.x[0])
    outputs = value["mu"].numel() + value["sigma"].numel() + value["cost"].numel()
    return resolve_mode(mode, outputs, size(state.theta))


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


def step_with_info(
    problem: Calibration, state: State, dw: torch.Tensor, dt: Any, lr: LearningRate, *, mode: Mode = "auto"
) -> tuple[State, CalibrationInfo]:
    """``step``, also returning the step's ``CalibrationInfo`` (moments, objective estimate, gradient) at time n."""
    check_inputs(problem, state, dw, dt, lr)
    check_solver(problem.solver, problem.sde, state.theta, state.x[0])
    alpha = learning_rate(lr, state.t)
    _checks.check_alpha(alpha, state.t, lr)
    moved, info = propagate(problem, state, dw, dt, problem.plan(state, mode))
    return problem.update(moved, info.gradient, alpha, dt), info


def step(
    problem: Calibration, state: State, dw: torch.Tensor, dt: Any, lr: LearningRate, *, mode: Mode = "auto"
) -> State:
    """One pure calibration step: (X, Xtilde, theta, t) at n -> n + 1 (see the module docstring).

    Args:
        problem: The ``Calibration``.
        state: The current ``State`` (N even).
        dw: Brownian increments, shape (N, m).
        dt: The step h > 0.
        lr: The learning rate: a number, a 0-d tensor or a schedule t -> alpha(t).
        mode: Keyword only. ``"auto"``, ``"reverse"`` or ``"forward"``.

    Returns:
        The new ``State``.

    Raises:
        TypeError, ValueError: Inputs the step cannot use, as for ``fwdtrain.step``, or an odd N.
    """
    return step_with_info(problem, state, dw, dt, lr, mode=mode)[0]


__all__ = [
    "Calibration",
    "CalibrationInfo",
    "calibration",
    "check_inputs",
    "init",
    "propagate",
    "resolve_mode_for",
    "step",
    "step_with_info",
]
