"""The training record: ``History``, and building, joining and slicing it.

A history holds R records. Record r is taken at step n_r and holds

    cost_r         = (1/(n_r - g_r)) sum_{g_r < k <= n_r} mean_i c(X^i_{k-1})   (g_r: the previous record on the grid)
    grad_norm_r    = |G_{n_r - 1}|
    average_cost_r = (1/n_r) sum_{k < n_r} mean_i c(X^i_k)                       (float64, the online estimate of J)

with ``theta`` (or whatever the driver was told to record) stacked over records, and, when the state
carries a Polyak-Ruppert average, ``theta_average`` (the running mean of theta at each record).
Every training loop in fwdtrain (``run``, and ``distributed.distributed_run`` through it) builds its
history here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from ._tree import tree_map

FIELDS = ("step", "t", "cost", "grad_norm", "average_cost")  # the per-record (R,) tensors


class History(NamedTuple):
    """What ``run`` records every ``SaveAt.every`` steps and at the last step: R records.

    Attributes:
        step: (R,) step count n since the start of training (continues across calls and resumes).
        t: (R,) time t_n.
        cost: (R,) particle-mean cost averaged over the steps since the previous record on the grid of
            ``SaveAt.every``: the mean over k in (g, n] of (1/N) sum_i c(X^i_{k-1}).
        grad_norm: (R,) |G_{n-1}|, the norm of the gradient estimate of the last step.
        theta: ``SaveAt.record(state)`` stacked over records; by default theta itself, leaves (R, *s).
        average_cost: (R,) float64 running mean of the particle-mean cost over every step since the start
            of training, (1/n) sum_{k<n} (1/N) sum_i c(X^i_k): the online estimate of J.
        carry: What a continuation needs: the noise position after the last record and the running cost
            sums (a dict of tensors; saved in checkpoints).
        interrupted: 0-d bool tensor, True when the run was stopped by KeyboardInterrupt.
        diverged: Ensembles only (None otherwise): (E,) bool, member e diverged and is frozen.
        frozen_at: Ensembles only: (E,) int64, the step of member e's last finite state (the one it is
            frozen at; its records after that step hold NaN costs), -1 for a member still running.
        theta_average: The state's Polyak-Ruppert mean of theta (``State.average.mean``) stacked over
            records (leaves (R, *s)); None when the state carries no average.
        compiled: 0-d bool, whether the last steps of the call that made this history ran compiled; None where
            no step was taken. ``route`` says it in words.
        compiled_from: 0-d int64, the step count at which that call's steps began to run compiled: its first
            step where it loaded (or compiled first) its kernel, a later one where it switched to a kernel compiled
            in the background (``fwdtrain.Compile``); None where every step ran eagerly.

    In an ensemble (``fwdtrain.ensemble``) every per-record field but ``step`` has a member axis after the
    record axis: t, cost, grad_norm, average_cost (R, E), theta leaves (R, E, *s);
    ``fwdtrain.ensemble.member_history(history, e)`` is member e's own History.

    Every leaf is a tensor, so a History is a pytree like the State (``tree_map`` works on it).
    The last record is always the final state of the run; pass the history back to
    ``run`` (with that state) to continue it.
    """

    step: torch.Tensor
    t: torch.Tensor
    cost: torch.Tensor
    grad_norm: torch.Tensor
    theta: Any
    average_cost: torch.Tensor | None = None
    carry: dict | None = None
    interrupted: torch.Tensor | None = None
    diverged: torch.Tensor | None = None
    frozen_at: torch.Tensor | None = None
    theta_average: Any = None
    compiled: torch.Tensor | None = None
    compiled_from: torch.Tensor | None = None

    @property
    def route(self) -> str | None:
        """ "compiled" or "eager": how the last call's steps ran (``compiled``); None where no step was taken."""
        return None if self.compiled is None else ("compiled" if bool(self.compiled) else "eager")

    @property
    def steps(self) -> int:
        """Steps taken since the start of training (0 for an empty history)."""
        return int(self.step[-1]) if len(self.step) else 0

    @property
    def noise(self) -> dict | None:
        """The noise position after the last record (``state_dict`` of the source)."""
        return None if self.carry is None else self.carry.get("noise")

    def numpy(self) -> dict[str, Any]:
        """The records as numpy arrays: {"step", "t", "cost", "grad_norm", "theta", "average_cost"} (and
        "theta_average" when recorded)."""

        def as_array(x):
            return x.detach().cpu().numpy()

        out = {
            "step": as_array(self.step),
            "t": as_array(self.t),
            "cost": as_array(self.cost),
            "grad_norm": as_array(self.grad_norm),
            "theta": tree_map(as_array, self.theta),
        }
        if self.average_cost is not None:
            out["average_cost"] = as_array(self.average_cost)
        if self.theta_average is not None:
            out["theta_average"] = tree_map(as_array, self.theta_average)
        return out


