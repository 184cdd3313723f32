"""Where compiled kernels live on disk, how they are named so that a stale one never runs, and their cap.

``cache_dir()`` (``$FWDTRAIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/fwdtrain``, ``~/.cache/fwdtrain``) holds
``kernels/<key>.pt2`` (AOTInductor packages; the key hashes everything the compiled code depends on,
``kernel_key``; a run looks for its package by that key and nothing else), ``kernels/<key>.job`` and ``.log``
while a compile of it runs (``kernels._Package.start``), and ``inductor/`` (inductor's own caches).
A package is written to a temporary file and renamed, so a crash never leaves half a kernel. The packages are
capped (``limit_bytes``): a load marks its package used (``touch``), and after each package written ``prune``
removes the least recently used others until the total is within the cap, and the build folders AOTInductor
left in ``inductor/`` an hour ago or more (copies of what the packages hold). The performance guide's "Where
compiled kernels go" says the same for a user. This module also holds the process's kernels and counts: the
engine's only module-global state.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import platform
import re
import shutil
import tempfile
import time
import warnings
import weakref
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import torch

CACHE_ENV = "FWDTRAIN_CACHE_DIR"
LIMIT_ENV = "FWDTRAIN_CACHE_LIMIT"
DEFAULT_LIMIT_BYTES = 1_000_000_000  # 1 GB of packages and inductor's files
STALE_SECONDS = 3600.0  # a temporary file this old is a crashed compile's
FORMAT = 2  # fwdtrain's kernel format: bump when the way graphs are called changes (2: the loop's packed carry)


KERNELS_KEPT = 64  # compiled kernels a process keeps (least recently used first out)

# What this process holds: the module's only state (a kernel is a handle on a loaded package, so it is kept
# per process), and the count of compile events (tests count these, never seconds).
_kernels: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
_prepared: weakref.WeakKeyDictionary[Any, dict[Hashable, Any]] = weakref.WeakKeyDictionary()
_checked: weakref.WeakKeyDictionary[Any, set[Hashable]] = weakref.WeakKeyDictionary()
_events = collections.Counter(
    {"traces": 0, "compiles": 0, "loads": 0, "fallbacks": 0, "traced_ops": 0, "simplified_ops": 0}
)


def kernel(key: Hashable, build: Callable[[], Any]) -> Any:
    """The kernel this process built for ``key``, or ``build()`` kept under it (the least recently used one
    forgotten beyond ``KERNELS_KEPT``)."""
    if key in _kernels:
        _kernels.move_to_end(key)
        return _kernels[key]
    built = _kernels[key] = build()
    while len(_kernels) > KERNELS_KEPT:
        _kernels.popitem(last=False)
    return built


def prepared_steps(problem: Any) -> dict[Hashable, Any]:
    """The prepared steps (``fwdtrain.jit_step``) of ``problem`` in this process, by options: kept as long as the
    problem lives."""
    return _prepared.setdefault(problem, {})


def checked(problem: Any) -> set[Hashable]:
    """What was checked once of ``problem`` in this process (its fit to a state's shapes, a solver's value check):
    kept as long as the problem lives."""
    return _checked.setdefault(problem, set())


def forget_kernels() -> None:
    """Forget the kernels built in this process (the packages on disk stay)."""
    _kernels.clear()


def count(**events: int) -> None:
    """Add to this process's compile events (``traces``, ``compiles``, ``loads``, ``fallbacks``, ...)."""
    _events.update(events)


def counts() -> dict[str, int]:
    """How many kernels this process traced, compiled (AOTInductor or torch.compile), loaded from disk,
    and how many fell back (to torch.compile, or eager); ``traced_ops`` and ``simplified_ops``: the ATen calls of
    every traced graph as traced and after ``graphs.simplify``. Tests count these, never seconds."""
    return dict(_events)


