"""K steps under torch's scan primitive (``torch._higher_order_ops.scan``), for comparison only.

The library fuses K steps by unrolling (fwdtrain.compiled.compile_steps). This is the
alternative the issue asks about: one scan whose body is ``advance``. It traces and
compiles with torch 2.13 (fullgraph, the body's vmap/jacrev included), and its compile
time does not grow with K, but inductor runs the loop from its wrapper, entering the
compiled body once per iteration, so per step it costs about what one compiled call
costs (see the bench_step table).
"""

from __future__ import annotations

import torch
from torch._higher_order_ops.scan import scan

from fwdtrain.compiled import canonical_strides
from fwdtrain.core._tree import tree_map
from fwdtrain.core.kernel import advance, learning_rate
from fwdtrain.core.state import State


def compile_scan(sde, dt, lr, mode, reduce=None, *, backend: str = "inductor"):
    """fused(state, noise (K, N, m)) -> (State, (cost (K,), gradient leaves (K, *s))) via scan."""

    def body(carry, dw):
        state = State(*carry)
        new, info = advance(sde, state, dw, dt, learning_rate(lr, state.t), mode, reduce)
        # the carry must keep its strides exactly (size-1 dimensions included), and scan
        # forbids outputs aliasing inputs or each other: clone the per-step diagnostics
        return tuple(canonical_strides(new)), (info.cost.clone(), tree_map(torch.clone, info.gradient))

    def fused(state: State, noise: torch.Tensor):
        carry, per_step = scan(body, tuple(state), noise)
        return State(*carry), per_step

    return torch.compile(fused, fullgraph=True, dynamic=False, backend=backend)
