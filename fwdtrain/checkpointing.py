"""Checkpointing during a run: where, how often, with what metadata; the path probed before the first step.

A save that fails during a run never loses it: ``CheckpointWriteError`` carries the state
and history the run had reached, and the path it could not write.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, NamedTuple

from . import _checks
from .checkpoint import save
from .errors import CheckpointError
from .history import History
from .state import State


class Checkpointing(NamedTuple):
    """``run(..., checkpoint=Checkpointing(path, every, metadata))``: save to ``path`` every ``every`` steps
    (None: only at the end and on Ctrl-C), with ``metadata`` (a dict of plain values)."""

    path: str | os.PathLike
    every: int | None = None
    metadata: dict | None = None


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written during ``run``; ``state`` and ``history`` are the run's results there."""

    def __init__(self, message: str, *, path: str, state: State, history: History | None) -> None:
        super().__init__(message)
        self.path = path
        self.state = state
        self.history = history


def as_checkpointing(checkpoint: Checkpointing | str | os.PathLike | None) -> Checkpointing | None:
    """A ``Checkpointing`` (a bare path means: at the end and on Ctrl-C only), validated; None stays None."""
    if checkpoint is None:
        return None
    if isinstance(checkpoint, (str, os.PathLike)):
        checkpoint = Checkpointing(checkpoint)
    if not isinstance(checkpoint, Checkpointing):
        raise TypeError(f"checkpoint must be a path or a fwdtrain.Checkpointing(path, every, metadata), "
                        f"got {type(checkpoint).__name__}")
    every = None if checkpoint.every is None else _checks.check_count(checkpoint.every, "checkpoint.every")
    if checkpoint.metadata is not None and not isinstance(checkpoint.metadata, dict):
        raise TypeError(f"checkpoint.metadata must be a dict or None, got {type(checkpoint.metadata).__name__}")
    return checkpoint._replace(every=every)


def probe(path: str | os.PathLike) -> None:
    """Raise ``CheckpointError`` unless a checkpoint can be written at ``path``: its folder exists and a
    file can be created and removed there (checked by doing so)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CheckpointError(f"the checkpoint path {path!r} is a folder; name a file, e.g. {os.path.join(path, 'run.pt')!r}")
    if not os.path.isdir(folder):
        what = "is a file, not a folder" if os.path.exists(folder) else "does not exist"
        raise CheckpointError(f"cannot write the checkpoint {path!r}: its folder {folder!r} {what}; "
                              f"create the folder or choose another path")
    try:
        fd, trial = tempfile.mkstemp(prefix=".probe-" + os.path.basename(path) + "-", dir=folder)
        os.close(fd)
        os.unlink(trial)
    except OSError as error:
        raise CheckpointError(f"cannot write the checkpoint {path!r}: the folder {folder!r} is not writable "
                              f"({error.strerror or error}); choose another path") from None


def write(checkpoint: Checkpointing, state: State, history: History | None) -> None:
    """``fwdtrain.save`` to ``checkpoint.path``; an OSError becomes a ``CheckpointWriteError`` carrying the results."""
    try:
        save(checkpoint.path, state, history, metadata=checkpoint.metadata)
    except OSError as error:
        path = os.fspath(checkpoint.path)
        raise CheckpointWriteError(
            f"could not save the checkpoint {path!r}: {error.strerror or error}; the run's state and history "
            f"are in this error's .state and .history", path=path, state=state, history=history) from None


__all__ = ["Checkpointing", "CheckpointWriteError", "as_checkpointing", "probe", "write"]
