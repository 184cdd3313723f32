"""``fwdtrain.errors``: the errors of a run and its checkpoints.

The names of ``fwdtrain.core.errors`` at their public path.
"""

from .core.errors import (
    CheckpointError,
    CheckpointWriteError,
    DivergenceError,
)

__all__ = [
    "CheckpointError",
    "CheckpointWriteError",
    "DivergenceError",
]
