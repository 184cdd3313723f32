"""Errors a run and its checkpoints raise, each carrying what is needed to recover."""

from __future__ import annotations

from typing import Any


class DivergenceError(RuntimeError):
    """x, x_tilde or theta became non-finite (or exceeded the user's bound) during ``run``.

    Attributes:
        step: The step count at which the check failed.
        last_finite_step: The step count of ``state`` (the last check that passed).
        state: The last ``State`` known to be finite (and within the bound).
        history: The ``History`` recorded up to ``last_finite_step``; its noise position is that of
            ``state``, so ``run(problem, (error.state, error.history), ...)`` restarts from it.
        culprit: What became non-finite first, when it could be found (e.g. ``"the drift"``), else None.
    """

    def __init__(
        self, message: str, *, step: int, last_finite_step: int, state: Any, history: Any, culprit: str | None = None
    ) -> None:
        super().__init__(message)
        self.step = step
        self.last_finite_step = last_finite_step
        self.state = state
        self.history = history
        self.culprit = culprit


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupt, unsafe, not a fwdtrain checkpoint, or cannot be written."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written during ``run``; the run's results are kept here.

    Attributes:
        path: The path that could not be written.
        state: The ``State`` the run had reached.
        history: The ``History`` the run had recorded.
    """

    def __init__(self, message: str, *, path: str, state: Any, history: Any) -> None:
        super().__init__(message)
        self.path = path
        self.state = state
        self.history = history


__all__ = ["CheckpointError", "CheckpointWriteError", "DivergenceError"]
