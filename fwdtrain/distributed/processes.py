"""A local launcher: run a function in R processes joined into one process group (tests, benchmarks).

The processes rendezvous on 127.0.0.1 through the environment variables torchrun sets, so
code that runs under ``launch`` runs under ``torchrun`` unchanged.
"""

from __future__ import annotations

import os
import pickle
import socket
import time
import traceback
from collections.abc import Callable
from queue import Empty
from typing import Any

import torch

from .. import _compat as compat
from ..core import _checks
from .group import destroy_process_group, init_process_group, local_device


class LaunchError(RuntimeError):
    """Some local process raised, exited without a result, or overran.

    ``errors`` maps rank -> message (a traceback), ``results`` rank -> result for the ranks that finished.
    """

    def __init__(self, message: str, errors: dict[int, str], results: dict[int, Any]) -> None:
        super().__init__(message)
        self.errors = errors
        self.results = results


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _child(
    fn: Callable[..., Any], r: int, size: int, port: int, args: tuple, queue: Any, backend: str | None, timeout: float
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(r),
        WORLD_SIZE=str(size),
        LOCAL_RANK=str(r),
        LOCAL_WORLD_SIZE=str(size),
    )
    try:
        init_process_group(backend, device=local_device() if torch.cuda.is_available() else None, timeout=timeout)
        # plain pickle: tensors by value (torch's ForkingPickler would share memory owned by this process)
        queue.put((r, True, pickle.dumps(fn(*args))))
    except BaseException:  # report everything, including SystemExit, to the parent
        queue.put((r, False, traceback.format_exc()))
    finally:
        destroy_process_group()


def launch(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    *,
    timeout: float = 120.0,
    group_timeout: float = 30.0,
    backend: str | None = None,
) -> list[Any]:
    """Run ``fn(*args)`` in ``world_size`` local processes joined into one process group.

    The processes rendezvous on 127.0.0.1 at a free port through the same
    environment variables torchrun sets, with ``group_timeout`` on the group.
    ``fn`` must be picklable (defined at module level); processes are forked from
    a server that has imported torch once ("forkserver"), so later launches are
    quick. Returns [result on rank 0, ..., rank R-1]. Raises ``LaunchError`` when
    a rank raises or exits without a result, and kills every process still alive
    after ``timeout`` seconds.
    """
    import multiprocessing

    size = _checks.check_count(world_size, "world_size")
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(list(compat.PRELOAD_MODULES))
    queue = context.Queue()
    port = _free_port()
    processes = [
        context.Process(  # type: ignore[attr-defined]  # every start method's context has Process
            target=_child, args=(fn, r, size, port, args, queue, backend, group_timeout), daemon=True
        )
        for r in range(size)
    ]
    for process in processes:
        process.start()
    deadline = time.monotonic() + timeout
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    try:
        while len(results) + len(errors) < size and time.monotonic() < deadline:
            try:
                r, ok, payload = queue.get(timeout=0.05)
                if ok:
                    results[r] = pickle.loads(payload)
                else:
                    errors[r] = payload
            except Empty:  # look for ranks that died without a word
                for r, process in enumerate(processes):
                    if process.exitcode is not None and r not in results and r not in errors and queue.empty():
                        errors[r] = f"exited with code {process.exitcode} without a result"
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
    finally:
        alive = [r for r, process in enumerate(processes) if process.is_alive()]
        for r in alive:
            processes[r].kill()
            processes[r].join(5)
            errors.setdefault(r, f"still running after {timeout} s; killed")
        queue.close()
    if errors:
        detail = "\n".join(f"--- rank {r}:\n{errors[r]}" for r in sorted(errors))
        raise LaunchError(f"{len(errors)} of {size} processes failed:\n{detail}", errors, results)
    return [results[r] for r in range(size)]


__all__ = ["LaunchError", "launch"]
