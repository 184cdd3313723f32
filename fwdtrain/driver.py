"""The loop: repeated pure ``step``s with seeded Brownian increments and a history."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from . import _checks
from ._tree import leaves, squared_norm, tree_map
from .problem import SDE
from .sensitivity import Mode
from .state import State, noise_dim
from .step import LearningRate, _resolve_mode, advance, check_step_inputs, learning_rate


class History(NamedTuple):
    """What ``run`` records every ``record_every`` steps (R records).

    step (R,) step count; t (R,) time; cost (R,) particle-mean cost averaged over
    the steps since the previous record; grad_norm (R,) |G_n| at the record;
    theta: pytree like theta with leaves (R, *s).
    """

    step: torch.Tensor
    t: torch.Tensor
    cost: torch.Tensor
    grad_norm: torch.Tensor
    theta: Any


NOISE_BLOCK = 64  # steps of noise drawn per generator call; part of the noise stream's definition


def brownian_increments(generator: torch.Generator, steps: int, shape: tuple[int, int], dt: float,
                        dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(steps, N, m) increments N(0, dt), drawn in blocks of NOISE_BLOCK steps."""
    return torch.randn((steps, *shape), generator=generator, dtype=dtype, device=device) * math.sqrt(dt)


def run(
    sde: SDE,
    state: State,
    steps: int,
    dt: float,
    lr: LearningRate,
    seed: int = 0,
    *,
    record_every: int = 100,
    mode: Mode = "auto",
) -> tuple[State, History]:
    """Take ``steps`` pure steps from ``state`` with noise from ``torch.Generator().manual_seed(seed)``.

    The same arguments give bitwise the same result. Returns the final state and
    the ``History``.
    """
    steps = _checks.check_count(steps, "steps", minimum=0)
    record_every = _checks.check_count(record_every, "record_every")
    m = noise_dim(sde, state.theta, state.x)
    dtype, device = state.x.dtype, state.x.device
    check_step_inputs(sde, state, torch.zeros((state.particles, m), dtype=dtype, device=device), dt, lr)
    resolved = _resolve_mode(mode, state, m)
    generator = torch.Generator(device=device).manual_seed(seed)
    records: dict[str, list] = {"step": [], "t": [], "cost": [], "grad_norm": [], "theta": []}
    cost_sum, cost_count = 0.0, 0
    n = 0
    while n < steps:
        block = brownian_increments(generator, NOISE_BLOCK, (state.particles, m), dt, dtype, device)
        for dw in block[: steps - n]:
            state, info = advance(sde, state, dw, dt, learning_rate(lr, state.t), resolved)
            n += 1
            cost_sum, cost_count = cost_sum + info.cost, cost_count + 1
            if n % record_every == 0 or n == steps:
                records["step"].append(n)
                records["t"].append(state.t)
                records["cost"].append(cost_sum / cost_count)
                records["grad_norm"].append(squared_norm(info.gradient).sqrt())
                records["theta"].append(state.theta)
                cost_sum, cost_count = 0.0, 0
    history = History(
        step=torch.tensor(records["step"], dtype=torch.long),
        t=torch.stack(records["t"]) if records["t"] else torch.zeros(0, dtype=dtype),
        cost=torch.stack(records["cost"]) if records["cost"] else torch.zeros(0, dtype=dtype),
        grad_norm=torch.stack(records["grad_norm"]) if records["grad_norm"] else torch.zeros(0, dtype=dtype),
        theta=tree_map(lambda *xs: torch.stack(xs), *records["theta"]) if records["theta"]
        else tree_map(lambda leaf: leaf[None][:0], state.theta),
    )
    return state, history
