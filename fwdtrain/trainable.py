"""What the driver trains: the ``Trainable`` protocol, and the adapter that makes an ``SDE`` one.

Every kind of online training in fwdtrain is a pure step of a ``State`` driven by one
"noise" increment per step:

    state_{n+1}, info_n = advance(state_n, dw_n, dt, alpha(t_n), mode, reduce)

  cost form (``SDE``)            dw_n Brownian increments (N, m); info = (mean_i c, G)  (``CostForm`` below)
  ``calibration.Calibration``    dw_n Brownian increments (N, m); info = (two-group J estimate, G)
  ``sgdct.DriftEstimation``      dw_n the observed increment dX_n; state.x the observation X_n

The driver (``fwdtrain.driver``) knows this protocol only; a new kind of problem adds a
module that implements it and touches no loop.

Optional member hooks, for a problem made of E independent members (``fwdtrain.ensemble.Ensemble``):

  within(state, bound) -> (E,) bool     member e finite (and within bound)
  freeze(good, new, running) -> State   new where running, good elsewhere (per member, branch-free)
  gradient_norm(gradient) -> (E,)       |G_e| per member, for the records
  noise_source(seed, dt, state, saved)  the members' noise source (from the history's ``saved`` position)

With them the driver freezes a diverged member at its last checked state and goes on with the others.

The update rule (a ``fwdtrain.optim`` transformation: code, not data) is bound to the problem
side, ``CostForm(sde, optimizer)``; its state travels in ``State.opt_state``. A problem that can
take a rule has ``with_optimizer(optimizer) -> problem``, which ``as_trainable`` calls.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch

from .euler import GradientReduce, StepInfo, advance, resolve_step_mode
from .optim import GradientTransformation
from .problem import SDE
from .sensitivity import Mode
from .state import State, noise_dim
from .stepping import check_step_inputs


@runtime_checkable
class Trainable(Protocol):
    """The interface of a problem the driver can train (all methods pure)."""

    def check(self, state: State, dt: Any, lr: Any) -> None:
        """Raise a clear error for a state, step or learning rate this problem cannot use."""

    def resolve_mode(self, state: State, mode: Mode) -> str:
        """The derivative mode ("reverse" or "forward") that ``mode`` ("auto" included) means for this state."""

    def noise_shape(self, state: State) -> tuple[int, ...]:
        """The shape of one step's increment dw_n."""

    def advance(self, state: State, dw: torch.Tensor, dt: Any, alpha: Any, mode: str,
                reduce: GradientReduce | None = None) -> tuple[State, StepInfo]:
        """One unchecked step: (state_{n+1}, StepInfo(cost_n, gradient_n)); ``reduce`` maps the gradient."""

    def record(self, state: State) -> Any:
        """What the history stores at a record (usually theta)."""


class CostForm(NamedTuple):
    """The cost-form SDE as a ``Trainable``: ``fwdtrain.euler.advance`` with the SDE and the update rule
    (None: plain sgd) bound."""

    sde: SDE
    optimizer: GradientTransformation | None = None

    def with_optimizer(self, optimizer: GradientTransformation | None) -> "CostForm":
        return self._replace(optimizer=optimizer)

    def check(self, state: State, dt: Any, lr: Any) -> None:
        m = noise_dim(self.sde, state.theta, state.x)
        dw = torch.zeros((state.particles, max(m, 1)), dtype=state.x.dtype, device=state.x.device)
        check_step_inputs(self.sde, state, dw, dt, lr, self.optimizer)

    def resolve_mode(self, state: State, mode: Mode) -> str:
        return resolve_step_mode(mode, state, noise_dim(self.sde, state.theta, state.x))

    def noise_shape(self, state: State) -> tuple[int, ...]:
        return (state.particles, noise_dim(self.sde, state.theta, state.x))

    def advance(self, state: State, dw: torch.Tensor, dt: Any, alpha: Any, mode: str,
                reduce: GradientReduce | None = None) -> tuple[State, StepInfo]:
        return advance(self.sde, state, dw, dt, alpha, mode, reduce, self.optimizer)

    def record(self, state: State) -> Any:
        return state.theta


def as_trainable(problem: Any, optimizer: GradientTransformation | None = None) -> Trainable:
    """``problem`` as a ``Trainable``: an ``SDE`` (or ``ControlledSDE``) is wrapped in ``CostForm``.

    ``optimizer`` (a ``fwdtrain.optim`` rule) is bound with the problem's ``with_optimizer``; None
    keeps the problem's own (plain sgd unless it was built with one).
    """
    if optimizer is not None and not isinstance(optimizer, GradientTransformation):
        raise TypeError(f"optimizer must be a fwdtrain.optim.GradientTransformation (e.g. fwdtrain.optim.adam()) "
                        f"or None, got {type(optimizer).__name__}")
    if isinstance(problem, SDE):
        return CostForm(problem, optimizer)
    if isinstance(problem, Trainable):
        if optimizer is None:
            return problem
        if not callable(getattr(problem, "with_optimizer", None)):
            raise NotImplementedError(f"{type(problem).__name__} does not take an optimizer (it has no "
                                      f"with_optimizer method); train it with the plain update (optimizer=None)")
        return problem.with_optimizer(optimizer)
    raise TypeError(f"expected a problem to train: a fwdtrain.SDE or ControlledSDE, a calibration.Calibration, "
                    f"an sgdct.DriftEstimation or another fwdtrain.trainable.Trainable; got {type(problem).__name__}")


__all__ = ["Trainable", "CostForm", "as_trainable"]
