"""What a benchmark ran on, for its JSON and its table's caption: CPUs, versions, threads and the load."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from typing import Any


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (the platform's processor string elsewhere)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe() -> dict[str, Any]:
    """nproc, the CPU model, torch's and jax's versions, torch's thread count and the load average (1, 5, 15 min)."""
    import torch

    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "jax": _version("jax"),
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
    }


def caption(before: dict[str, Any], after: tuple[float, ...] | None = None) -> str:
    """One line: 'nproc 2, <CPU>, torch x, jax y, threads t, load 1.2 before, 1.4 after'."""
    load = f"load average {before['load_average'][0]:.2f} before"
    if after is not None:
        load += f", {after[0]:.2f} after"
    jax = f", jax {before['jax']}" if before.get("jax") else ""
    return (
        f"nproc {before['nproc']}, {before['cpu']}, torch {before['torch']}{jax}, threads {before['threads']}, {load}"
    )


__all__ = ["caption", "cpu_model", "describe"]
