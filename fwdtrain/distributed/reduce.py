"""The gradient hook: the group's particle-weighted mean of the particle-mean gradient.

    G_n = sum_r N_r Gbar_n^r / sum_r N_r,     Gbar_n^r = (1/N_r) sum_i D c(X_n^{r,i}),

so R ranks with N particles each take exactly the single-process step with R N particles.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..core import _checks
from ..core._tree import tree_map
from .group import group_mean, is_initialized


class GradientMean:
    """The ``reduce`` hook for ``fwdtrain.run`` / ``step.advance``: the group mean of the gradient.

    every = 1: each step, G = sum_r w_r g_r / sum_r w_r with one all_reduce of p + 1
    numbers (w_r = ``weight``, this rank's particle count; the plain mean over ranks
    when None). Exactly the single-process gradient over all the ranks' particles.

    every = k > 1 (gradient accumulation, theta held over windows of k steps): the
    hook returns 0 for k - 1 steps, so theta stays put, and at the k-th step the
    group mean of the window's summed gradients, so that

        theta_{s+k} = theta_s - alpha(t_{s+k-1}) h sum_{j=s}^{s+k-1} G_j,

    every G_j evaluated at the held theta_s; one all_reduce per k steps. Theta is
    identical on every rank at every step. It is the forward-propagation
    algorithm with theta updated every k h time units instead of every h: for
    constant alpha the same drift to first order in alpha k h, with an O(alpha k h)
    lag (the continuous-time limit k h -> 0 is unchanged); with a schedule the
    window's sum is applied with alpha at the window's last step. Windows are
    aligned to multiples of k of the step count; ``start`` is the step count of the
    first call (a resumed run), which must be a multiple of k.

    Without a process group (a single process) the mean is over this process alone.
    ``calls`` (the step count, from ``start``) and ``collectives`` count calls and all_reduces.
    """

    def __init__(self, every: int = 1, *, weight: float | None = None, start: int = 0) -> None:
        self.every = _checks.check_count(every, "every")
        if weight is not None and (
            isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0
        ):
            raise ValueError(f"weight must be a positive number (this rank's particle count) or None, got {weight!r}")
        start = _checks.check_count(start, "start", minimum=0)
        if start % self.every:
            raise ValueError(
                f"start must be a multiple of every={self.every} (a gradient window cannot be "
                f"resumed half-way), got {start}"
            )
        self.weight = weight
        self.calls = start
        self.collectives = 0
        self._window: Any = None

    def __call__(self, gradient: Any) -> Any:
        self.calls += 1
        if self.every == 1:
            return self._group_mean(gradient)
        self._window = gradient if self._window is None else tree_map(torch.add, self._window, gradient)
        if self.calls % self.every:
            return tree_map(torch.zeros_like, gradient)
        window, self._window = self._window, None
        return self._group_mean(window)

    def _group_mean(self, tree: Any) -> Any:
        self.collectives += int(is_initialized())
        return group_mean(tree, self.weight, what="the gradient")


def gradient_mean(every: int = 1, *, weight: float | None = None, start: int = 0) -> GradientMean:
    """``reduce=`` for ``run`` / ``advance``: the group mean of the gradient (see ``GradientMean``)."""
    return GradientMean(every, weight=weight, start=start)


__all__ = ["GradientMean", "gradient_mean"]
