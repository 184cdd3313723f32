"""The process group: joining it, who am I, and the few collectives fwdtrain needs (with timeouts).

Without a process group (a plain single process) every function here is the one-process
identity: rank 0 of 1, ``broadcast`` and ``group_mean`` return their input, ``gather_to_main``
returns a one-element list.
"""

from __future__ import annotations

import datetime
import math
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..core._tree import leaves, tree_map

DEFAULT_TIMEOUT = 60.0  # seconds; for rendezvous and for every collective


class GroupError(RuntimeError):
    """Raised on every rank when the group cannot go on.

    reason: "failed" (a rank raised), "non-finite" (a rank's state is NaN/inf or beyond the bound),
    "interrupted" (a rank was stopped by Ctrl-C), "theta-mismatch" (ranks hold different theta),
    "out-of-step" (ranks are at different times) or "lost" (a collective failed: a rank exited or
    hung past the timeout).
    ranks: the ranks at fault (empty when unknown); step: the step count at the check (None when
    unknown); state, history: this rank's last state (and, from ``distributed_run``, history) that
    passed a group check (None before the first check).
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        ranks: Sequence[int] = (),
        step: int | None = None,
        state: Any = None,
        history: Any = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.ranks = tuple(ranks)
        self.step = step
        self.state = state
        self.history = history


_LOST = False  # a collective of this process failed: its gloo/nccl context is broken


def lost() -> bool:
    """Whether a collective of this process's group failed (a peer exited or hung). Its context is then
    broken: ``destroy_process_group`` leaves it alone, and a process should exit without tearing it down
    (``fwdtrain.cli.entry`` does), since torch's teardown of a broken gloo context can abort the process."""
    return _LOST


def _lost(message: str, error: BaseException, **details: Any) -> GroupError:
    """The ``GroupError`` ("lost") of a failed collective, remembered by ``lost``."""
    global _LOST
    _LOST = True
    return GroupError(f"{message} ({error})", reason="lost", **details)


def is_initialized() -> bool:
    """Whether this process is in a torch.distributed process group."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank: from the process group, else torchrun's RANK, else 0."""
    if is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", 0))


def world_size() -> int:
    """The number of processes R: from the process group, else torchrun's WORLD_SIZE, else 1."""
    if is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", 1))


def is_main() -> bool:
    """True on rank 0 (and in a single process): the one that prints, writes and plots."""
    return rank() == 0


def print_main(*args: Any, **kwargs: Any) -> None:
    """``print`` on rank 0 only."""
    if is_main():
        print(*args, **kwargs)


def backend_for(device: torch.device | str | None = None) -> str:
    """The backend for tensors on ``device``: gloo for CPU; for CUDA, nccl (gloo kept for CPU tensors).

    With no device, CUDA is used when it is available.
    """
    cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    return "cpu:gloo,cuda:nccl" if cuda else "gloo"


