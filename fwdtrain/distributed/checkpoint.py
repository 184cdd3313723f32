"""Checkpoints of a whole group: one file, written by rank 0, with every rank's particles.

The file is an ordinary ``fwdtrain.save`` checkpoint of rank 0's state and the group's
history (``fwdtrain.load`` reads it as rank 0's run), whose metadata also holds
``world_size`` and ``ranks``: for each rank r its x, x_tilde and history carry (the
position of its noise stream and its running cost sums), gathered with ``gather_to_main``.
theta, t and the records are the same on every rank and are stored once.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..core._tree import tree_map
from ..core.errors import CheckpointError
from ..core.history import History
from ..core.state import State
from ..driver.checkpoint import Checkpoint, load, save
from .group import GroupError, all_reduce, gather_to_main, is_initialized, is_main, rank, scatter_from_main, world_size


def _cpu(tree: Any) -> Any:
    return tree_map(lambda leaf: leaf.detach().cpu() if isinstance(leaf, torch.Tensor) else leaf, tree)


def save_group(path: str | os.PathLike, state: State, history: History, *, metadata: dict | None = None) -> None:
    """Every rank calls it at the same step; rank 0 writes ``path`` atomically (``fwdtrain.save``).

    Raises on every rank when rank 0 could not write (rank 0 its own error, the others ``GroupError``).
    """
    own = _cpu({"x": state.x, "x_tilde": state.x_tilde, "carry": history.carry})
    entries = gather_to_main(own)
    error = None
    if is_main():
        assert entries is not None
        try:
            save(path, state, history, metadata={**(metadata or {}), "world_size": len(entries), "ranks": entries})
        except Exception as caught:
            error = caught
    if is_initialized():
        flag = torch.tensor([0.0 if error is None else 1.0], dtype=torch.float64)
        all_reduce(flag, "the checkpoint flag")
        if error is None and float(flag) > 0:
            raise GroupError(
                f"rank {rank()}: rank 0 could not write the checkpoint {os.fspath(path)!r} (see its output)",
                reason="failed",
                ranks=(0,),
            )
    if error is not None:
        raise error


def _entry(checkpoint: Checkpoint, size: int, path: str) -> list[Any]:
    """Rank 0: [(ok, Checkpoint or message) for every rank] from a loaded file."""
    metadata = dict(checkpoint.metadata)
    ranks = metadata.pop("ranks", None)
    saved = int(metadata.get("world_size", 1))
    if ranks is None:  # a single-process checkpoint: its own state is rank 0's
        ranks = [
            _cpu(
                {
                    "x": checkpoint.state.x,
                    "x_tilde": checkpoint.state.x_tilde,
                    "carry": None if checkpoint.history is None else checkpoint.history.carry,
                }
            )
        ]
    if saved != size or len(ranks) != size:
        message = (
            f"{path!r} holds a run of {saved} process(es) but this group has {size}; resume with "
            f"the same number of processes (torchrun --nproc-per-node {saved})"
        )
        return [(False, message)] * size
    out = []
    for entry in ranks:
        state = checkpoint.state._replace(x=entry["x"], x_tilde=entry["x_tilde"])
        history = None if checkpoint.history is None else checkpoint.history._replace(carry=entry["carry"])
        out.append((True, Checkpoint(state, history, metadata)))
    return out


def load_group(path: str | os.PathLike, *, map_location: Any = None) -> Checkpoint:
    """This rank's ``Checkpoint`` from a file written by ``save_group`` (or by ``fwdtrain.save`` for one process).

    Every rank calls it; rank 0 reads the file (it need not be on the other machines) and
    sends each rank its own particles and noise position. A ``CheckpointError`` on every
    rank when the file cannot be read or was written by a group of another size.
    """
    path = os.fspath(path)
    entries = None
    if is_main():
        try:
            entries = _entry(load(path), world_size() if is_initialized() else 1, path)
        except CheckpointError as error:
            entries = [(False, str(error))] * (world_size() if is_initialized() else 1)
    ok, payload = scatter_from_main(entries)
    if not ok:
        raise CheckpointError(payload)
    if map_location is not None:
        payload = Checkpoint(
            *tree_map(lambda leaf: leaf.to(map_location) if isinstance(leaf, torch.Tensor) else leaf, tuple(payload))
        )
    return payload


__all__ = ["load_group", "save_group"]
