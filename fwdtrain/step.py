"""One pure Euler-Maruyama step of (X, Xtilde, theta, t), all right-hand sides at time n.

    X_{n+1}      = X_n + mu h + sigma dW_n
    Xtilde_{n+1} = Xtilde_n + D mu h + sum_k D sigma_k dW_n^k
    theta_{n+1}  = theta_n - alpha(t_n) h mean_i D c(X_n^i)
    t_{n+1}      = t_n + h

where D is the total derivative along the sensitivity (see ``sensitivity``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Union

import torch

from . import _checks
from ._tree import leaves, tree_map
from .problem import SDE, Coefficients
from .sensitivity import Mode, linearise_particles, resolve_mode
from .state import State

LearningRate = Union[float, torch.Tensor, Callable[[torch.Tensor], Any]]


class StepInfo(NamedTuple):
    """Diagnostics of a step, evaluated at time n: particle-mean cost and gradient estimate G_n."""

    cost: torch.Tensor
    gradient: Any


def learning_rate(lr: LearningRate, t: torch.Tensor) -> Any:
    """alpha(t): a schedule is called on t, a number is returned as it is."""
    return lr(t) if callable(lr) else lr


def _noise(sigma: torch.Tensor, dw: torch.Tensor) -> torch.Tensor:
    """sigma dW for N particles: sigma (N, d) diagonal or (N, d, m), dW (N, m) -> (N, d)."""
    if sigma.ndim == 2:
        return sigma * dw
    return torch.einsum("ndm,nm->nd", sigma, dw)


def _noise_sensitivity(d_sigma: torch.Tensor, dw: torch.Tensor, diagonal: bool) -> torch.Tensor:
    """sum_k D sigma_k dW^k for one parameter leaf: (N, d, [m,] *s) -> (N, d, *s)."""
    if diagonal:
        return d_sigma * dw.reshape(dw.shape + (1,) * (d_sigma.ndim - 2))
    return torch.einsum("ndm...,nm->nd...", d_sigma, dw)


def _resolve_mode(mode: Mode, state: State, noise_dim: int) -> str:
    """The mode for a state, counting outputs as d + d m + 1 (a full diffusion) before evaluating anything."""
    parameters = sum(leaf.numel() for leaf in leaves(state.theta))
    return resolve_mode(mode, state.dim * (1 + noise_dim) + 1, parameters)


GradientReduce = Callable[[Any], Any]


def _euler(state: State, value: Coefficients, total: Coefficients, dw: torch.Tensor, dt: Any
           ) -> tuple[torch.Tensor, Any]:
    """The Euler-Maruyama update of the state and its sensitivity, coefficients at time n:

        X_{n+1} = X_n + mu h + sigma dW_n,   Xtilde_{n+1} = Xtilde_n + D mu h + sum_k D sigma_k dW_n^k
    """
    diagonal = value.sigma.ndim == 2
    x = state.x + value.mu * dt + _noise(value.sigma, dw)
    x_tilde = tree_map(
        lambda xt, d_mu, d_sigma: xt + d_mu * dt + _noise_sensitivity(d_sigma, dw, diagonal),
        state.x_tilde, total.mu, total.sigma,
    )
    return x, x_tilde


def _descend(theta: Any, gradient: Any, alpha: Any, dt: Any) -> Any:
    """theta_{n+1} = theta_n - alpha h G_n, each leaf kept in its dtype.

    alpha(t_n) from a schedule is float64 like the clock t; it would promote a 0-d leaf.
    """
    return tree_map(lambda th, g: th - ((alpha * dt) * g).to(th.dtype), theta, gradient)


def advance(
    sde: SDE, state: State, dw: torch.Tensor, dt: Any, alpha: Any, mode: str,
    reduce: GradientReduce | None = None,
) -> tuple[State, StepInfo]:
    """The step itself, without input checks: (new state, diagnostics at time n).

    ``reduce`` maps the local particle-mean gradient pytree to the one used for
    the update (e.g. an all-reduce mean across processes); None keeps it.
    """
    with torch.no_grad():
        value, total = linearise_particles(sde.coefficients, state.theta, state.x, state.x_tilde, mode)
        diagonal = value.sigma.ndim == 2
        expected_m = state.dim if diagonal else value.sigma.shape[-1]
        if dw.shape[1] != expected_m:
            raise ValueError(f"dw has shape {tuple(dw.shape)} but the diffusion needs ({state.particles}, "
                             f"{expected_m}) Brownian increments")
        x, x_tilde = _euler(state, value, total, dw, dt)
        gradient = tree_map(lambda g: g.mean(0), total.cost)
        if reduce is not None:
            gradient = reduce(gradient)
        theta = _descend(state.theta, gradient, alpha, dt)
        new_state = State(x, x_tilde, theta, state.t + dt)
    return new_state, StepInfo(value.cost.mean(), gradient)


def check_step_inputs(sde: SDE, state: State, dw: torch.Tensor, dt: Any, lr: Any) -> None:
    """Raise a clear error for anything ``step`` cannot use."""
    if not isinstance(sde, SDE):
        raise TypeError(f"step(sde, ...) expects a fwdtrain.SDE or ControlledSDE, got {type(sde).__name__}")
    if not isinstance(state, State):
        raise TypeError(f"step(..., state, ...) expects a fwdtrain.State (from fwdtrain.init), got {type(state).__name__}")
    _checks.check_dt(dt)
    _checks.check_lr(lr)
    theta0 = leaves(state.theta)[0]
    if not isinstance(dw, torch.Tensor):
        raise TypeError(f"dw must be a torch.Tensor of Brownian increments, got {type(dw).__name__}")
    if dw.ndim != 2 or dw.shape[0] != state.particles:
        raise ValueError(f"dw must have shape (particles, m) = ({state.particles}, m), got {tuple(dw.shape)}")
    if dw.dtype != theta0.dtype or dw.device != theta0.device:
        raise TypeError(f"dw is {dw.dtype} on {dw.device} but the state is {theta0.dtype} on {theta0.device}")
    if any(leaf.requires_grad for leaf in leaves((state, dw))):
        raise ValueError("the state or dw requires grad; fwdtrain works on plain tensors: pass .detach() copies")
    _checks.check_same_structure(state.x_tilde, state.theta, "state.x_tilde", "state.theta")


@functools.cache
def _compiled_advance() -> Callable[..., tuple[State, StepInfo]]:
    """``advance`` under torch.compile, built on first use; torch keeps one graph per (sde, dt, mode)."""
    from .compiled import STEP_OPTIONS, _canonical_strides, _CompiledOrEager

    def kernel(sde: SDE, state: State, dw: torch.Tensor, dt: Any, alpha: torch.Tensor, mode: str):
        new_state, info = advance(sde, state, dw, dt, alpha, mode)
        return _canonical_strides(new_state), info

    return _CompiledOrEager(kernel, "step", "inductor", STEP_OPTIONS)


def step_with_info(
    sde: SDE, state: State, dw: torch.Tensor, dt: Any, lr: LearningRate, *, mode: Mode = "auto",
    compile: bool = False,
) -> tuple[State, StepInfo]:
    """``step`` that also returns the particle-mean cost and gradient estimate at time n."""
    check_step_inputs(sde, state, dw, dt, lr)
    resolved = _resolve_mode(mode, state, dw.shape[1])
    alpha = learning_rate(lr, state.t)
    if not compile:
        return advance(sde, state, dw, dt, alpha, resolved)
    alpha = torch.as_tensor(alpha, dtype=state.t.dtype, device=state.t.device)  # data, not a constant
    return _compiled_advance()(sde, state, dw, float(dt), alpha, resolved)


def step(
    sde: SDE, state: State, dw: torch.Tensor, dt: Any, lr: LearningRate, *, mode: Mode = "auto",
    compile: bool = False,
) -> State:
    """One pure Euler-Maruyama step of the forward-propagation algorithm.

    Args:
      sde:   the problem (``SDE`` or ``ControlledSDE``).
      state: the current ``State``; never modified.
      dw:    Brownian increments W_{n+1} - W_n, shape (N, m), variance dt each.
      dt:    the step h > 0.
      lr:    the learning rate alpha: a number or a schedule t -> alpha(t).
      mode:  "reverse" (jacrev), "forward" (jacfwd) or "auto" (the cheaper by shape).
      compile: run the step through ``torch.compile`` (the first call per problem and dt
             compiles, for seconds; later calls reuse the graph). In a loop of your own,
             ``fwdtrain.compile_advance`` or ``run(..., compile=True)`` is the direct route.

    Returns the new ``State``; no tensor in it requires grad or has a grad_fn.
    """
    return step_with_info(sde, state, dw, dt, lr, mode=mode, compile=compile)[0]
