"""The cost form: an ``SDE`` trained on its own running cost, and the public, checked step.

    X_{n+1}, Xtilde_{n+1} = the solver's step and its exact sensitivity (``fwdtrain.core.solvers``)
    theta_{n+1}           = theta_n - alpha(t_n) h mean_i D c(X_n^i)        (or a ``fwdtrain.optim`` rule)
    t_{n+1}               = t_n + h

``CostForm(sde, solver, optimizer)`` is the ``Trainable`` that ``run`` makes of an SDE; the checks
here are those of the public step (``fwdtrain.problems.prepared``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.func import vmap

from ..compile import cache
from ..core import _checks
from ..core._tree import leaves, leaves_with_paths
from ..core.problem import SDE
from ..core.sensitivity import Plan
from ..core.solvers import EULER, Solver
from ..core.state import State, evaluate_once, noise_dim
from ..core.step import StepInfo, propagate
from ..optim import GradientTransformation, check_average, check_opt_state
from .trainable import Trainable


def check_step_inputs(
    sde: SDE, state: State, dw: torch.Tensor, dt: Any, lr: Any, optimizer: GradientTransformation | None = None
) -> None:
    """Raise a clear error for anything ``step`` cannot use (an opt_state that is not ``optimizer``'s included)."""
    if not isinstance(sde, SDE):
        raise TypeError(f"step(sde, ...) expects a fwdtrain.SDE or ControlledSDE, got {type(sde).__name__}")
    if not isinstance(state, State):
        raise TypeError(
            f"step(..., state, ...) expects a fwdtrain.State (from fwdtrain.init), got {type(state).__name__}"
        )
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
        raise ValueError(
            "the state or dw requires grad; fwdtrain works on plain tensors: pass .detach() copies "
            "(to differentiate through step, use torch.func.grad/jacfwd/jacrev/vjp/jvp, not autograd)"
        )
    _checks.check_same_structure(state.x_tilde, state.theta, "state.x_tilde", "state.theta")
    check_score(sde, state)
    check_training_state(state, optimizer)


def check_score(sde: SDE, state: State) -> None:
    """Raise unless state.score is what ``sde`` needs: a pytree like theta for jumps whose rate varies, else ()."""
    needed = sde.jumps is not None and not sde.jumps.constant
    empty = isinstance(state.score, tuple) and not state.score
    if needed and empty:
        raise ValueError(
            "the SDE's jumps have a rate that depends on theta or x, so the state must carry the events' score "
            "(State.score, a pytree like theta); make the state with fwdtrain.init(sde, ...) for this SDE"
        )
    if not needed and not empty:
        raise ValueError(
            "the state carries a jump score (State.score) but this SDE has no jumps with a varying rate; make the "
            "state with fwdtrain.init(sde, ...) for this SDE, or pass state._replace(score=())"
        )
    if needed:
        _checks.check_same_structure(state.score, state.theta, "state.score", "state.theta")


def explain_failure(sde: SDE, state: State, error: Exception) -> None:
    """Re-raise a step's ``error`` with what is wrong when the SDE does not fit the state (a state made for
    another SDE: a shape, dtype or device mismatch found at one particle); else leave it to propagate.
    Called on the error path only, so the step pays nothing for it."""
    if isinstance(error, (RuntimeError, ValueError, IndexError, TypeError)) and _checks.is_concrete(state.x):
        evaluate_once(sde, state.theta, state.x[0], name="state.x[0]")


def check_training_state(state: State, optimizer: GradientTransformation | None) -> None:
    """Raise unless state.opt_state is ``optimizer``'s and state.average is ``()`` or an ``Average`` of theta."""
    check_opt_state(optimizer, state.opt_state, state.theta)
    check_average(state.average, state.theta)


def check_fit(sde: SDE, state: State) -> None:
    """Check the coefficients' shapes, dtypes and device at one particle of ``state`` (``evaluate_once``), once per
    (sde, shapes of x and theta, dtype): a state made for another SDE is refused with what does not fit, before
    the step computes anything with it. Skipped under the user's transforms (their first call checks nothing)."""
    if not (_checks.is_concrete(state.x) and all(_checks.is_concrete(leaf) for leaf in leaves(state.theta))):
        return
    signature = (
        tuple(state.x.shape),
        state.x.dtype,
        state.x.device,
        *(tuple(leaf.shape) for leaf in leaves(state.theta)),
    )
    done = cache.checked(sde)
    if ("fit", signature) not in done:
        evaluate_once(sde, state.theta, state.x[0], name="state.x[0]")
        done.add(("fit", signature))


def check_solver(solver: Solver, sde: SDE, theta: Any, x: torch.Tensor) -> None:
    """``solver.check`` at one particle, once per (sde, solver) on concrete values (a value check with a
    derivative: ``step`` would otherwise pay it every call); the structure check every call."""
    solver.check_shape(sde.diffusion(theta, x), sde.noise_type)
    if not (_checks.is_concrete(x) and all(_checks.is_concrete(leaf) for leaf in leaves(theta))):
        return
    done = cache.checked(sde)
    if ("solver", solver) not in done:
        solver.check(sde, theta, x)
        done.add(("solver", solver))


@dataclass(frozen=True)
class CostForm(Trainable):
    """An ``SDE`` trained on its stationary cost, stepped by ``solver`` (default ``Euler()``) and updated by
    ``optimizer`` (a ``fwdtrain.optim`` rule; None: theta <- theta - alpha h G)."""

    sde: SDE
    solver: Solver = EULER
    optimizer: GradientTransformation | None = None

    def check(self, state: State, dt: Any, lr: Any) -> None:
        if not isinstance(state, State):
            raise TypeError(f"expected a fwdtrain.State (from fwdtrain.init), got {type(state).__name__}")
        try:
            evaluate_once(self.sde, state.theta, state.x[0], name="state.x[0]")
        except Exception as error:
            raise ValueError(unfit(error, state)) from error
        m = noise_dim(self.sde, state.theta, state.x)
        dw = torch.zeros((state.particles, max(m, 1)), dtype=state.x.dtype, device=state.x.device)
        check_step_inputs(self.sde, state, dw, dt, lr, self.optimizer)
        check_solver(self.solver, self.sde, state.theta, state.x[0])

    def plan(self, state: State, mode: str = "auto") -> Plan:
        """Mode and route, decided at the first particle; ``mode`` "auto" defers to the solver's ``mode``."""
        mode = self.solver.mode if mode == "auto" else mode
        return self.sde.plan_at(state.theta, state.x[0], mode, names=self.solver.names)

    def noise_shape(self, state: State) -> tuple[int, ...]:
        return (state.particles, noise_dim(self.sde, state.theta, state.x))

    def propagate(self, state: State, dw: torch.Tensor, dt: Any, plan: Any) -> tuple[State, StepInfo]:
        return propagate(self.sde, state, dw, dt, plan, self.solver)

    def nonfinite(self, state: State) -> str | None:
        return nonfinite_part(self.sde.parts(), state)


def unfit(error: Exception, state: State) -> str:
    """The message for a state (a checkpoint's, a run's) at which the problem's functions fail: the failure, what
    the state holds (theta's leaves and shapes, the particles' dimension) and, for a missing key, the parameter the
    problem asks for that the state lacks."""
    cause = error.__cause__ if error.__cause__ is not None else error
    held = ", ".join(f"theta{path} {tuple(leaf.shape)}" for path, leaf in leaves_with_paths(state.theta)[:8])
    more = ", ..." if len(leaves(state.theta)) > 8 else ""
    asked = ""
    if isinstance(cause, KeyError) and cause.args:
        asked = f"; the problem asks theta for {cause.args[0]!r}, which the state's theta does not have"
    text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    return (
        f"the start's state does not fit this problem: {text}. The state holds {held}{more} and particles x "
        f"{tuple(state.x.shape)} of dimension d = {state.x.shape[-1]}{asked}. A checkpoint or state resumes only "
        f"with the problem (and model size) that made it: load it with that problem, or start anew with "
        f"fwdtrain.init; fwdtrain.driver.check_compatible(checkpoint, theta, x0=x0) compares it leaf by leaf "
        f"with your theta and x0"
    )


def nonfinite_part(parts: Any, state: State) -> str | None:
    """The first of the named functions (theta, x) -> tensor that is NaN or inf at one of the state's particles."""
    for name, function in parts:
        values = vmap(lambda x: function(state.theta, x))(state.x)
        if not bool(torch.isfinite(values).all()):
            return name
    return None


def as_trainable(
    problem: Any, solver: Solver | str | None = None, optimizer: GradientTransformation | None = None
) -> Trainable:
    """``problem`` as a ``Trainable`` with ``solver`` and ``optimizer`` bound: an ``SDE`` (or ``ControlledSDE``)
    becomes ``CostForm(sde)``; a ``Trainable`` is configured (``Trainable.configure``)."""
    if isinstance(problem, SDE):
        problem = CostForm(problem)
    if not isinstance(problem, Trainable):
        raise TypeError(
            f"expected a problem to train: a fwdtrain.SDE or ControlledSDE, a calibration.Calibration, "
            f"an sgdct.DriftEstimation, an ensemble.Ensemble or another fwdtrain.problems.Trainable; "
            f"got {type(problem).__name__}"
        )
    return problem.configure(solver, optimizer)


__all__ = [
    "CostForm",
    "as_trainable",
    "check_fit",
    "check_score",
    "check_solver",
    "check_step_inputs",
    "check_training_state",
    "explain_failure",
    "nonfinite_part",
]
