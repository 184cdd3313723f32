"""Checkpoints: the state, the history so far (with the noise position) and metadata, on disk.

Written atomically (a temporary file in the same folder, fsync, ``os.replace``), so a
crash while saving leaves the previous checkpoint intact; read with
``torch.load(weights_only=True)``, so a file cannot run code; verified with a SHA-256
digest of its contents, so a corrupt or truncated file is refused, never half-loaded.
``load`` raises ``CheckpointError`` and nothing else for a damaged, foreign or hand-edited
file; ``check_compatible`` refuses a checkpoint whose theta does not fit the problem's.
A save removes the temporary files an interrupted earlier save to the same path left behind.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import tempfile
import warnings
from typing import Any, NamedTuple

import optree
import torch

from .. import optim
from ..core._tree import leaves_with_paths
from ..core.errors import CheckpointError
from ..core.history import History
from ..core.sensitivity import Theta
from ..core.state import State

FORMAT = "fwdtrain-checkpoint"
VERSION = 1


class Checkpoint(NamedTuple):
    """What ``load`` returns; a start for ``fwdtrain.run``: ``run(problem, checkpoint, steps, dt, lr)`` continues
    the saved run (same step count, running cost and noise stream).

    Attributes:
        state: The saved ``State`` (with its update rule's state and average).
        history: The saved ``History`` (with the noise position), or None when saved without one.
        metadata: The saved metadata dict.
    """

    state: State
    history: History | None
    metadata: dict


# NamedTuples a checkpoint may hold (the optimiser states and the running average of a State):
# saved as {TAG: name, "fields": {...}} (weights_only loading takes plain containers only), restored by name.
TAG = "__namedtuple__"
_NAMED: dict[str, type] = {
    cls.__name__: cls for cls in (optim.EmptyState, optim.MomentumState, optim.AdamState, optim.RmsState, optim.Average)
}


def _plain(value: Any, where: str) -> Any:
    """Check that ``value`` is made of what ``weights_only`` loading accepts; the NamedTuples of
    ``fwdtrain.optim`` become tagged dicts (``TAG``)."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        name = type(value).__name__
        if _NAMED.get(name) is not type(value):
            raise TypeError(
                f"checkpoint: {where} is a {name}; a checkpoint holds the NamedTuples of "
                f"fwdtrain.optim ({', '.join(_NAMED)}) and otherwise only tensors, numbers, strings "
                f"and (nested) dicts, lists and tuples of them: keep a rule's state of your own in those"
            )
        return {TAG: name, "fields": _plain(value._asdict(), where)}  # type: ignore[attr-defined]
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
    raise TypeError(
        f"checkpoint: {where} is a {type(value).__name__}; a checkpoint holds only tensors, numbers, "
        f"strings and (nested) dicts, lists and tuples of them"
    )


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


def check_folder(path: str | os.PathLike, what: str = "checkpoint") -> str:
    """The folder of ``path`` (absolute); ``CheckpointError`` when ``path`` is itself a folder or its folder does
    not exist (or is a file), naming the path the user chose and the fix."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CheckpointError(
            f"the {what} path {path!r} is a folder; name a file, e.g. "
            f"{os.path.join(path, 'run.pt' if what == 'checkpoint' else 'run.png')!r}"
        )
    if not os.path.isdir(folder):
        state = "is a file, not a folder" if os.path.exists(folder) else "does not exist"
        raise CheckpointError(
            f"cannot write the {what} {path!r}: its folder {folder!r} {state}; create the folder or choose another path"
        )
    return folder


def save(
    path: str | os.PathLike, state: State, history: History | None = None, *, metadata: dict | None = None
) -> None:
    """Write a run to ``path``, atomically: a temporary file in the same folder, fsync, then a rename.

    A crash while saving leaves the previous file intact; temporary files that an earlier save to the same
    ``path`` left behind (a process killed while writing) are removed once this save has succeeded. The
    contents carry a SHA-256 digest that ``load`` verifies.

    Args:
        path: The file to write.
        state: The ``State`` (its opt_state and average included).
        history: The ``History`` (its records and noise position), or None.
        metadata: Keyword only. A dict with str keys of plain values: tensors, numbers, strings, None and
            (nested) dicts, lists and tuples of them.

    Raises:
        TypeError: A state, history or metadata of the wrong type, or a value a checkpoint cannot hold.
        CheckpointError: ``path`` is a folder, its folder does not exist or cannot be written (checked before
            anything is written, naming ``path``).
        OSError: The file could not be written.
    """
    if not isinstance(state, State):
        raise TypeError(f"save(path, state, ...) expects a fwdtrain.State, got {type(state).__name__}")
    if history is not None and not isinstance(history, History):
        raise TypeError(f"history must be a fwdtrain.History or None, got {type(history).__name__}")
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict or None, got {type(metadata).__name__}")
    for key in metadata or {}:
        if not isinstance(key, str):
            raise TypeError(
                f"checkpoint: metadata has a key {key!r} of type {type(key).__name__}; "
                f"top-level metadata keys must be str"
            )
    content = {
        "state": _plain(state._asdict(), "state"),
        "history": None if history is None else _plain(history._asdict(), "history"),
        "metadata": _plain(dict(metadata or {}), "metadata"),
    }
    payload = {"format": FORMAT, "version": VERSION, "digest": _digest(content), "content": content}
    path = os.fspath(path)
    folder = check_folder(path)
    prefix = _temporary_prefix(path)
    try:
        fd, temporary = tempfile.mkstemp(prefix=prefix, dir=folder)
    except OSError as error:
        raise CheckpointError(
            f"cannot write the checkpoint {path!r}: the folder {folder!r} is not writable "
            f"({error.strerror or error}); choose another path"
        ) from None
    started = os.fstat(fd).st_mtime_ns
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
    _remove_stale_temporaries(folder, prefix, started)


def _temporary_prefix(path: str) -> str:
    return ".tmp-" + os.path.basename(path) + "-"


def _remove_stale_temporaries(folder: str, prefix: str, before_ns: int) -> None:
    """Delete ``prefix`` + 8 ``mkstemp`` characters files in ``folder`` last modified before ``before_ns``.

    Best effort: a file that vanishes or cannot be removed is left to the next save.
    """
    pattern = re.compile(re.escape(prefix) + r"[a-z0-9_]{8}")
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if not pattern.fullmatch(entry.name):
            continue
        try:
            if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime_ns < before_ns:
                os.unlink(entry.path)
        except OSError:
            pass


class _Invalid(Exception):
    """A part of a checkpoint that does not have the structure ``save`` writes (internal)."""


def _tensor(value: Any, where: str, ndim: int | None = None, floating: bool = False) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise _Invalid(f"{where} is a {type(value).__name__}, expected a tensor")
    if ndim is not None and value.ndim != ndim:
        raise _Invalid(f"{where} has shape {tuple(value.shape)}, expected {ndim} dimension(s)")
    if floating and not value.is_floating_point():
        raise _Invalid(f"{where} has dtype {value.dtype}, expected a floating dtype")
    return value


def _fields(value: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    if not isinstance(value, dict):
        raise _Invalid(f"{where} is a {type(value).__name__}, expected a dict")
    missing = [key for key in required if key not in value]
    extra = [key for key in value if key not in required + optional]
    if missing or extra:
        raise _Invalid(f"{where} has keys {sorted(map(repr, value))}: missing {missing}, unexpected {extra}")
    return value


def _tree(value: Any, where: str) -> list[tuple[str, Any]]:
    """The leaves of a pytree of tensors (dicts with str keys, lists, tuples), with their paths."""

    def walk(v: Any, at: str) -> list[tuple[str, Any]]:
        if isinstance(v, dict):
            for key in v:
                if not isinstance(key, str):
                    raise _Invalid(f"{at} has a key {key!r} of type {type(key).__name__}, expected str")
            return [leaf for key, item in v.items() for leaf in walk(item, f"{at}[{key!r}]")]
        if type(v) in (list, tuple):
            return [leaf for i, item in enumerate(v) for leaf in walk(item, f"{at}[{i}]")]
        return [(at, _tensor(v, at))]

    return walk(value, where)


def _restore(value: Any, where: str) -> Any:
    """The NamedTuples of ``fwdtrain.optim`` back from their tagged dicts (everything else as it is)."""
    if isinstance(value, dict) and TAG in value:
        tagged = _fields(value, where, (TAG, "fields"))
        cls = _NAMED.get(tagged[TAG]) if isinstance(tagged[TAG], str) else None
        if cls is None:
            raise _Invalid(f"{where} is a {tagged[TAG]!r:.40}, not one of {sorted(_NAMED)}")
        names: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
        inner = _fields(tagged["fields"], f"{where}['fields']", names)
        return cls(**{key: _restore(inner[key], f"{where}.{key}") for key in names})
    if isinstance(value, dict):
        return {key: _restore(item, f"{where}[{key!r}]") for key, item in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_restore(item, f"{where}[{i}]") for i, item in enumerate(value))
    return value


def _check_training(state: dict) -> dict:
    """opt_state, average and the jump score (absent in checkpoints written before they existed: ``()``),
    restored and checked."""
    state = dict(state)
    for name in ("opt_state", "average", "score"):
        value = _restore(state.get(name, ()), f"state[{name!r}]")
        for path, leaf in zip(*optree.tree_flatten_with_path(value)[:2], strict=True):
            _tensor(leaf, f"state[{name!r}]" + "".join(f"[{key!r}]" for key in path))
        state[name] = value
    optim.check_average(state["average"], state["theta"], "state['average']")
    score = state["score"]
    if not (isinstance(score, tuple) and not score) and optree.tree_structure(score) != optree.tree_structure(
        state["theta"]
    ):
        raise _Invalid("state['score'] does not have the structure of state['theta']")
    return state


def _check_state(state: Any) -> State:
    """State fields: x (N, d) floating, theta a pytree of x's dtype, x_tilde leaves (N, d, *s), t 0-d;
    or an ensemble's (``fwdtrain.ensemble``): x (E, N, d), theta leaves (E, *s), x_tilde (E, N, d, *s), t (E,);
    opt_state and average (optional) pytrees of tensors, the average shaped like theta."""
    required = ("x", "x_tilde", "theta", "t")
    state = _check_training(_fields(state, "state", required, tuple(f for f in State._fields if f not in required)))
    x = _tensor(state["x"], "state['x']", floating=True)
    if x.ndim not in (2, 3):
        raise _Invalid(f"state['x'] has shape {tuple(x.shape)}, expected (N, d) or an ensemble's (E, N, d)")
    if 0 in x.shape:
        raise _Invalid(f"state['x'] has shape {tuple(x.shape)}; a state has at least one particle and dimension")
    members = x.shape[:1] if x.ndim == 3 else ()
    t = _tensor(state["t"], "state['t']", ndim=len(members), floating=True)
    if tuple(t.shape) != members:
        raise _Invalid(f"state['t'] has shape {tuple(t.shape)}, expected {members} (one clock per member)")
    theta = _tree(state["theta"], "state['theta']")
    if not theta:
        raise _Invalid("state['theta'] holds no tensors")
    _tree(state["x_tilde"], "state['x_tilde']")
    if optree.tree_structure(state["theta"]) != optree.tree_structure(state["x_tilde"]):
        raise _Invalid("state['x_tilde'] does not have the structure of state['theta']")
    for (at, leaf), (at_tilde, sensitivity) in zip(
        leaves_with_paths(state["theta"]), leaves_with_paths(state["x_tilde"]), strict=True
    ):
        at, at_tilde = "state['theta']" + at, "state['x_tilde']" + at_tilde
        if leaf.dtype != x.dtype or sensitivity.dtype != x.dtype:
            raise _Invalid(f"{at} or {at_tilde} does not have the dtype {x.dtype} of state['x']")
        if tuple(leaf.shape[: len(members)]) != members:
            raise _Invalid(f"{at} has shape {tuple(leaf.shape)}, expected a leading member axis {members}")
        expected = (*x.shape, *leaf.shape[len(members) :])
        if tuple(sensitivity.shape) != expected:
            raise _Invalid(
                f"{at_tilde} has shape {tuple(sensitivity.shape)}, expected {expected} (particles, d, *shape of {at})"
            )
    return State(**state)


def _check_history(history: Any) -> History | None:
    """History fields: step, t, cost, grad_norm (and average_cost) of one length R; theta leaves (R, ...)."""
    if history is None:
        return None
    required = ("step", "t", "cost", "grad_norm", "theta")
    history = _fields(history, "history", required, tuple(f for f in History._fields if f not in required))
    step = _tensor(history["step"], "history['step']", ndim=1)
    if step.is_floating_point() or step.is_complex() or step.dtype == torch.bool:
        raise _Invalid(f"history['step'] has dtype {step.dtype}, expected an integer dtype")
    records = step.shape[0]
    diverged, frozen_at = history.get("diverged"), history.get("frozen_at")
    if (diverged is None) != (frozen_at is None):
        raise _Invalid(
            "history['diverged'] and history['frozen_at'] must be given together (an ensemble's) or not at all"
        )
    members = ()
    if diverged is not None:
        diverged = _tensor(diverged, "history['diverged']", ndim=1)
        frozen_at = _tensor(frozen_at, "history['frozen_at']", ndim=1)
        if diverged.dtype != torch.bool or frozen_at.shape != diverged.shape or frozen_at.is_floating_point():
            raise _Invalid("history['diverged'] must be (E,) bool and history['frozen_at'] (E,) integer")
        members = tuple(diverged.shape)  # type: ignore[assignment]
    for name in ("t", "cost", "grad_norm", "average_cost"):
        if name == "average_cost" and history.get(name) is None:
            continue
        value = _tensor(history[name], f"history[{name!r}]", ndim=1 + len(members))
        if value.shape[1:] != members:
            raise _Invalid(f"history[{name!r}] has shape {tuple(value.shape)}, expected (records, *{members})")
        if value.shape[0] != records:
            raise _Invalid(f"history[{name!r}] has {value.shape[0]} records, history['step'] has {records}")
    for name in ("theta", "theta_average"):
        if history.get(name) is None:
            continue
        for at, leaf in _tree(history[name], f"history[{name!r}]"):
            if leaf.ndim == 0 or leaf.shape[0] != records:
                raise _Invalid(f"{at} has shape {tuple(leaf.shape)}, expected ({records}, ...): one row per record")
    carry = history.get("carry")
    if carry is not None:
        if not isinstance(carry, dict) or not all(isinstance(key, str) for key in carry):
            raise _Invalid("history['carry'] must be a dict with str keys")
        noise = carry.get("noise")
        if noise is not None and not (
            isinstance(noise, dict) and len(noise) == 1 and isinstance(next(iter(noise.values())), dict)
        ):
            raise _Invalid("history['carry']['noise'] must be {kind: state} for one noise source")
    for name in ("interrupted", "compiled", "compiled_from"):
        if history.get(name) is not None:
            _tensor(history[name], f"history[{name!r}]", ndim=0)
    return History(**history)


def _check_metadata(metadata: Any) -> dict:
    if not isinstance(metadata, dict):
        raise _Invalid(f"metadata is a {type(metadata).__name__}, expected a dict")
    for key in metadata:
        if not isinstance(key, str):
            raise _Invalid(f"metadata has a key {key!r} of type {type(key).__name__}, expected str")
    return metadata


ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive; fwdtrain.save always has


def _read(path: str, map_location: Any) -> Any:
    """``torch.load(weights_only=True)``; any failure becomes a ``CheckpointError`` that says whether the file
    is not a checkpoint at all (not the zip archive ``torch.save`` writes) or a damaged one."""
    with open(path, "rb") as file:
        magic = file.read(len(ZIP_MAGIC))
    if not magic:
        raise CheckpointError(f"{path!r} is empty (0 bytes): it is not a fwdtrain checkpoint")
    if magic != ZIP_MAGIC:
        raise CheckpointError(
            f"{path!r} is not a fwdtrain checkpoint: it is not a file written by fwdtrain.save (a checkpoint is the "
            f"zip archive torch.save writes; this file starts with {magic!r})"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a damaged file can make torch warn about its pickle protocol
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"{path!r} was refused by weights_only loading: it holds objects other than tensors and plain "
            f"containers, or it is corrupt. It is not a readable fwdtrain checkpoint: {str(error)[:200]}"
        ) from None
    except MemoryError:
        raise CheckpointError(f"{path!r} is corrupt: reading it asked for more memory than there is") from None
    except Exception as error:
        raise CheckpointError(
            f"{path!r} is truncated or corrupt and cannot be read "
            f"({type(error).__name__}: {str(error)[:200]}); use an intact copy"
        ) from None


def load(path: str | os.PathLike, *, map_location: Any = None) -> Checkpoint:
    """Read a checkpoint written by ``save``.

    Uses ``torch.load(weights_only=True)``: only tensors and plain containers are unpickled, never
    arbitrary objects. The contents must match their digest and have the structure ``save`` writes
    (consistent State shapes, History records, a metadata dict).

    Args:
        path: The checkpoint file.
        map_location: Keyword only. As for ``torch.load`` (e.g. ``"cpu"``).

    Returns:
        ``Checkpoint(state, history, metadata)``, a start for ``fwdtrain.run``.

    Raises:
        CheckpointError: No file there, or a file that is not a fwdtrain checkpoint, of another version,
            truncated, corrupt or hand-edited; nothing else is raised for a bad file.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path!r}")
    payload = _read(path, map_location)
    if not isinstance(payload, dict) or not _equal(payload.get("format"), FORMAT):
        raise CheckpointError(f"{path!r} is not a fwdtrain checkpoint (no {FORMAT!r} header)")
    if not _equal(payload.get("version"), VERSION):
        raise CheckpointError(
            f"{path!r} has checkpoint version {payload.get('version')!r:.40}; this fwdtrain reads version {VERSION}"
        )
    content, digest = payload.get("content"), payload.get("digest")
    try:
        intact = isinstance(content, dict) and isinstance(digest, str) and _digest(content) == digest
    except Exception:
        intact = False
    if not intact:
        raise CheckpointError(f"{path!r} is corrupt: its contents do not match the digest written with them")
    try:
        content = _fields(content, "the contents", ("state", "history", "metadata"))
        return Checkpoint(
            _check_state(content["state"]), _check_history(content["history"]), _check_metadata(content["metadata"])
        )
    except Exception as error:
        raise CheckpointError(
            f"{path!r} is not a valid fwdtrain checkpoint: {error}. It was not written by "
            f"fwdtrain.save (version {VERSION}) or was edited afterwards"
        ) from None


