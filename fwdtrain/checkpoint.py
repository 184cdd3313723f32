"""Checkpoints: the state, the history so far (with the noise position) and metadata, on disk.

Written atomically (a temporary file in the same folder, fsync, ``os.replace``), so a
crash while saving leaves the previous checkpoint intact; read with
``torch.load(weights_only=True)``, so a file cannot run code; verified with a SHA-256
digest of its contents, so a corrupt or truncated file is refused, never half-loaded.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from typing import Any, NamedTuple

import torch

from .history import History
from .errors import CheckpointError
from .state import State

FORMAT = "fwdtrain-checkpoint"
VERSION = 1


class Checkpoint(NamedTuple):
    """What ``load`` returns: continue with ``run(sde, ck.state, steps, dt, lr, history=ck.history)``."""

    state: State
    history: History | None
    metadata: dict


def _plain(value: Any, where: str) -> Any:
    """Check that ``value`` is made of what ``weights_only`` loading accepts; NamedTuples become dicts."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, (str, int)):
                raise TypeError(f"checkpoint: {where} has a key of type {type(key).__name__}; use str keys")
        return {key: _plain(item, f"{where}[{key!r}]") for key, item in value.items()}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_plain(item, f"{where}[{i}]") for i, item in enumerate(value))
    raise TypeError(f"checkpoint: {where} is a {type(value).__name__}; a checkpoint holds only tensors, numbers, "
                    f"strings and (nested) dicts, lists and tuples of them")


def _digest(value: Any) -> str:
    """SHA-256 over a canonical walk of the contents (structure, dtypes, shapes and bytes)."""
    h = hashlib.sha256()

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous().reshape(-1)
            h.update(f"T{t.dtype}{tuple(v.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(v, dict):
            h.update(f"D{len(v)}".encode())
            for key in sorted(v, key=repr):
                h.update(repr(key).encode())
                walk(v[key])
        elif isinstance(v, (list, tuple)):
            h.update(f"{type(v).__name__}{len(v)}".encode())
            for item in v:
                walk(item)
        else:
            h.update(f"V{type(v).__name__}{v!r}".encode())

    walk(value)
    return h.hexdigest()


def save(path: str | os.PathLike, state: State, history: History | None = None, *,
         metadata: dict | None = None) -> None:
    """Write ``state``, ``history`` (its records and noise position) and ``metadata`` to ``path``, atomically."""
    if not isinstance(state, State):
        raise TypeError(f"save(path, state, ...) expects a fwdtrain.State, got {type(state).__name__}")
    if history is not None and not isinstance(history, History):
        raise TypeError(f"history must be a fwdtrain.History or None, got {type(history).__name__}")
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict or None, got {type(metadata).__name__}")
    content = {
        "state": _plain(state._asdict(), "state"),
        "history": None if history is None else _plain(history._asdict(), "history"),
        "metadata": _plain(dict(metadata or {}), "metadata"),
    }
    payload = {"format": FORMAT, "version": VERSION, "digest": _digest(content), "content": content}
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(path) + "-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


def load(path: str | os.PathLike, *, map_location: Any = None) -> Checkpoint:
    """Read a checkpoint written by ``save``; raise ``CheckpointError`` for anything else.

    Uses ``torch.load(weights_only=True)``: only tensors and plain containers are
    unpickled, never arbitrary objects.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path!r}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(f"{path!r} holds objects other than tensors and plain containers; refused "
                              f"(weights_only loading). It is not a fwdtrain checkpoint: {str(error)[:200]}") from None
    except (RuntimeError, EOFError, ValueError, OSError) as error:
        raise CheckpointError(f"{path!r} is truncated or corrupt and cannot be read: {str(error)[:200]}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path!r} is not a fwdtrain checkpoint")
    if payload.get("version") != VERSION:
        raise CheckpointError(f"{path!r} has checkpoint version {payload.get('version')!r}; "
                              f"this fwdtrain reads version {VERSION}")
    content = payload.get("content")
    if not isinstance(content, dict) or _digest(content) != payload.get("digest"):
        raise CheckpointError(f"{path!r} is corrupt: its contents do not match the digest written with them")
    try:
        state = State(**content["state"])
        history = None if content["history"] is None else History(**content["history"])
        metadata = content["metadata"]
    except (KeyError, TypeError) as error:
        raise CheckpointError(f"{path!r} is missing parts of a fwdtrain checkpoint: {error}") from None
    return Checkpoint(state, history, metadata)


__all__ = ["Checkpoint", "save", "load", "CheckpointError"]
