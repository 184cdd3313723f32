"""One unchecked, pure step of the training state (X, Xtilde, theta, t), right-hand sides at time n.

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
from torch.func import vmap

from ..optim import Average, GradientTransformation, apply_updates, average_update
from ._tree import tree_map
from .problem import JUMP_NAMES, SDE, Event
from .sensitivity import Plan, Terms, evaluate_particles, over_particles
from .solvers import EULER, Moved, Solver, TermsAt
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
    rate = alpha * dt

    def descended(th: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        change = rate * g
        return th - (change if change.dtype == th.dtype else change.to(th.dtype))

    return tree_map(descended, theta, gradient)


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


class Events(NamedTuple):
    """A step's jump draws for N particles: dN (N,) in {0, 1} and the marks z (N, *event_shape)."""

    dn: torch.Tensor
    z: torch.Tensor


def particle_terms(
    sde: SDE, theta: Any, plan: Plan | None = None, events: Events | None = None, dt: Any = None
) -> TermsAt:
    """``terms(x (N, d), x_tilde, names) -> (values, totals)`` of ``sde`` at theta for N particles: the totals
    D h along x_tilde by ``plan``, or ``{}`` for x_tilde None (theta frozen: values only, one ``vmap``).
    With ``events`` the terms also hold each particle's ``jump`` and, for a rate that varies, ``likelihood``."""
    if events is None:

        def terms(x: torch.Tensor, x_tilde: Any, names: tuple[str, ...]) -> tuple[Terms, Terms]:
            if x_tilde is None:
                return evaluate_particles(lambda xi: sde.terms(theta, xi, names), x), {}
            assert plan is not None, "a linearisation needs the run's plan"
            return over_particles(lambda xi, xti: sde.linearise_terms(theta, xi, xti, plan, names), x, x_tilde)

        return terms
    assert sde.jumps is not None
    extra = ("jump",) if sde.jumps.constant else JUMP_NAMES

    def jump_terms(x: torch.Tensor, x_tilde: Any, names: tuple[str, ...]) -> tuple[Terms, Terms]:
        names = names + extra
        if x_tilde is None:
            one = lambda xi, dni, zi: sde.terms(theta, xi, names, Event(dni, zi, dt))
            return vmap(one)(x, events.dn, events.z), {}
        assert plan is not None, "a linearisation needs the run's plan"

        def linearise_one(xi: torch.Tensor, packed: Any) -> tuple[Terms, Terms]:
            xti, dni, zi = packed
            return sde.linearise_terms(theta, xi, xti, plan, names, Event(dni, zi, dt))

        return over_particles(linearise_one, x, (x_tilde, events.dn, events.z))

    return jump_terms


def draw_events(sde: SDE, theta: Any, x: torch.Tensor, normals: torch.Tensor, dt: Any) -> Events:
    """The step's events by thinning: dN^i = 1[U^i < 1 - exp(-lambda(X_n^i) h)], U^i = Phi(w_0^i / sqrt(h)), and
    the marks from the other columns, for N particles x (N, d) and the jump columns ``normals`` (N, w) of dw."""
    jumps = sde.jumps
    assert jumps is not None
    u, z = jumps.draws(normals / dt**0.5)
    if jumps.constant:
        rate = sde.jump_rate(theta, x[0])
    else:
        rate = vmap(lambda xi: sde.jump_rate(theta, xi))(x)
    dn = (u < jumps.probability(rate, dt)).to(x.dtype)
    return Events(dn, z)


def check_increments(dw: torch.Tensor, sigma: torch.Tensor, particles: int, jump_width: int = 0) -> None:
    """Raise unless dw (N, m + w) fits the particles' diffusion sigma (N, d) (diagonal: m = d) or (N, d, m) and
    the jumps' w draws (0 without jumps)."""
    expected_m = sigma.shape[1] if sigma.ndim == 2 else sigma.shape[-1]
    if dw.shape[1] != expected_m + jump_width:
        if jump_width:
            raise ValueError(
                f"dw has shape {tuple(dw.shape)} but the SDE needs ({particles}, {expected_m + jump_width}): "
                f"{expected_m} Brownian increments and {jump_width} jump draws (one for the event, one per mark number)"
            )
        raise ValueError(
            f"dw has shape {tuple(dw.shape)} but the diffusion needs ({particles}, {expected_m}) Brownian increments"
        )


