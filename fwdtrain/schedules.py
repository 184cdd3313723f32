"""Learning-rate schedules: pure, branch-free functions of the time t.

Each factory returns ``schedule(t) -> alpha(t)``; ``t`` may be a float or a
0-d tensor, and the schedule works under ``vmap`` and ``torch.compile``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

Schedule = Callable[[torch.Tensor], torch.Tensor]


def _as_tensor(t) -> torch.Tensor:
    return t if isinstance(t, torch.Tensor) else torch.as_tensor(t, dtype=torch.float64)


def constant(value: float) -> Schedule:
    """alpha(t) = value."""
    value = float(value)

    def schedule(t):
        return torch.full_like(_as_tensor(t), value)

    return schedule


def inverse_time(scale: float, offset: float = 1.0) -> Schedule:
    """alpha(t) = scale / (offset + t): int alpha = inf, int alpha^2 < inf (the Robbins-Monro conditions)."""
    if offset <= 0:
        raise ValueError(f"inverse_time needs offset > 0 so that alpha(0) is finite, got {offset}")
    scale, offset = float(scale), float(offset)

    def schedule(t):
        return scale / (offset + _as_tensor(t))

    return schedule


def piecewise_constant(values: Sequence[float], boundaries: Sequence[float]) -> Schedule:
    """alpha(t) = values[i] for boundaries[i-1] < t <= boundaries[i] (values[0] up to boundaries[0]).

    Branch-free: alpha(t) = values[0] + sum_i (values[i+1] - values[i]) 1[t > boundaries[i]].
    """
    values = [float(v) for v in values]
    boundaries = [float(b) for b in boundaries]
    if len(values) != len(boundaries) + 1:
        raise ValueError(f"piecewise_constant needs one more value than boundaries, "
                         f"got {len(values)} values and {len(boundaries)} boundaries")
    if any(b1 <= b0 for b0, b1 in zip(boundaries, boundaries[1:])):
        raise ValueError(f"boundaries must increase strictly, got {boundaries}")
    jumps = [(b, v1 - v0) for b, v0, v1 in zip(boundaries, values, values[1:])]

    def schedule(t):
        t = _as_tensor(t)
        alpha = torch.full_like(t, values[0])
        for boundary, jump in jumps:
            alpha = alpha + jump * (t > boundary).to(t.dtype)
        return alpha

    return schedule


def staged(scale: float) -> Schedule:
    """The seed's schedule: C up to t = 50, C/2 up to 100, C/5 up to 500, C/10 after."""
    return piecewise_constant([scale, scale / 2, scale / 5, scale / 10], [50.0, 100.0, 500.0])
