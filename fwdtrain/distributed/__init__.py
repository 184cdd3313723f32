"""Particles across processes with torch.distributed (gloo on CPU, nccl on CUDA), launched by torchrun.

Rank r of R simulates its own N_r particles with its own noise stream; every rank holds
the same theta, and the gradient used in the update is the particle-weighted mean over
the whole group,

    G_n = sum_r N_r Gbar_n^r / sum_r N_r,     Gbar_n^r = (1/N_r) sum_i D c(X_n^{r,i}),

all-reduced every step (or every k steps). So R ranks with N particles each are the
single-process algorithm with R N particles, driven by the ranks' noise streams
concatenated along the particle axis (rank 0's particles first).

Modules (one job each):
  group       join the group torchrun describes (with a timeout on every collective); rank, world_size,
              is_main, print_main; broadcast, group_mean, gather_to_main
  seeds       rank_seed: rank r's noise is ``fwdtrain.BrownianNoise(..., seed=rank_seed(seed, r))``
  reduce      gradient_mean: the ``reduce=`` hook of ``fwdtrain.run``
  check       check_group: one collective that stops every rank if any rank failed, diverged or
              holds a different theta
  hooks       GroupHook: the gradient mean and the group checks as a hook of ``fwdtrain.run``
  training    distributed_run: ``fwdtrain.run`` with a GroupHook (a convenience; no loop of its own)
  checkpoint  save_group / load_group: one file with every rank's particles
  processes   launch: run a function in R local processes (tests, benchmarks)

Under ``torchrun --nproc-per-node 2 train.py``, with train.py::

    from fwdtrain import distributed as D
    D.init_process_group(timeout=60)                  # a no-op outside torchrun
    state = ft.init(sde, D.broadcast(theta), x0, particles=N)
    state, history = D.distributed_run(sde, state, steps, dt, lr, seed=0, verbose=True)  # or:
    state, history = ft.run(sde, state, steps, dt, lr, D.rank_seed(0), hooks=(D.GroupHook(N),))
    if D.is_main():
        ...                                           # print, save, plot once
    D.destroy_process_group()

``python -m fwdtrain`` does all of this by itself under torchrun.
"""

from .check import GroupStatus, check_group
from .checkpoint import load_group, save_group
from .group import (
    DEFAULT_TIMEOUT,
    GroupError,
    backend_for,
    broadcast,
    destroy_process_group,
    gather_to_main,
    group_mean,
    init_process_group,
    is_initialized,
    is_main,
    local_device,
    lost,
    print_main,
    rank,
    require_group,
    world_size,
)
from .hooks import GroupHook
from .processes import LaunchError, launch
from .reduce import GradientMean, gradient_mean
from .seeds import rank_generator, rank_seed
from .training import distributed_run

__all__ = [
    "DEFAULT_TIMEOUT",
    "GradientMean",
    "GroupError",
    "GroupHook",
    "GroupStatus",
    "LaunchError",
    "backend_for",
    "broadcast",
    "check_group",
    "destroy_process_group",
    "distributed_run",
    "gather_to_main",
    "gradient_mean",
    "group_mean",
    "init_process_group",
    "is_initialized",
    "is_main",
    "launch",
    "load_group",
    "local_device",
    "lost",
    "print_main",
    "rank",
    "rank_generator",
    "rank_seed",
    "require_group",
    "save_group",
    "world_size",
]
