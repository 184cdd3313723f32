"""The kernel: one unchecked, pure step of the training state (X, Xtilde, theta, t), right-hand sides at time n.

    X_{n+1}, Xtilde_{n+1} = Phi(X_n, theta_n, dW_n, h) and its sensitivity    (the solver, ``solvers``)
    theta_{n+1}           = theta_n - alpha(t_n) h G_n,   G_n = mean_i D c(X_n^i)  (or theta_n + s_n of a rule)
    t_{n+1}               = t_n + h

where D is the total derivative along the sensitivity (``sensitivity``). With a ``fwdtrain.optim``
rule, s_n, opt_state_{n+1} = update(G_n, opt_state_n, theta_n, alpha(t_n) h); a Polyak-Ruppert
average in the state takes in theta_{n+1} when t_{n+1} >= t0.

The step is two pure pieces, so that a gradient hook (an all-reduce across processes) can run
between them: ``propagate`` (X, Xtilde to n + 1, and G_n) and ``update_parameters`` (theta, t);
``fwdtrain.problems.Trainable.advance`` joins them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ..optim import Average, GradientTransformation, apply_updates, average_update
from ._tree import tree_map
from .problem import SDE
from .sensitivity import Plan, Terms, evaluate_particles, over_particles
from .solvers import EULER, Solver, TermsAt
from .state import State

LearningRate = float | torch.Tensor | Callable[[torch.Tensor], Any]
GradientReduce = Callable[[Any], Any]


class StepInfo(NamedTuple):
    """Diagnostics of a step, evaluated at time n: particle-mean cost and gradient estimate G_n."""

    cost: torch.Tensor
    gradient: Any


def learning_rate(lr: LearningRate, t: torch.Tensor) -> Any:
    """alpha(t): a schedule is called on t, a number is returned as it is."""
    return lr(t) if callable(lr) else lr


def descend(theta: Any, gradient: Any, alpha: Any, dt: Any) -> Any:
    """theta_{n+1} = theta_n - alpha h G_n, each leaf kept in its dtype.

    alpha(t_n) from a schedule is float64 like the clock t; it would promote a 0-d leaf.
    """
    return tree_map(lambda th, g: th - ((alpha * dt) * g).to(th.dtype), theta, gradient)


def average_step(average: Any, theta: Any, t: Any) -> Any:
    """The state's Polyak-Ruppert average with theta at time t taken in (``optim.average_update``); ``()`` stays."""
    if not isinstance(average, Average):
        return average
    return average_update(average, theta, t)


def update_parameters(
    state: State, gradient: Any, alpha: Any, dt: Any, optimizer: GradientTransformation | None = None
) -> State:
    """theta, opt_state, t and average at n + 1 (x and x_tilde untouched), from G_n = ``gradient``:

        optimizer None:  theta_{n+1} = theta_n - alpha h G_n                   (``descend``)
        a rule:          s_n, opt_{n+1} = update(G_n, opt_n, theta_n, alpha h),  theta_{n+1} = theta_n + s_n
        t_{n+1} = t_n + h;  average_{n+1} = average_n with theta_{n+1} in when t_{n+1} >= t0

    Shared by every problem's step (cost form, calibration, SGDCT). Pure and branch-free on values.
    """
    if optimizer is None:
        theta, opt_state = descend(state.theta, gradient, alpha, dt), state.opt_state
    else:
        updates, opt_state = optimizer.update(gradient, state.opt_state, state.theta, alpha * dt)
        theta = apply_updates(state.theta, updates)
    t = state.t + dt
    return state._replace(theta=theta, opt_state=opt_state, t=t, average=average_step(state.average, theta, t))


def particle_terms(sde: SDE, theta: Any, plan: Plan | None = None) -> TermsAt:
    """``terms(x (N, d), x_tilde, names) -> (values, totals)`` of ``sde`` at theta for N particles: the totals
    D h along x_tilde by ``plan``, or ``{}`` for x_tilde None (theta frozen: values only, one ``vmap``)."""

    def terms(x: torch.Tensor, x_tilde: Any, names: tuple[str, ...]) -> tuple[Terms, Terms]:
        if x_tilde is None:
            return evaluate_particles(lambda xi: sde.terms(theta, xi, names), x), {}
        assert plan is not None, "a linearisation needs the run's plan"
        return over_particles(lambda xi, xti: sde.linearise_terms(theta, xi, xti, plan, names), x, x_tilde)

    return terms


def check_increments(dw: torch.Tensor, sigma: torch.Tensor, particles: int) -> None:
    """Raise unless dw (N, m) fits the particles' diffusion sigma (N, d) (diagonal: m = d) or (N, d, m)."""
    expected_m = sigma.shape[1] if sigma.ndim == 2 else sigma.shape[-1]
    if dw.shape[1] != expected_m:
        raise ValueError(
            f"dw has shape {tuple(dw.shape)} but the diffusion needs ({particles}, {expected_m}) Brownian increments"
        )


def propagate(
    sde: SDE, state: State, dw: torch.Tensor, dt: Any, plan: Plan, solver: Solver = EULER
) -> tuple[State, StepInfo]:
    """(the state with X and Xtilde at n + 1, StepInfo(mean_i c(X_n^i), G_n)); theta and t untouched."""
    terms = particle_terms(sde, state.theta, plan)

    def checked(x: torch.Tensor, x_tilde: Any, names: tuple[str, ...]) -> tuple[Terms, Terms]:
        value, total = terms(x, x_tilde, names)
        check_increments(dw, value["sigma"], state.particles)
        return value, total

    moved = solver.step(checked, state.x, state.x_tilde, dw, dt)
    gradient = tree_map(lambda g: g.mean(0), moved.total["cost"])
    return state._replace(x=moved.x, x_tilde=moved.x_tilde), StepInfo(moved.value["cost"].mean(), gradient)


__all__ = [
    "GradientReduce",
    "LearningRate",
    "StepInfo",
    "average_step",
    "check_increments",
    "descend",
    "learning_rate",
    "particle_terms",
    "propagate",
    "update_parameters",
]