def local_device() -> torch.device:
    """cuda:LOCAL_RANK when CUDA is available, else cpu: where this rank's inputs usually belong."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    return torch.device("cpu")


_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def init_process_group(
    backend: str | None = None, *, device: torch.device | str | None = None, timeout: float = DEFAULT_TIMEOUT
) -> bool:
    """Join the process group that torchrun describes in RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.

    ``timeout`` (seconds) bounds the rendezvous and every later collective, so a
    rank that never arrives or hangs makes the others raise instead of waiting
    forever. The backend follows ``device`` (see ``backend_for``); for a CUDA
    device this process is bound to it (cuda:LOCAL_RANK when no index is given).
    Returns True when a group is initialised (already or now), False when the
    environment names no group (a plain single process: a no-op).
    """
    if is_initialized():
        return True
    if not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        return False
    missing = [name for name in _ENV if name not in os.environ]
    if missing:
        raise ValueError(
            f"the environment describes a process group only in part: {', '.join(missing)} "
            f"missing; launch with torchrun, or set all of {', '.join(_ENV)}"
        )
    try:
        r, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except ValueError as error:
        raise ValueError(
            f"RANK and WORLD_SIZE must be integers, got RANK={os.environ['RANK']!r}, "
            f"WORLD_SIZE={os.environ['WORLD_SIZE']!r}"
        ) from error
    if not 0 <= r < size:
        raise ValueError(f"need 0 <= RANK < WORLD_SIZE, got RANK={r}, WORLD_SIZE={size}")
    if device is not None and torch.device(device).type == "cuda":
        device = torch.device(device)
        torch.cuda.set_device(device if device.index is not None else int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(
        backend=backend or backend_for(device),
        init_method="env://",
        rank=r,
        world_size=size,
        timeout=datetime.timedelta(seconds=timeout),
    )
    return True


def destroy_process_group(*, wait: float | None = None) -> None:
    """Leave the process group, if any.

    ``wait`` (seconds): first wait up to that long for every rank to get here, so that no rank
    exits while another still works (e.g. rank 0 evaluating or plotting); a rank that is gone
    or late only ends the wait.
    """
    if not is_initialized() or _LOST:  # a broken context is left alone: its teardown can abort the process
        return
    if wait is not None and dist.get_world_size() > 1:
        try:
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=wait))
            else:
                dist.barrier()
        except RuntimeError:
            pass
    dist.destroy_process_group()


def require_group() -> None:
    """Refuse a torchrun environment (WORLD_SIZE > 1) in which this process has not joined the group."""
    if world_size() > 1 and not is_initialized():
        raise ValueError(
            f"WORLD_SIZE is {world_size()} but this process has not joined the group: call "
            f"fwdtrain.distributed.init_process_group() first (each rank would train alone)"
        )


def all_reduce(tensor: torch.Tensor, what: str, step: int | None = None, state: Any = None) -> None:
    """In-place all_reduce (sum) with a ``GroupError`` ("lost") when the group is broken."""
    try:
        dist.all_reduce(tensor)
    except RuntimeError as error:
        raise _lost(
            f"rank {rank()}: the all_reduce of {what} failed; another rank has probably failed, exited or "
            f"hung past the process group's timeout. Check the other ranks' output.",
            error,
            step=step,
            state=state,
        ) from error


def broadcast(tree: Any, src: int = 0) -> Any:
    """A copy of rank ``src``'s pytree of tensors on every rank (e.g. theta, to start from one model)."""
    copies = tree_map(lambda leaf: leaf.detach().clone(), tree)
    if is_initialized() and dist.get_world_size() > 1:
        try:
            for leaf in leaves(copies):
                dist.broadcast(leaf, src)
        except RuntimeError as error:
            raise _lost(f"rank {rank()}: the broadcast from rank {src} failed", error) from error
    return copies


def group_mean(tree: Any, weight: float | None = None, *, what: str = "a group mean") -> Any:
    """sum_r w_r tree_r / sum_r w_r over the group, leaf by leaf, with one all_reduce of all leaves.

    ``weight`` is this rank's w_r (e.g. its particle count; 1 when None). Without a
    process group, ``tree`` itself. Every rank must call it with the same structure.
    """
    if not is_initialized():
        return tree
    parts = leaves(tree)
    w = 1.0 if weight is None else float(weight)
    flat = torch.cat(
        [part.reshape(-1) * w for part in parts] + [torch.full((1,), w, dtype=parts[0].dtype, device=parts[0].device)]
    )
    all_reduce(flat, what)
    values = (flat[:-1] / flat[-1]).split([part.numel() for part in parts])
    means = iter(value.reshape(part.shape).to(part.dtype) for value, part in zip(values, parts, strict=True))
    return tree_map(lambda _: next(means), tree)


def gather_to_main(obj: Any) -> list[Any] | None:
    """[obj of rank 0, ..., obj of rank R-1] on rank 0, None elsewhere; [obj] without a group.

    Any picklable object, e.g. each rank's particles and noise position for a checkpoint
    that rank 0 writes.
    """
    if not is_initialized():
        return [obj]
    gathered = [None] * dist.get_world_size() if is_main() else None
    try:
        dist.gather_object(obj, gathered, dst=0)
    except RuntimeError as error:
        raise _lost(f"rank {rank()}: gathering objects on rank 0 failed", error) from error
    return gathered


def scatter_from_main(objects: list[Any] | None) -> Any:
    """Rank r's entry of rank 0's list ``objects`` (ignored elsewhere); ``objects[0]`` without a group."""
    if not is_initialized():
        assert objects is not None
        return objects[0]
    out = [None]
    try:
        dist.scatter_object_list(out, objects if is_main() else None, src=0)
    except RuntimeError as error:
        raise _lost(f"rank {rank()}: receiving objects from rank 0 failed", error) from error
    return out[0]


__all__ = [
    "DEFAULT_TIMEOUT",
    "GroupError",
    "all_reduce",
    "backend_for",
    "broadcast",
    "destroy_process_group",
    "gather_to_main",
    "group_mean",
    "init_process_group",
    "is_initialized",
    "is_main",
    "local_device",
    "lost",
    "print_main",
    "rank",
    "require_group",
    "scatter_from_main",
    "world_size",
]
