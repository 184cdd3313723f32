"""Where compiled kernels live on disk, and how they are named so that a stale one never runs.

``cache_dir()`` (``$FWDTRAIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/fwdtrain``, ``~/.cache/fwdtrain``)
holds:

- ``kernels/<key>.pt2``: AOTInductor packages, one per traced graph. The key is a SHA-256 over
  everything the compiled code depends on (``kernel_key``): the traced ATen graph itself and the
  bytes of every constant it holds (the user's closed-over tensors), the inputs' shapes, strides,
  dtypes and devices, the torch version, the CPU's instruction set, the compiler options and
  fwdtrain's kernel format. Anything that changes the graph changes the key.
- ``inductor/``: inductor's own caches (FX graphs, the instruction-set probe's builds) and, with
  ``isa.json``, the probe's result, so that a later process skips the probe.
- ``stats.json``: how long this machine took to compile (``record_compile``), for
  ``fwdtrain.compile.policy``.

A package is written to a temporary file and renamed, so a crash never leaves half a kernel.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

CACHE_ENV = "FWDTRAIN_CACHE_DIR"
FORMAT = 2  # fwdtrain's kernel format: bump when the way graphs are called changes (2: the loop's packed carry)


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
    """SHA-256 (hex) of everything a compiled graph depends on (see the module docstring)."""
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


def stats_path() -> Path:
    return cache_dir() / "stats.json"


def read_stats() -> dict[str, Any]:
    """This machine's compile record (``record_compile``); {} when none or unreadable."""
    try:
        with open(stats_path()) as file:
            stats = json.load(file)
        return stats if isinstance(stats, dict) else {}
    except (OSError, ValueError):
        return {}


def write_stats(stats: dict[str, Any]) -> None:
    """Replace this machine's record (atomically; best effort: a read-only cache only loses the record)."""
    try:
        path = stats_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps({**stats, "torch": torch.__version__, "updated": time.time()}))
        os.replace(temporary, path)
    except OSError:
        pass


def record_compile(seconds: float, nodes: int) -> None:
    """Remember that compiling a graph of ``nodes`` ATen operations took ``seconds`` here (best effort)."""
    stats = read_stats()
    entries = [e for e in stats.get("compiles", []) if isinstance(e, list) and len(e) == 2][-19:]
    entries.append([float(seconds), int(nodes)])
    write_stats({**stats, "compiles": entries})


__all__ = [
    "CACHE_ENV",
    "FORMAT",
    "cache_dir",
    "kernel_key",
    "machine",
    "package_path",
    "read_stats",
    "record_compile",
    "writable_temporary",
    "write_stats",
]
