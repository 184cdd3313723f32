"""Per-rank noise seeds: rank r's Brownian stream is ``BrownianNoise(..., seed=rank_seed(seed, r))``."""

from __future__ import annotations

import numpy as np
import torch

from .group import rank as _this_rank


def rank_seed(seed: int, rank: int | None = None) -> int:
    """A 63-bit seed for ``rank``'s noise (default: this process's rank), from SeedSequence(seed, spawn_key=(rank,)).

    Deterministic, different for every rank, and independent of the world size,
    so rank r's stream is the same in a group of 2 or of 8.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    r = _this_rank() if rank is None else rank
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0:
        raise ValueError(f"rank must be a non-negative integer, got {r!r}")
    high, low = np.random.SeedSequence(int(seed), spawn_key=(int(r),)).generate_state(2, np.uint32)
    return ((int(high) << 32) | int(low)) & (2**63 - 1)


def rank_generator(seed: int, device: torch.device | str = "cpu", rank: int | None = None) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``rank_seed(seed, rank)``."""
    return torch.Generator(device=device).manual_seed(rank_seed(seed, rank))


__all__ = ["rank_generator", "rank_seed"]
