"""Errors the driver and checkpoints raise, carrying what is needed to recover."""

from __future__ import annotations

from typing import Any


class DivergenceError(RuntimeError):
    """x, x_tilde or theta became non-finite (or exceeded the user's bound) during ``run``.

    Attributes:
      step:             the step count at which the check failed.
      last_finite_step: the step count of ``state`` (the last check that passed).
      state:            the last ``State`` known to be finite (and within the bound).
      history:          the ``History`` recorded up to ``last_finite_step``; its noise
                        position is that of ``state``, so ``run`` can restart from it.
    """

    def __init__(self, message: str, *, step: int, last_finite_step: int, state: Any, history: Any) -> None:
        super().__init__(message)
        self.step = step
        self.last_finite_step = last_finite_step
        self.state = state
        self.history = history


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupt, unsafe or not a fwdtrain checkpoint."""


__all__ = ["DivergenceError", "CheckpointError"]
