"""The kernel: one unchecked, pure Euler-Maruyama step of (X, Xtilde, theta, t), right-hand sides at time n.

    X_{n+1}      = X_n + mu h + sigma dW_n
    Xtilde_{n+1} = Xtilde_n + D mu h + sum_k D sigma_k dW_n^k
    theta_{n+1}  = theta_n - alpha(t_n) h mean_i D c(X_n^i)        (or theta_n + s_n of an optimiser)
    t_{n+1}      = t_n + h

where D is the total derivative along the sensitivity (see ``sensitivity``). With a
``fwdtrain.optim`` rule, s_n, opt_state_{n+1} = update(G_n, opt_state_n, theta_n, alpha(t_n) h);
a Polyak-Ruppert average in the state takes in theta_{n+1} when t_{n+1} >= t0.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Union

import torch

from ._tree import leaves, tree_map
from .optim import GradientTransformation, apply_updates, average_update
from .problem import SDE, Coefficients, ControlledSDE
from .sensitivity import Mode, linearise_particles, resolve_mode, structured_pays
from .state import State

LearningRate = Union[float, torch.Tensor, Callable[[torch.Tensor], Any]]


class StepInfo(NamedTuple):
    """Diagnostics of a step, evaluated at time n: particle-mean cost and gradient estimate G_n."""

    cost: torch.Tensor
    gradient: Any


def learning_rate(lr: LearningRate, t: torch.Tensor) -> Any:
    """alpha(t): a schedule is called on t, a number is returned as it is."""
    return lr(t) if callable(lr) else lr


def noise_term(sigma: torch.Tensor, dw: torch.Tensor) -> torch.Tensor:
    """sigma dW for N particles: sigma (N, d) diagonal or (N, d, m), dW (N, m) -> (N, d)."""
    if sigma.ndim == 2:
        return sigma * dw
    return torch.einsum("ndm,nm->nd", sigma, dw)


def noise_sensitivity_term(d_sigma: torch.Tensor | None, dw: torch.Tensor, diagonal: bool) -> torch.Tensor | float:
    """sum_k D sigma_k dW^k for one parameter leaf: (N, d, [m,] *s) -> (N, d, *s); 0 for D sigma None (additive)."""
    if d_sigma is None:
        return 0.0
    if diagonal:
        return d_sigma * dw.reshape(dw.shape + (1,) * (d_sigma.ndim - 2))
    return torch.einsum("ndm...,nm->nd...", d_sigma, dw)


def resolve_step_mode(mode: Mode, state: State, noise_dim: int, sde: SDE | None = None) -> str:
    """The derivative mode for a state: ``mode`` itself, or for "auto" the one with fewer passes
    through the theta-dependent function (``fwdtrain.sensitivity``), forward costing p passes:

    - any SDE (or ``sde`` None): reverse d + d m + 1 passes (a full diffusion), or d + 1 when
      the noise is declared additive;
    - a ``ControlledSDE`` whose structure-aware route pays (``sensitivity.structured_pays``):
      reverse k passes, k the control's outputs (the control is evaluated once at the first
      particle to count them).
    """
    parameters = sum(leaf.numel() for leaf in leaves(state.theta))
    if mode != "auto" or sde is None:
        return resolve_mode(mode, state.dim * (1 + noise_dim) + 1, parameters)
    sigma_outputs = 0 if sde.noise_type == "additive" else state.dim * noise_dim
    outputs = state.dim + sigma_outputs + 1
    if isinstance(sde, ControlledSDE):
        k = sde.control(state.theta, state.x[0]).numel()
        if structured_pays("reverse", k, state.dim, outputs):
            return resolve_mode(mode, k, parameters)
    return resolve_mode(mode, outputs, parameters)


GradientReduce = Callable[[Any], Any]


def euler_update(state: State, value: Coefficients, total: Coefficients, dw: torch.Tensor, dt: Any
           ) -> tuple[torch.Tensor, Any]:
    """The Euler-Maruyama update of the state and its sensitivity, coefficients at time n:

        X_{n+1} = X_n + mu h + sigma dW_n,   Xtilde_{n+1} = Xtilde_n + D mu h + sum_k D sigma_k dW_n^k

    ``total.sigma`` None (additive noise, D sigma = 0) drops the last sum.
    """
    diagonal = value.sigma.ndim == 2
    x = state.x + value.mu * dt + noise_term(value.sigma, dw)
    if total.sigma is None:
        x_tilde = tree_map(lambda xt, d_mu: xt + d_mu * dt, state.x_tilde, total.mu)
        return x, x_tilde
    x_tilde = tree_map(
        lambda xt, d_mu, d_sigma: xt + d_mu * dt + noise_sensitivity_term(d_sigma, dw, diagonal),
        state.x_tilde, total.mu, total.sigma,
    )
    return x, x_tilde


def descend(theta: Any, gradient: Any, alpha: Any, dt: Any) -> Any:
    """theta_{n+1} = theta_n - alpha h G_n, each leaf kept in its dtype.

    alpha(t_n) from a schedule is float64 like the clock t; it would promote a 0-d leaf.
    """
    return tree_map(lambda th, g: th - ((alpha * dt) * g).to(th.dtype), theta, gradient)


def average_step(average: Any, theta: Any, t: Any) -> Any:
    """The state's Polyak-Ruppert average with theta at time t taken in (``optim.average_update``); ``()`` stays."""
    if isinstance(average, tuple) and not average:
        return average
    return average_update(average, theta, t)


def update_parameters(state: State, gradient: Any, alpha: Any, dt: Any,
                      optimizer: GradientTransformation | None = None) -> State:
    """theta, opt_state, t and average at n + 1 (x and x_tilde untouched), from G_n = ``gradient``:

        optimizer None:  theta_{n+1} = theta_n - alpha h G_n                  (``descend``, bitwise today's)
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


def advance(
    sde: SDE, state: State, dw: torch.Tensor, dt: Any, alpha: Any, mode: str,
    reduce: GradientReduce | None = None, optimizer: GradientTransformation | None = None,
) -> tuple[State, StepInfo]:
    """The step itself, without input checks: (new state, diagnostics at time n).

    ``reduce`` maps the local particle-mean gradient pytree to the one used for
    the update (e.g. an all-reduce mean across processes); None keeps it. ``optimizer``: the
    ``fwdtrain.optim`` rule that state.opt_state belongs to (None: plain sgd, ``descend``).
    No ``no_grad``: the step is differentiable by the user's ``torch.func`` transforms
    (on plain tensors nothing records a graph anyway).
    """
    value, total = linearise_particles(sde, state.theta, state.x, state.x_tilde, mode)
    diagonal = value.sigma.ndim == 2
    expected_m = state.dim if diagonal else value.sigma.shape[-1]
    if dw.shape[1] != expected_m:
        raise ValueError(f"dw has shape {tuple(dw.shape)} but the diffusion needs ({state.particles}, "
                         f"{expected_m}) Brownian increments")
    x, x_tilde = euler_update(state, value, total, dw, dt)
    gradient = tree_map(lambda g: g.mean(0), total.cost)
    if reduce is not None:
        gradient = reduce(gradient)
    new_state = update_parameters(state, gradient, alpha, dt, optimizer)._replace(x=x, x_tilde=x_tilde)
    return new_state, StepInfo(value.cost.mean(), gradient)


__all__ = ["StepInfo", "LearningRate", "GradientReduce", "learning_rate", "noise_term",
           "noise_sensitivity_term", "resolve_step_mode", "euler_update", "descend", "update_parameters",
           "average_step", "advance"]
