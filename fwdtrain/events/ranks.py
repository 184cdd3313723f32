"""Realizations split across processes: a batch fit's sums over the ranks of a torch.distributed group.

log L, its gradient and its Hessian are sums over realizations, so R ranks each holding some realizations (days)
fit the model of all of them when every rank sums these over the group before each Newton decision: every rank
then takes the same steps and ends with the same estimate as one process holding every realization.
``fit(model, my_days, reduce=group_sum)`` under torchrun, after ``torch.distributed.init_process_group``
(``fwdtrain.distributed.init_process_group`` sets one up with timeouts).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def group_sum(tensor: torch.Tensor) -> torch.Tensor:
    """sum_r tensor_r over the default process group (a new tensor; ``tensor`` itself without a group of 2 or
    more). Every rank must call it with tensors of the same shape, in the same order."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return tensor
    total = tensor.detach().clone()
    dist.all_reduce(total)
    return total


__all__ = ["group_sum"]
