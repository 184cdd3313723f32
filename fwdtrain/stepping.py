"""The public, checked step: ``step`` and ``step_with_info`` validate their inputs, resolve the
derivative mode and call the kernel ``fwdtrain.euler.advance`` (eager, or compiled with ``compile=True``).

    X_{n+1}      = X_n + mu h + sigma dW_n
    Xtilde_{n+1} = Xtilde_n + D mu h + sum_k D sigma_k dW_n^k
    theta_{n+1}  = theta_n - alpha(t_n) h mean_i D c(X_n^i)
    t_{n+1}      = t_n + h
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from . import _checks
from ._tree import leaves
from .compiled import STEP_OPTIONS, CompiledOrEager, canonical_strides
from .euler import LearningRate, StepInfo, advance, learning_rate, resolve_step_mode
from .optim import GradientTransformation, check_average, check_opt_state
from .problem import SDE
from .sensitivity import Mode
from .state import State


def check_step_inputs(sde: SDE, state: State, dw: torch.Tensor, dt: Any, lr: Any,
                      optimizer: GradientTransformation | None = None) -> None:
    """Raise a clear error for anything ``step`` cannot use (an opt_state that is not ``optimizer``'s included)."""
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
    if any(leaf.requires_grad for leaf in leaves((state, dw)) if _checks.is_concrete(leaf)):
        raise ValueError("the state or dw requires grad; fwdtrain works on plain tensors: pass .detach() copies "
                         "(to differentiate through step, use torch.func.grad/jacfwd/jacrev/vjp/jvp, not autograd)")
    _checks.check_same_structure(state.x_tilde, state.theta, "state.x_tilde", "state.theta")
    check_training_state(state, optimizer)


def check_training_state(state: State, optimizer: GradientTransformation | None) -> None:
    """Raise unless state.opt_state is ``optimizer``'s and state.average is ``()`` or an ``Average`` of theta."""
    check_opt_state(optimizer, state.opt_state, state.theta)
    check_average(state.average, state.theta)


@functools.lru_cache(maxsize=64)
def _compiled_advance(sde: SDE, mode: str, optimizer: GradientTransformation | None
                      ) -> Callable[..., tuple[State, StepInfo]]:
    """``advance`` of ``sde`` under torch.compile, one kernel per (sde, mode, optimizer), so that dynamo's
    recompile limit counts per problem; built on first use; torch keeps one graph per dt."""
    def kernel(state: State, dw: torch.Tensor, dt: Any, alpha: torch.Tensor):
        new_state, info = advance(sde, state, dw, dt, alpha, mode, optimizer=optimizer)
        return canonical_strides(new_state), info

    return CompiledOrEager(kernel, "step", "inductor", STEP_OPTIONS)


def step_with_info(
    sde: SDE, state: State, dw: torch.Tensor, dt: Any, lr: LearningRate, *, mode: Mode = "auto",
    compile: bool = False, optimizer: GradientTransformation | None = None,
) -> tuple[State, StepInfo]:
    """``step`` that also returns the particle-mean cost and gradient estimate at time n."""
    check_step_inputs(sde, state, dw, dt, lr, optimizer)
    resolved = resolve_step_mode(mode, state, dw.shape[1], sde)
    alpha = learning_rate(lr, state.t)
    _checks.check_alpha(alpha, state.t, lr)
    if not compile or not all(_checks.is_concrete(leaf) for leaf in leaves((state, dw, dt, alpha))):
        # eager; also inside the user's torch.func transform
        return advance(sde, state, dw, dt, alpha, resolved, optimizer=optimizer)
    alpha = torch.as_tensor(alpha, dtype=state.t.dtype, device=state.t.device)  # data, not a constant
    return _compiled_advance(sde, resolved, optimizer)(state, dw, float(dt), alpha)


def step(
    sde: SDE, state: State, dw: torch.Tensor, dt: Any, lr: LearningRate, *, mode: Mode = "auto",
    compile: bool = False, optimizer: GradientTransformation | None = None,
) -> State:
    """One pure Euler-Maruyama step of the forward-propagation algorithm.

    Args:
      sde:   the problem (``SDE`` or ``ControlledSDE``).
      state: the current ``State``; never modified.
      dw:    Brownian increments W_{n+1} - W_n, shape (N, m), variance dt each.
      dt:    the step h > 0.
      lr:    the learning rate alpha: a number, a 0-d tensor or a schedule t -> alpha(t); alpha(t_n)
             must be one finite number >= 0 (checked on concrete values, ``_checks.check_alpha``).
      mode:  "reverse" (jacrev), "forward" (jacfwd) or "auto" (the cheaper by shape).
      compile: run the step through ``torch.compile`` (the first call per problem and dt
             compiles, for seconds; later calls reuse the graph). In a loop of your own,
             ``fwdtrain.compile_advance`` or ``run(..., compile=True)`` is the direct route.
      optimizer: the ``fwdtrain.optim`` rule (e.g. ``adam()``) whose state is ``state.opt_state``
             (made by ``init(..., optimizer=...)``; a mismatch raises ``ValueError`` before the step).
             None (default): theta_{n+1} = theta_n - alpha h G_n, the plain update.

    Returns the new ``State``; no tensor in it requires grad or has a grad_fn.

    ``step`` is a pure function and composes with ``torch.func`` (grad, jacrev, jacfwd,
    vjp, jvp, vmap) in all its tensor inputs: theta and x in ``state``, ``dw``, ``dt``,
    a tensor ``lr`` or the tensors a schedule closes over. Structure checks always run;
    value checks (finite, >= 0, requires_grad) only on concrete tensors. With ``compile=True``
    inside a transform the step runs eagerly (torch.compile cannot trace the transform's tensors).
    """
    return step_with_info(sde, state, dw, dt, lr, mode=mode, compile=compile, optimizer=optimizer)[0]


__all__ = ["step", "step_with_info", "check_step_inputs", "check_training_state"]