class Records(NamedTuple):
    """R records taken together (a block's, or one taken alone: R = 1): step (R,) int64, t, cost, grad_norm and
    average_cost (R,), theta and theta_average (the averaged theta, or None) pytrees with a leading axis R."""

    step: torch.Tensor
    t: torch.Tensor
    cost: torch.Tensor
    grad_norm: torch.Tensor
    average_cost: torch.Tensor
    theta: Any
    theta_average: Any = None

    @property
    def last(self) -> int:
        return int(self.step[-1])

    @staticmethod
    def one(
        step: int, t: Any, cost: Any, grad_norm: Any, average_cost: Any, theta: Any, average: Any = None
    ) -> Records:
        """A single record (0-d tensors, theta a pytree) as a block of one row."""
        row = lambda tree: tree_map(lambda leaf: torch.as_tensor(leaf)[None], tree)
        return Records(torch.tensor([step], dtype=torch.long), *row((t, cost, grad_norm, average_cost, theta, average)))


def last_step(records: Sequence[Records]) -> int | None:
    """The step of the last record (None for none)."""
    return records[-1].last if records else None


def _joined(blocks: Sequence[Records]) -> Records:
    """Blocks of records as one block, in order."""
    if len(blocks) == 1:
        return blocks[0]
    averaged = all(b.theta_average is not None for b in blocks)
    step, t, cost, grad, average = (torch.cat([b[i] for b in blocks]) for i in range(5))
    return Records(
        step,
        t,
        cost,
        grad,
        average,
        tree_map(lambda *xs: torch.cat(xs), *[b.theta for b in blocks]),
        tree_map(lambda *xs: torch.cat(xs), *[b.theta_average for b in blocks]) if averaged else None,
    )


def empty_records(example: Any) -> Any:
    """A pytree like ``example`` with a leading record axis of length 0."""
    return tree_map(lambda leaf: torch.as_tensor(leaf)[None][:0], example)


def build(
    records: Sequence[Records],
    empty_theta: Any,
    *,
    carry: dict | None = None,
    interrupted: bool = False,
    dtype: torch.dtype,
    device: torch.device | None = None,
    previous: History | None = None,
    diverged: torch.Tensor | None = None,
    frozen_at: torch.Tensor | None = None,
    empty_average: Any = None,
    compiled: bool | None = None,
    compiled_from: int | None = None,
) -> History:
    """Stack ``records`` into a History (appended to ``previous`` when given; its carry and flags replaced).

    ``empty_average``: the empty ``theta_average`` for no records (None: the records hold no average)."""
    theta_average = empty_average
    if records:
        step, t, cost, grad, average, theta, stacked_average = _joined(records)
        if stacked_average is not None:
            theta_average = stacked_average
    else:
        step = torch.zeros(0, dtype=torch.long)
        t = cost = grad = torch.zeros(0, dtype=dtype, device=device)
        average = torch.zeros(0, dtype=torch.float64, device=device)
        theta = empty_theta
    new = History(
        step=step,
        t=t,
        cost=cost,
        grad_norm=grad,
        theta=theta,
        average_cost=average,
        carry=carry,
        interrupted=torch.tensor(interrupted),
        diverged=diverged,
        frozen_at=frozen_at,
        theta_average=theta_average,
        compiled=None if compiled is None else torch.tensor(compiled),
        compiled_from=None if compiled_from is None else torch.tensor(compiled_from, dtype=torch.int64),
    )
    if previous is not None and len(previous.step):
        joined = concatenate([previous, new])
        assert joined is not None
        return joined
    return new


def concatenate(pieces: Sequence[History]) -> History | None:
    """The records of ``pieces`` one after the other, with the last piece's carry and flags (None for no pieces)."""
    pieces = [piece for piece in pieces if piece is not None]
    if not pieces:
        return None
    last = pieces[-1]
    kept = [piece for piece in pieces if len(piece.step)] or [last]
    if len(kept) == 1:
        return kept[0]._replace(
            carry=last.carry,
            interrupted=last.interrupted,
            diverged=last.diverged,
            frozen_at=last.frozen_at,
            compiled=last.compiled,
            compiled_from=last.compiled_from,
        )
    averaged = all(p.theta_average is not None for p in kept)  # else a piece recorded none: dropped
    return last._replace(
        **{name: torch.cat([getattr(p, name) for p in kept]) for name in FIELDS},  # type: ignore[arg-type]
        theta=tree_map(lambda *xs: torch.cat(xs), *[p.theta for p in kept]),
        theta_average=tree_map(lambda *xs: torch.cat(xs), *[p.theta_average for p in kept]) if averaged else None,
    )


def records(history: History, start: int | None = None, stop: int | None = None) -> History:
    """Records start:stop of ``history`` (as a Python slice; the carry and flag kept)."""
    cut = slice(start, stop)
    average = history.theta_average
    return history._replace(
        **{name: getattr(history, name)[cut] for name in FIELDS},
        theta=tree_map(lambda leaf: leaf[cut], history.theta),
        theta_average=None if average is None else tree_map(lambda leaf: leaf[cut], average),
    )


__all__ = ["FIELDS", "History", "Records", "build", "concatenate", "empty_records", "last_step", "records"]