def cache_dir() -> Path:
    """Where compiled kernels persist between launches: ``$FWDTRAIN_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/fwdtrain`` (``~/.cache/fwdtrain``). Never the working directory."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fwdtrain"


def machine() -> str:
    """The CPU's instruction set as compiled code depends on it: ATen's capability, the architecture and
    the flags line of /proc/cpuinfo (hashed; read once per call, a few microseconds)."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as info:
            flags = next((line for line in info if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return "|".join(
        (platform.machine(), torch.backends.cpu.get_cpu_capability(), hashlib.sha256(flags.encode()).hexdigest()[:16])
    )


def kernel_key(
    graph_code: str,
    constants: Iterable[tuple[str, torch.Tensor]],
    inputs: Iterable[torch.Tensor],
    options: dict[str, Any],
    kind: str,
) -> str:
    """SHA-256 (hex) of everything a compiled graph depends on: its ATen code and the bytes of every constant it
    holds (the user's closed-over tensors), the inputs' shapes, strides, dtypes and devices, the compiler options,
    ``kind``, the torch version, the CPU's instruction set (``machine``) and fwdtrain's kernel ``FORMAT``."""
    digest = hashlib.sha256()
    digest.update(f"fwdtrain-kernel {FORMAT} {kind} torch {torch.__version__} {machine()}\n".encode())
    digest.update(json.dumps(options, sort_keys=True, default=str).encode())
    digest.update(graph_code.encode())
    for name, tensor in constants:
        data = tensor.detach().cpu().contiguous()
        digest.update(f"\nconst {name} {data.dtype} {tuple(data.shape)}\n".encode())
        digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    for tensor in inputs:
        digest.update(f"\nin {tensor.dtype} {tuple(tensor.shape)} {tuple(tensor.stride())} {tensor.device}".encode())
    return digest.hexdigest()


def package_path(key: str) -> Path:
    """The AOTInductor package of ``key`` in ``cache_dir() / "kernels"`` (it may not exist)."""
    return cache_dir() / "kernels" / f"{key}.pt2"


def writable_temporary(path: Path) -> str:
    """A fresh temporary file name beside ``path`` (same folder, so that ``os.replace`` is atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".tmp-{path.stem[:16]}-", suffix=".pt2", dir=path.parent)
    os.close(fd)
    return name


# ---------------------------------------------------------------- the cap

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)
NO_LIMIT = ("none", "unlimited")
SIZE_FORMS = "bytes (500000000), a size with a unit (500M, 2G, 1.5GB, 512MiB) or 'none' for no cap"


def parse_size(text: str) -> int | None:
    """Bytes from ``text``: a number with an optional unit, K, M, G, T (powers of 1000) or KiB, MiB, GiB, TiB
    (powers of 1024), a trailing B optional, any case; ``"none"`` or ``"unlimited"``: None, no cap. ``0`` is a
    cap of zero (only the package just written stays). ``ValueError`` for anything else."""
    if text.strip().lower() in NO_LIMIT:
        return None
    found = _SIZE.match(text)
    if not found:
        raise ValueError(f"{text!r} is not a size: give {SIZE_FORMS}")
    return int(float(found.group(1)) * _UNITS[(found.group(2) or "").lower()])


def format_size(size: float) -> str:
    """``size`` bytes for a person: "678.0 MB" (powers of 1000, as ``parse_size`` reads them)."""
    for unit, factor in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{int(size)} B"


def limit_bytes() -> int | None:
    """The cache's cap in bytes (its packages and inductor's files): ``$FWDTRAIN_CACHE_LIMIT`` (``parse_size``),
    else ``DEFAULT_LIMIT_BYTES``; None: no cap. ``ValueError`` naming the variable, its value and the accepted forms
    for a bad value."""
    text = os.environ.get(LIMIT_ENV, "")
    if not text.strip():
        return DEFAULT_LIMIT_BYTES
    try:
        return parse_size(text)
    except ValueError:
        raise ValueError(f"{LIMIT_ENV}={text!r} is not a size: give {SIZE_FORMS}") from None


def touch(path: str | os.PathLike[str]) -> None:
    """Mark the package ``path`` as used now (its modification time), so that pruning keeps it longest.
    Best effort: a package gone or a read-only cache is left as it is."""
    try:
        os.utime(path)
    except OSError:
        pass


class Pruned(NamedTuple):
    """What a prune did: packages removed and the bytes freed (inductor's files' included); packages left and the
    bytes left under the cap (the packages and ``inductor/``)."""

    removed: int
    freed: int
    kept: int
    size: int


class _Piece(NamedTuple):
    """One removable piece of ``cache_dir() / "inductor"``: its paths, its bytes, when it was last used (the newest
    modification or access time of its files) and whether it is an AOTInductor build folder."""

    paths: tuple[str, ...]
    bytes: int
    used: float
    build: bool


def prune_to(limit: int | None, keep: str | os.PathLike[str] | None = None) -> Pruned:
    """Bring the cache within ``limit`` bytes (None: no cap), the packages of ``kernels/`` and inductor's files in
    ``inductor/`` counted together: the least recently used go first, never ``keep``, never a file of ``inductor/``
    written in the last ``STALE_SECONDS`` nor any while another process compiles there (``_compiling``: it may
    be using them). Always removed: ``.tmp-*``, ``*.job`` and ``*.log`` files and AOTInductor's build folders
    untouched for ``STALE_SECONDS``, and ``*.rejected`` packages. A file that another process removed first is
    skipped."""
    folder = cache_dir() / "kernels"
    kept_name = Path(keep).name if keep is not None else None
    packages: list[tuple[float, str, int]] = []  # (last use, name, bytes)
    removed = freed = 0
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        entries = []
    for entry in entries:
        try:
            stat = entry.stat(follow_symlinks=False)
            if entry.name.startswith(".tmp-") or entry.name.endswith((".job", ".log")):  # a compile's, or a crash's
                if now - stat.st_mtime > STALE_SECONDS:
                    freed += _unlink(entry.path, stat.st_size)
            elif entry.name.endswith(".rejected"):
                freed += _unlink(entry.path, stat.st_size)
            elif entry.name.endswith(".pt2") and entry.is_file(follow_symlinks=False):
                packages.append((stat.st_mtime, entry.name, stat.st_size))
        except FileNotFoundError:
            continue
    pieces, other = _inductor_pieces()
    stale = [piece for piece in pieces if piece.build and now - piece.used > STALE_SECONDS]
    freed += sum(_remove(piece) for piece in stale)
    pieces = [piece for piece in pieces if piece not in stale]
    size = sum(bytes_ for _, _, bytes_ in packages) + sum(piece.bytes for piece in pieces) + other
    if limit is None or size <= limit:
        return Pruned(removed, freed, len(packages), size)
    removable = not _compiling()
    candidates: list[tuple[float, str, int, _Piece | None]] = [
        (used, name, bytes_, None) for used, name, bytes_ in packages if name != kept_name
    ]
    candidates += [
        (piece.used, piece.paths[0], piece.bytes, piece)
        for piece in pieces
        if removable and not piece.build and now - piece.used > STALE_SECONDS
    ]
    for _, name, bytes_, piece in sorted(candidates, key=lambda candidate: candidate[:2]):  # oldest use first
        if size <= limit:
            break
        size -= bytes_
        if piece is not None:
            freed += _remove(piece)
        elif _unlink(os.path.join(folder, name), bytes_):
            removed, freed = removed + 1, freed + bytes_
    return Pruned(removed, freed, len(packages) - removed, size)


def _inductor_pieces() -> tuple[list[_Piece], int]:
    """The removable pieces of ``cache_dir() / "inductor"`` and the bytes of the rest (its ``locks/`` folders and
    the files at its top, such as the instruction-set probe's record). A folder holding an AOTInductor wrapper's
    source at its top is a compile's build folder (a copy of what its package holds): one piece. In every other
    folder (inductor's caches, the precompiled headers) each entry is one piece, with the entries that share its
    name up to the first dot (a source and its library, a header and its precompiled form)."""
    pieces: list[_Piece] = []
    other = 0
    try:
        tops = list(os.scandir(cache_dir() / "inductor"))
    except OSError:
        return pieces, other
    for top in tops:
        try:
            if not top.is_dir(follow_symlinks=False):
                other += top.stat(follow_symlinks=False).st_size
                continue
            names = os.listdir(top.path)
        except OSError:
            continue
        if top.name == "locks":
            other += _folder_bytes(Path(top.path))
            continue
        if any(name.endswith(".wrapper.cpp") for name in names):
            pieces.append(_piece([top.path], build=True))
            continue
        groups: dict[str, list[str]] = {}
        for name in names:
            if name == "locks":
                other += _folder_bytes(Path(top.path, name))
            else:
                groups.setdefault(name.split(".")[0], []).append(os.path.join(top.path, name))
        pieces += [_piece(paths, build=False) for paths in groups.values()]
    return [piece for piece in pieces if piece.paths], other


def _piece(paths: list[str], build: bool) -> _Piece:
    """The piece of ``paths`` (files or folders); the paths that vanished meanwhile left out."""
    found, size, used = [], 0, 0.0
    for path in paths:
        files = [path] if not os.path.isdir(path) else [os.path.join(r, n) for r, _, ns in os.walk(path) for n in ns]
        try:
            stats = [os.lstat(name) for name in files]
        except OSError:
            continue  # changing under another process
        found.append(path)
        size += sum(stat.st_size for stat in stats)
        used = max([used, *(max(stat.st_mtime, stat.st_atime) for stat in stats)])
    return _Piece(tuple(found), size, used, build)


def _remove(piece: _Piece) -> int:
    """Remove the piece's paths; its bytes if they are gone after, 0 otherwise."""
    for path in piece.paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            _unlink(path, 0)
    return piece.bytes if not any(os.path.lexists(path) for path in piece.paths) else 0


def _compiling() -> bool:
    """Whether another process holds one of inductor's locks in ``cache_dir() / "inductor"`` (its ``locks/`` and
    the precompiled headers' ``locks/``): a compile in progress there, which may be reading any of its files.
    True where locks cannot be tested (no ``fcntl``)."""
    try:
        import fcntl
    except ImportError:
        return True
    inductor = cache_dir() / "inductor"
    for folder in (inductor / "locks", inductor / "precompiled_headers" / "locks"):
        try:
            locks = [entry.path for entry in os.scandir(folder) if entry.name.endswith(".lock")]
        except OSError:
            continue
        for lock in locks:
            try:
                fd = os.open(lock, os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError:
                return True
            finally:
                os.close(fd)
    return False


def prune(keep: str | os.PathLike[str] | None = None) -> Pruned:
    """``prune_to(limit_bytes(), keep)``: the engine's call after writing the package ``keep``. Never raises: a
    bad ``$FWDTRAIN_CACHE_LIMIT`` is a one-line warning and the default cap applies."""
    try:
        limit = limit_bytes()
    except ValueError as error:
        warnings.warn(f"fwdtrain: {error}; using {format_size(DEFAULT_LIMIT_BYTES)}", stacklevel=2)
        limit = DEFAULT_LIMIT_BYTES
    try:
        return prune_to(limit, keep)
    except OSError:
        return Pruned(0, 0, 0, 0)


def _unlink(path: str, size: int) -> int:
    """Remove ``path``; ``size`` if this call removed it, 0 if it was gone (or cannot be removed)."""
    try:
        os.unlink(path)
        return size
    except OSError:
        return 0


class Usage(NamedTuple):
    """The cache folder's contents: the packages (count, bytes) and inductor's folder (bytes); ``total``, what the
    cap counts, is both."""

    packages: int
    package_bytes: int
    inductor_bytes: int

    @property
    def total(self) -> int:
        """The bytes the cap counts: the packages' and inductor's."""
        return self.package_bytes + self.inductor_bytes


def usage() -> Usage:
    """How many packages ``cache_dir()`` holds and their bytes (``.tmp-*`` and ``*.rejected`` files excluded), and
    the bytes of ``cache_dir() / "inductor"`` (a walk of that folder)."""
    sizes = []
    try:
        for entry in os.scandir(cache_dir() / "kernels"):
            if entry.name.endswith(".pt2") and not entry.name.startswith(".tmp-"):
                try:
                    sizes.append(entry.stat(follow_symlinks=False).st_size)
                except FileNotFoundError:
                    continue
    except OSError:
        pass
    return Usage(len(sizes), sum(sizes), _folder_bytes(cache_dir() / "inductor"))


def clear() -> Usage:
    """Empty ``kernels/`` and ``inductor/`` (the packages, inductor's caches; ``routes/``, 0.5's markers, too); what
    went, as ``usage()`` before less after (a file that cannot be removed stays and is not counted). Not while a
    process of this cache is compiling: its compile would fail."""
    before = usage()
    for folder in ("kernels", "inductor", "routes"):
        shutil.rmtree(cache_dir() / folder, ignore_errors=True)
    return Usage(*(was - left for was, left in zip(before, usage(), strict=True)))


def _folder_bytes(folder: Path) -> int:
    """The bytes of the files under ``folder`` (0 when there is none)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


__all__ = [
    "CACHE_ENV",
    "DEFAULT_LIMIT_BYTES",
    "FORMAT",
    "LIMIT_ENV",
    "NO_LIMIT",
    "SIZE_FORMS",
    "STALE_SECONDS",
    "Pruned",
    "Usage",
    "cache_dir",
    "clear",
    "counts",
    "forget_kernels",
    "format_size",
    "kernel_key",
    "limit_bytes",
    "machine",
    "package_path",
    "parse_size",
    "prune",
    "prune_to",
    "touch",
    "usage",
    "writable_temporary",
]