def _equal(value: Any, expected: str | int) -> bool:
    """``value == expected`` for a header field that may be of any type (a tensor would not give a bool)."""
    return type(value) is type(expected) and value == expected


def check_compatible(
    checkpoint: Checkpoint | State, theta: Theta, *, x0: torch.Tensor | None = None, name: str = "the problem"
) -> None:
    """Check that a checkpoint fits a problem before resuming it, so that one of another SDE is refused by name.

    Args:
        checkpoint: A ``Checkpoint`` from ``load``, or a ``State``.
        theta: The problem's parameter pytree (e.g. ``model.theta``).
        x0: Keyword only. The problem's x0: the state dimension d and the particles' dtype are checked too.
        name: Keyword only. How the messages call the problem.

    Raises:
        CheckpointError: The checkpoint's theta lacks or adds a leaf, or has another structure, shape or
            dtype; or its particles have another dimension or dtype than ``x0``.
        TypeError: ``checkpoint`` is neither a Checkpoint nor a State.
    """
    state = checkpoint.state if isinstance(checkpoint, Checkpoint) else checkpoint
    if not isinstance(state, State):
        raise TypeError(f"check_compatible expects a Checkpoint or State, got {type(checkpoint).__name__}")
    saved = dict(leaves_with_paths(state.theta))
    wanted = dict(leaves_with_paths(theta))
    missing = ["theta" + path for path in wanted if path not in saved]
    extra = ["theta" + path for path in saved if path not in wanted]
    if missing or extra:
        raise CheckpointError(
            f"the checkpoint's theta does not fit {name}: "
            + "; ".join(
                part
                for part in (
                    missing and f"{name} has {', '.join(missing)} that the checkpoint lacks",
                    extra and f"the checkpoint has {', '.join(extra)} that {name} lacks",
                )
                if part
            )
            + ". It was saved for another problem or model; resume it with the problem it was written for"
        )
    if optree.tree_structure(state.theta) != optree.tree_structure(theta):
        raise CheckpointError(
            f"the checkpoint's theta has the structure {optree.tree_structure(state.theta)}, "
            f"{name} has {optree.tree_structure(theta)}; resume it with the problem it was written for"
        )
    for path, leaf in wanted.items():
        got = saved[path]
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(f"theta{path} is a {type(leaf).__name__}, expected a tensor")
        if got.shape != leaf.shape or got.dtype != leaf.dtype:
            raise CheckpointError(
                f"the checkpoint's theta{path} is {tuple(got.shape)} {got.dtype} but {name} has "
                f"{tuple(leaf.shape)} {leaf.dtype}: it was saved for another model size or dtype; "
                f"use the same settings (e.g. --hidden, --dtype) as the run that wrote it"
            )
    if x0 is not None:
        d = x0.shape[-1] if x0.ndim else 0
        if state.x.shape[1] != d or state.x.dtype != x0.dtype:
            raise CheckpointError(
                f"the checkpoint's particles are {tuple(state.x.shape)} {state.x.dtype} but "
                f"{name}'s x0 has dimension d = {d} and dtype {x0.dtype}; resume it with the "
                f"problem it was written for"
            )


__all__ = ["Checkpoint", "CheckpointError", "check_compatible", "check_folder", "load", "save"]