def move(
    sde: SDE,
    theta: Any,
    solver: Solver,
    x: torch.Tensor,
    x_tilde: Any,
    dw: torch.Tensor,
    dt: Any,
    plan: Plan | None = None,
) -> Moved:
    """The solver's step of N particles (``Solver.step``) with the SDE's jumps: dw (N, m + w) is cut into the
    Brownian increments (N, m) and the jump draws (N, w) (``draw_events``); x_tilde None freezes theta.
    Every problem that integrates an SDE steps through here."""
    width = 0 if sde.jumps is None else sde.jumps.width
    brownian = dw if width == 0 else dw[:, : dw.shape[1] - width]
    events = None if sde.jumps is None else draw_events(sde, theta, x, dw[:, dw.shape[1] - width :], dt)
    terms = particle_terms(sde, theta, plan, events, dt)

    def checked(x: torch.Tensor, x_tilde: Any, names: tuple[str, ...]) -> tuple[Terms, Terms]:
        value, total = terms(x, x_tilde, names)
        check_increments(dw, value["sigma"], x.shape[0], width)
        return value, total

    return solver.step(checked, x, x_tilde, brownian, dt)


def score_gradient(cost: torch.Tensor, d_cost: Any, score: Any) -> Any:
    """G = mean_i [D c^i + (c^i - b^i) S^i], b^i the mean cost of the other particles (0 for N = 1): the
    pathwise derivative plus the likelihood-ratio term of the events. b^i is independent of particle i's
    events, so it leaves the estimate unbiased and only lowers its variance."""
    n = cost.shape[0]
    baseline = (cost.sum() - cost) / (n - 1) if n > 1 else torch.zeros_like(cost)
    centred = cost - baseline
    return tree_map(lambda g, s: (g + centred.reshape((n,) + (1,) * (s.ndim - 1)) * s).mean(0), d_cost, score)


def propagate(
    sde: SDE, state: State, dw: torch.Tensor, dt: Any, plan: Plan, solver: Solver = EULER
) -> tuple[State, StepInfo]:
    """(the state with X and Xtilde (and the score) at n + 1, StepInfo(mean_i c(X_n^i), G_n)); theta and t
    untouched. G_n = mean_i D c(X_n^i), plus the score term (``score_gradient``) when the state carries one."""
    moved = move(sde, state.theta, solver, state.x, state.x_tilde, dw, dt, plan)
    cost = moved.value["cost"]
    if isinstance(state.score, tuple) and not state.score:
        gradient = tree_map(particle_mean, moved.total["cost"])
        return state._replace(x=moved.x, x_tilde=moved.x_tilde), StepInfo(particle_mean(cost), gradient)
    gradient = score_gradient(cost, moved.total["cost"], state.score)
    score = tree_map(torch.add, state.score, moved.total["likelihood"])
    return state._replace(x=moved.x, x_tilde=moved.x_tilde, score=score), StepInfo(particle_mean(cost), gradient)


def particle_mean(leaf: torch.Tensor) -> torch.Tensor:
    """(1/N) sum_i over the leading particle axis; for one particle the particle itself (the same number,
    without a reduction kernel)."""
    return leaf[0] if leaf.shape[0] == 1 else leaf.mean(0)


__all__ = [
    "Events",
    "GradientReduce",
    "LearningRate",
    "StepInfo",
    "average_step",
    "check_increments",
    "descend",
    "draw_events",
    "learning_rate",
    "move",
    "particle_mean",
    "particle_terms",
    "propagate",
    "score_gradient",
    "update_parameters",
]
