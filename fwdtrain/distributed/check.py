"""The group check: one collective, made by every rank at the same steps, that stops the whole group.

Every rank writes one row (status code, t, particles, cost sum, theta checksums) of an
(R, 7) table; one all_reduce gives every rank the whole table, so every rank reaches
the same verdict and raises the same ``GroupError`` at the same step.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from ..core._tree import leaves
from ..core.state import State
from .group import GroupError, all_reduce, is_initialized, rank, world_size

# status bits a rank reports at a check
OK, NON_FINITE_PARTICLES, NON_FINITE_THETA, FAILED, DIVERGED, INTERRUPTED = 0, 1, 2, 4, 8, 16
_FIELDS = 7  # code, t, particles, weighted cost sum, weight of the cost, theta checksums (2)
_TEXT = (
    (FAILED, "raised an exception (see its output)"),
    (INTERRUPTED, "was interrupted (Ctrl-C)"),
    (DIVERGED, "diverged: x, x_tilde or theta became non-finite or exceeded the bound"),
    (NON_FINITE_PARTICLES, "has NaN/inf in x or x_tilde"),
    (NON_FINITE_THETA, "has NaN/inf in theta"),
)


class GroupStatus(NamedTuple):
    """What a check learned about the whole group: the particle-weighted mean cost since the last check."""

    cost: float


def _theta_checksums(theta: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """sum theta_i and sum theta_i (i + 1) / p over the flattened theta, in float64."""
    flat = torch.cat([leaf.reshape(-1).to(torch.float64) for leaf in leaves(theta)])
    weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64, device=flat.device) / flat.numel()
    return flat.sum(), (flat * weights).sum()


def finite_code(state: State) -> int:
    """OK, or the NON_FINITE_* bits of ``state``."""
    particles = all(bool(torch.isfinite(leaf).all()) for leaf in leaves((state.x, state.x_tilde)))
    theta = all(bool(torch.isfinite(leaf).all()) for leaf in leaves(state.theta))
    return (0 if particles else NON_FINITE_PARTICLES) | (0 if theta else NON_FINITE_THETA)


def _exchange(
    state: State,
    code: int,
    cost_sum: torch.Tensor | float,
    cost_count: float,
    step: int | None,
    last_good: State | None,
) -> torch.Tensor:
    """Every rank writes its row of a (R, fields) table; one all_reduce (sum) gives everyone all rows."""
    device = leaves(state.theta)[0].device
    size = world_size() if is_initialized() else 1
    table = torch.zeros((size, _FIELDS), dtype=torch.float64, device=device)
    checksum_a, checksum_b = _theta_checksums(state.theta)

    def number(value: Any) -> torch.Tensor:  # a cost sum of an ensemble: the mean over its members
        return torch.as_tensor(value, dtype=torch.float64, device=device).mean().reshape(())

    table[rank() if is_initialized() else 0] = torch.stack(
        [
            number(float(code)),
            number(state.t.amax()),
            number(float(state.x.shape[-2])),
            number(cost_sum) * state.x.shape[-2],
            number(float(cost_count * state.x.shape[-2])),
            checksum_a,
            checksum_b,
        ]
    )
    if is_initialized():
        all_reduce(table, "the group check", step, last_good)
    return table.cpu()


def _describe(code: int) -> str:
    return " and ".join(text for bit, text in _TEXT if code & bit)


def _judge(table: torch.Tensor, step: int | None, last_good: State | None) -> GroupStatus:
    where = f" at step {step}" if step is not None else ""
    codes = table[:, 0].long().tolist()
    bad = [r for r, c in enumerate(codes) if c != OK]
    if bad:
        reason = (
            "failed"
            if any(codes[r] & FAILED for r in bad)
            else "interrupted"
            if any(codes[r] & INTERRUPTED for r in bad)
            else "non-finite"
        )
        detail = "; ".join(f"rank {r} {_describe(codes[r])}" for r in bad)
        raise GroupError(
            f"the process group stops{where}: {detail}", reason=reason, ranks=bad, step=step, state=last_good
        )
    times = table[:, 1]
    if not bool((times == times[0]).all()):
        raise GroupError(
            f"the ranks are out of step{where}: times {times.tolist()}; every rank must run "
            f"the same steps with the same dt",
            reason="out-of-step",
            ranks=[r for r in range(len(times)) if times[r] != times[0]],
            step=step,
            state=last_good,
        )
    sums = table[:, 5:7]
    differ = [r for r in range(len(sums)) if not bool((sums[r] == sums[0]).all())]
    if differ:
        raise GroupError(
            f"theta differs across ranks{where}: checksums {sums[:, 0].tolist()}; ranks {differ} "
            f"disagree with rank 0. Start every rank from the same theta "
            f"(fwdtrain.distributed.broadcast) and reduce every gradient with gradient_mean",
            reason="theta-mismatch",
            ranks=differ,
            step=step,
            state=last_good,
        )
    weight = float(table[:, 4].sum())
    return GroupStatus(cost=float(table[:, 3].sum()) / weight if weight > 0 else math.nan)


def check_group(
    state: State,
    step: int | None = None,
    *,
    cost: torch.Tensor | float = 0.0,
    cost_steps: int = 0,
    failed: bool = False,
    code: int | None = None,
    last_good: State | None = None,
) -> GroupStatus:
    """One collective that every rank must make at the same step; raises ``GroupError`` on every rank if

    any rank is ``failed`` (or reports a non-zero status ``code``, one of the bits FAILED,
    DIVERGED, INTERRUPTED, NON_FINITE_*) or holds a non-finite state, the ranks' times
    differ, or their theta checksums differ (theta must be bitwise equal). ``cost`` /
    ``cost_steps`` are this rank's summed particle-mean cost over ``cost_steps`` steps,
    and the result carries the group's particle-weighted mean. Usable as a callback
    ``lambda n, state: check_group(state, n)`` of ``fwdtrain.run`` (all ranks run in lockstep).
    """
    code = (FAILED if failed else 0) | (code or 0) | finite_code(state)
    table = _exchange(state, code, cost, float(cost_steps), step, last_good)
    return _judge(table, step, last_good if last_good is not None else (state if code == OK else None))


__all__ = [
    "DIVERGED",
    "FAILED",
    "INTERRUPTED",
    "NON_FINITE_PARTICLES",
    "NON_FINITE_THETA",
    "OK",
    "GroupStatus",
    "check_group",
    "finite_code",
]
