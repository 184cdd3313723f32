"""What ``run`` trains: the ``Trainable`` base class, with every method the loop calls.

Every kind of online training in fwdtrain is a pure step of a state (a ``State``, or the problem's own
kind: ``state_kind``) driven by one "noise" increment per step:

    moved_n, info_n = propagate(state_n, dw_n, dt, plan)        X, Xtilde to n + 1; info = (cost_n, G_n)
    state_{n+1}     = update(moved_n, G_n, alpha(t_n), dt)     theta, opt_state, t, average to n + 1

  the cost form (``CostForm(sde)``)   dw_n Brownian increments (N, m); cost = mean_i c
  ``calibration.Calibration``         dw_n Brownian increments (N, m); cost = the two-group J estimate
  ``sgdct.DriftEstimation``           dw_n the observed increment dX_n; state.x the observation X_n
  ``ensemble.Ensemble``               E members of any of these, one vmapped step
  ``frozen.FrozenCost``               dw_n Brownian increments; its own state kind, ``FrozenPaths``

A subclass implements ``check``, ``plan``, ``noise_shape`` and ``propagate``; the base class gives
the update (the bound ``optimizer``), ``advance`` (both halves, with an optional gradient hook in
between, e.g. an all-reduce across processes), the record (theta), the learning rate, the noise
source, and the hooks of a problem made of E independent members (``within``, ``freeze``,
``gradient_norm``), whose defaults describe a single run. The loop (``fwdtrain.driver``) calls
only these methods; it never asks which problem it trains.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Hashable
from typing import Any, ClassVar

import torch

from ..core._tree import leaves, norm, peak
from ..core.noise import BrownianNoise, Noise, NoiseLike, as_noise
from ..core.schedules import Schedule
from ..core.solvers import Solver, as_solver
from ..core.state import State
from ..core.step import GradientReduce, LearningRate, StepInfo, update_parameters
from ..optim import GradientTransformation, check_optimizer

AnyState = Any  # a ``State``, or the state kind of the problem (``Trainable.state_kind``): a NamedTuple with x,
# theta, t and average (None where there is none) that the problem's own methods read


class Trainable(abc.ABC):
    """The interface of a problem ``run`` can train; every method is pure.

    Subclasses are frozen dataclasses (hashable: a run's compiled kernels are kept per problem) with
    the fields ``optimizer`` (a ``fwdtrain.optim`` rule or None) and, where a scheme applies,
    ``solver``.
    """

    optimizer: GradientTransformation | None = None
    state_kind: ClassVar[type] = State  # what ``run`` starts from and carries: a ``State``, or the problem's own

    # ---- what a problem must say ----
    @abc.abstractmethod
    def check(self, state: AnyState, dt: Any, lr: Any) -> None:
        """Raise a clear error for a state, step or learning rate this problem cannot use."""

    @abc.abstractmethod
    def plan(self, state: AnyState, mode: str = "auto") -> Hashable:
        """What is decided once per run (e.g. the derivative mode and route), from ``mode`` ("auto" included)."""

    @abc.abstractmethod
    def noise_shape(self, state: AnyState) -> tuple[int, ...]:
        """The shape of one step's increment dw_n."""

    @abc.abstractmethod
    def propagate(self, state: AnyState, dw: torch.Tensor, dt: Any, plan: Hashable) -> tuple[AnyState, StepInfo]:
        """The state with x (and x_tilde) at n + 1 (theta, t untouched) and StepInfo(cost_n, G_n): a cost of
        the clock's shape and x's dtype, a gradient shaped like theta."""

    # ---- what the base class gives ----
    def update(self, moved: AnyState, gradient: Any, alpha: Any, dt: Any) -> AnyState:
        """theta, opt_state, t and average at n + 1 from G_n (``core.step.update_parameters``, the bound rule)."""
        return update_parameters(moved, gradient, alpha, dt, self.optimizer)

    def advance(
        self,
        state: AnyState,
        dw: torch.Tensor,
        dt: Any,
        alpha: Any,
        plan: Hashable,
        reduce: GradientReduce | None = None,
    ) -> tuple[AnyState, StepInfo]:
        """One unchecked step: (state_{n+1}, StepInfo(cost_n, G_n)); ``reduce`` maps G_n before the update."""
        moved, info = self.propagate(state, dw, dt, plan)
        gradient = info.gradient if reduce is None else reduce(info.gradient)
        return self.update(moved, gradient, alpha, dt), StepInfo(info.cost, gradient)

    def record(self, state: AnyState) -> Any:
        """What the history stores at a record: theta."""
        return state.theta

    def configure(
        self, solver: Solver | str | None = None, optimizer: GradientTransformation | None = None
    ) -> Trainable:
        """This problem with ``solver`` and ``optimizer`` bound (None keeps the problem's own)."""
        changes: dict[str, Any] = {}
        if check_optimizer(optimizer) is not None:
            changes["optimizer"] = optimizer
        if solver is not None:
            solver = as_solver(solver)
            if "solver" not in {f.name for f in dataclasses.fields(self)}:  # type: ignore[arg-type]
                if solver != as_solver(None):
                    raise ValueError(
                        f"{type(self).__name__} takes no solver: it does not integrate an SDE (its steps are given "
                        f"increments); leave the solver at its default (solver=None; on the command line, no --solver)"
                    )
            else:
                changes["solver"] = solver
        return dataclasses.replace(self, **changes) if changes else self  # type: ignore[type-var]

    def with_optimizer(self, optimizer: GradientTransformation | None) -> Trainable:
        """This problem updated by ``optimizer`` (None: plain sgd, theta - alpha h G), its state in
        ``State.opt_state``."""
        return dataclasses.replace(self, optimizer=optimizer)  # type: ignore[type-var]

    def schedule(self, lr: LearningRate, state: AnyState) -> Schedule:
        """alpha as a function of the clock t (a number becomes a constant 0-d tensor of x's dtype)."""
        if callable(lr):
            return lr
        alpha = torch.as_tensor(lr, dtype=state.x.dtype, device=state.x.device).clone()
        return lambda t: alpha

    def noise_source(self, noise: NoiseLike | int, dt: Any, state: AnyState, saved: dict | None) -> Noise:
        """The increments: the user's source (a tensor or function is indexed by the step count), the saved
        position of a continued run, or ``BrownianNoise(noise_shape, dt, seed=noise)`` for an int."""
        dtype, device, shape = state.x.dtype, state.x.device, tuple(self.noise_shape(state))
        if isinstance(noise, int) and not isinstance(noise, bool):
            if saved is None:
                return BrownianNoise(shape, float(dt), seed=noise, dtype=dtype, device=device)
            if BrownianNoise.kind not in saved:
                raise ValueError(
                    f"the run being continued drew user-supplied noise ({', '.join(saved)}); pass the "
                    f"same noise= again to continue it"
                )
            return BrownianNoise.from_state_dict(saved, dtype, device)
        source = as_noise(noise)  # type: ignore[arg-type]  # an int was handled above
        if isinstance(source, BrownianNoise):
            source = source.copy()
            if source.shape != shape or source.dtype != dtype or source.device != device or source.dt != float(dt):
                raise ValueError(
                    f"the noise source {source!r} does not fit the run: expected shape {shape}, "
                    f"dt={float(dt)}, dtype={dtype} on {device}"
                )
            return source
        assert source is not None
        return source.copy().expect(shape, dtype, device)

    # ---- a problem made of independent members (an ensemble) overrides these ----
    def checked(self, state: AnyState) -> dict[str, Any]:
        """The parts of the state the divergence check reads, by name: x, x_tilde and theta."""
        return {"x": state.x, "x_tilde": state.x_tilde, "theta": state.theta}

    def within(self, state: AnyState, bound: float | None) -> torch.Tensor:
        """0-d bool: the ``checked`` parts all finite (and |.| <= bound when given); one reduction."""
        largest = peak(leaves(tuple(self.checked(state).values())))
        return torch.isfinite(largest) if bound is None else largest <= bound  # NaN compares False

    def freeze(self, good: AnyState, new: AnyState, running: torch.Tensor) -> AnyState:
        """``new`` for running members and ``good`` for the others; a single run has no members to freeze."""
        return new

    def gradient_norm(self, gradient: Any) -> torch.Tensor:
        """|G| over every leaf (per member for an ensemble)."""
        return norm(gradient)

    def nonfinite(self, state: AnyState) -> str | None:
        """The name of the problem's first function that is NaN or inf at the state's particles ("drift", ...),
        or None (also when the problem cannot tell). Used on the error path only, to name a divergence."""
        return None


__all__ = ["Trainable"]
