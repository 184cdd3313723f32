"""The group as a hook of the ordinary loop: the gradient's group mean every step, one collective at every check.

``GroupHook`` makes ``fwdtrain.run`` on every rank a group run:

- ``reduce``: the particle-weighted group mean of the gradient (``reduce.GradientMean``), so R ranks with
  N particles each take the single-process step with R N particles;
- ``start``: the first agreement, before any step (a rank with other theta or bad input stops the group);
- ``checked``: at every divergence check, one ``check_group`` collective: every rank finished the same
  steps, is finite and holds the same theta, or every rank raises ``GroupError`` (carrying its last agreed
  state and history); an ensemble's per-member flags are combined (a member frozen on one rank is frozen
  on all);
- ``record``: a record's costs become means over every rank's particles;
- ``failed``: a rank that raised, diverged inside a block (every step is checked there) or was interrupted makes
  the gradient collectives the others make up to their next check, with a zero gradient, and reports there
  with its last good state, so every rank stops at the same check.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core._tree import squared_norm, tree_map
from ..core.errors import DivergenceError
from ..driver.hooks import Hook, RunView
from .check import DIVERGED, FAILED, INTERRUPTED, OK, check_group
from .group import GroupError, all_reduce, group_mean, is_initialized, print_main, world_size
from .reduce import GradientMean


class GroupHook(Hook):
    """The group's gradient mean and checks for ``fwdtrain.run`` on every rank (see the module docstring).

    ``weight``: this rank's particle count; ``every``: all-reduce the gradient every k steps (theta held over
    windows of k steps, ``GradientMean``); ``start``: the step count the run starts at; ``verbose``: a line
    on rank 0 every ``report_every`` steps with the group's cost.
    """

    reduces_gradient = True

    def __init__(
        self, weight: float, *, every: int = 1, start: int = 0, verbose: bool = False, report_every: int | None = None
    ) -> None:
        self.gradient = GradientMean(every, weight=weight, start=start)
        self.weight, self.verbose = weight, verbose
        self.every = report_every if verbose else None
        self.last: tuple[int, torch.Tensor] | None = None  # (step, cost total) at the last agreed check
        self.cost = float("nan")

    def reduce(self, gradient: Any) -> Any:
        return self.gradient(gradient)

    def start(self, loop: RunView) -> None:
        self.last = (loop.carry.n, loop.carry.total)
        self._agree(loop, OK)

    def _agree(self, loop: RunView, code: int, cause: BaseException | None = None, at: int | None = None) -> None:
        """One ``check_group`` at the loop's step (or, for a failed rank, with its last agreed state at step
        ``at``); on ``GroupError`` the last agreed state and history go with it."""
        carry, (good, noise) = loop.carry, loop.good
        assert self.last is not None
        state, n, cost, steps = (
            (carry.state, carry.n, carry.total - self.last[1], carry.n - self.last[0])
            if at is None
            else (good.state, at, 0.0, 0)
        )
        try:
            status = check_group(state, n, code=code, cost=cost, cost_steps=steps, last_good=good.state)
        except GroupError as stop:
            stop.state, stop.history = good.state, loop.history(good, noise)
            raise stop from cause
        self.last, self.cost = (carry.n, carry.total), status.cost

    def checked(self, loop: RunView, ok: torch.Tensor) -> torch.Tensor:
        if ok.ndim:  # members: a member runs on where it runs on every rank
            ok = _group_all(ok)
        passed = bool(ok.all()) if ok.ndim == 0 else bool(ok.any())
        cause = None if passed else loop.diverged(loop.carry.n)
        self._agree(loop, OK if passed else DIVERGED, cause)
        return ok

    def record(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        cost, average = group_mean((values["cost"], values["average_cost"]), self.weight, what="the cost history")
        return {**values, "cost": cost, "average_cost": average}

    def at(self, loop: RunView) -> None:
        carry = loop.carry
        norm = float(squared_norm(carry.info.gradient).sqrt()) if carry.info is not None else float("nan")
        print_main(
            f"step {carry.n:>8d}  t {float(carry.state.t.amax()):10.3f}  cost {self.cost:.5f}  "
            f"|G| {norm:.3e}  ranks {world_size()}"
        )

    def failed(self, loop: RunView, error: BaseException) -> None:
        if isinstance(error, GroupError):
            return
        code = (
            INTERRUPTED
            if isinstance(error, KeyboardInterrupt)
            else DIVERGED
            if isinstance(error, DivergenceError)
            else FAILED
        )
        stop = loop.next_event(loop.carry.n, record_hooks_only=True)
        zeros = tree_map(torch.zeros_like, loop.carry.state.theta)
        try:
            while self.gradient.calls < stop:  # the gradient collectives the other ranks make until their check
                self.gradient(zeros)
            self._agree(loop, code, error, at=stop)  # the others check at this step: report there
        except GroupError as stopped:
            if code == FAILED:
                raise error from None  # the rank that raised shows its own error; the others the GroupError
            raise stopped


def _group_all(flags: torch.Tensor) -> torch.Tensor:
    """Per-member flags true on every rank (one all_reduce of the counts)."""
    if not is_initialized():
        return flags
    counts = flags.to(torch.float64).cpu()
    all_reduce(counts, "the members' checks")
    return (counts == world_size()).to(flags.device)


__all__ = ["GroupHook"]
