"""The compiled step under the user's ``vmap``: one batched kernel over the vmapped runs.

``vmap(lambda s, w: fwdtrain.step(sde, s, w, dt, lr, compile=True))(states, dws)`` reaches the step with
tensors that carry a hidden run axis. Here that axis is taken out of every input (moved to the front, or
broadcast for an input that is shared by the runs), the runs' step ``vmap(advance)`` runs as one compiled
kernel on the stacked runs, and its outputs are handed back to ``vmap`` with the run axis in front. Each
run is checked as ``step`` checks one (the first run, once per key; the learning rates of all runs on every
call). Nested transforms (``vmap`` inside ``grad``, two ``vmap``s) run the eager step instead.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Protocol

import torch
from torch.func import vmap

from .. import _compat
from ..compile.kernels import function_kernel
from ..compile.options import Compile
from ..core import _checks
from ..core._tree import flatten, tree_map, unflatten
from ..core.state import State
from ..core.step import LearningRate, StepInfo, learning_rate
from .cost import CostForm


class PreparedStep(Protocol):
    """What the batched call needs of a prepared step (``prepared.JitStep``)."""

    problem: CostForm
    options: Compile
    batched_kernels: dict[Hashable, Any]

    def prepare(self, state: State, dw: torch.Tensor, dt: Any, lr: LearningRate) -> Any: ...

    def eager(self, state: State, dw: torch.Tensor, dt: Any, lr: LearningRate) -> tuple[State, StepInfo]: ...


def _runs_first(tensor: torch.Tensor, dim: int | None, runs: int) -> torch.Tensor:
    """The tensor of every run with the run axis in front (an input shared by the runs broadcast), contiguous."""
    if dim is None:
        return tensor.unsqueeze(0).expand(runs, *tensor.shape).contiguous()
    return tensor.movedim(dim, 0).contiguous()


def batched_call(jit: PreparedStep, state: State, dw: Any, dt: Any, lr: LearningRate) -> tuple[State, StepInfo]:
    """``jit.with_info`` of every run of the innermost ``vmap`` in one compiled kernel (see the module docstring)."""
    level = _compat.vmap_level()
    alpha = learning_rate(lr, state.t)
    if not isinstance(alpha, torch.Tensor):
        alpha = torch.as_tensor(alpha, dtype=torch.float64)
    leaves, spec = flatten((state, dw, alpha))
    if not all(isinstance(leaf, torch.Tensor) for leaf in leaves):
        return _eager(jit, state, dw, dt, lr)
    unwrapped = [_compat.unwrap_batched(leaf, level) for leaf in leaves]
    runs = next((tensor.shape[dim] for tensor, dim in unwrapped if dim is not None), None)
    if runs is None or any(_compat.is_wrapped(tensor) for tensor, _ in unwrapped) or _compat.tracing():
        return _eager(jit, state, dw, dt, lr)
    stacked = [_runs_first(tensor, dim, runs) for tensor, dim in unwrapped]
    one_run = [tensor[0] for tensor in stacked]
    state_1, dw_1, _ = unflatten(spec, one_run)
    key = (spec, float(dt), runs, tuple((t.shape, t.dtype, t.device) for t in stacked))
    with _compat.outside_transforms():  # plain tensors from here: the kernel is built and called outside vmap
        entry = jit.batched_kernels.get(key)
        if entry is None:
            plan = jit.prepare(state_1, dw_1, dt, lr)
            entry = jit.batched_kernels[key] = _batched_kernel(jit, plan, float(dt), unflatten(spec, stacked))
        alphas = stacked[-1]
        good = _checks.good_rates(alphas)
        if not bool(good.all()):
            bad = int((~good).nonzero()[0])
            _checks.check_alpha(alphas[bad], state_1.t, lr)  # raises with the message of that run
        out = entry(*unflatten(spec, stacked))
    return tree_map(lambda tensor: _compat.add_batch_dim(tensor, 0, level), out)


def _eager(jit: PreparedStep, state: State, dw: Any, dt: Any, lr: LearningRate) -> tuple[State, StepInfo]:
    return jit.eager(state, dw, dt, lr)


def _batched_kernel(jit: PreparedStep, plan: Hashable, dt: float, example: tuple) -> Any:
    """The compiled ``vmap`` over runs of the one-run step (alpha per run, float64 like the clock)."""
    problem = jit.problem
    states, dws, alphas = example
    alphas = alphas.to(torch.float64)

    def runs_step(s: State, w: torch.Tensor, a: torch.Tensor) -> tuple[State, StepInfo]:
        return vmap(lambda s1, w1, a1: problem.advance(s1, w1, dt, a1, plan))(s, w, a)

    kernel = function_kernel(
        runs_step,
        (states, dws, alphas),
        key=(problem, plan, dt, "advance over runs"),
        options=jit.options,
        what="the step over vmapped runs",
    )

    def call(s: State, w: torch.Tensor, a: torch.Tensor) -> tuple[State, StepInfo]:
        return kernel(s, w, a.to(torch.float64))

    return call


__all__ = ["PreparedStep", "batched_call"]
