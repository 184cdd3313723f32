"""``distributed_run``: ``fwdtrain.run`` on every rank with a ``GroupHook`` (a thin convenience, no loop of its own).

Rank r steps the ordinary loop on its own particles with its own noise (``BrownianNoise`` seeded with
``rank_seed(seed, r)``); the hook averages the gradient over the group every step and agrees at every
check. A rank with bad input joins the first agreement as failed, so every rank stops there.
"""

from __future__ import annotations

from typing import Any

from ..driver.hooks import Checkpointing, check_hooks
from ..driver.options import check_checks
from ..driver.runner import Run, execute, setup, split_start
from .check import FAILED, check_group
from .checkpoint import save_group
from .group import GroupError, require_group
from .hooks import GroupHook
from .seeds import rank_seed


def _group_checkpoints(hooks: tuple, every: int) -> tuple:
    """The hooks with every ``Checkpointing`` writing one file for the group (``save_group``, a collective)."""
    out = []
    for hook in hooks:
        if isinstance(hook, Checkpointing):
            if hook.every is not None and hook.every % every:
                raise ValueError(
                    f"Checkpointing(every={hook.every}) must be a multiple of every={every} (a gradient "
                    f"window cannot be saved half-way)"
                )
            hook = Checkpointing(hook.path, hook.every, hook.metadata, save=save_group)
        out.append(hook)
    return tuple(out)


def distributed_run(
    problem: Any,
    start: Any,
    steps: int,
    dt: float,
    lr: Any,
    seed: int = 0,
    *,
    every: int = 1,
    verbose: bool = False,
    **options: Any,
) -> Run:
    """``fwdtrain.run`` for this rank's particles with the group's theta; every rank calls it alike.

    Each rank passes its own ``start`` (its N_r particles, the same theta) and the same other arguments. Rank
    r's noise is ``BrownianNoise((N_r, m), dt, seed=rank_seed(seed, r))`` and the gradient is the group's
    particle-weighted mean (``every`` > 1: all-reduced every k steps, theta held over each window), so R ranks
    equal one process with sum_r N_r particles driven by the ranks' noise concatenated along the particle axis.
    ``options`` are ``run``'s (``solver``, ``optimizer``, ``save``, ``checks``, ``compile``, ``hooks``); a
    ``Checkpointing`` hook writes one file for the group (``save_group``). ``verbose``: a line on rank 0 at every
    check. Works without a process group (one process).

    Returns this rank's ``Run``: its final state and the group's history (costs are means over every rank's
    particles; the carry is this rank's). Raises ``GroupError`` on every rank when any rank fails, diverges
    or holds another theta, carrying this rank's last agreed state and history. Ctrl-C on any rank returns
    every rank's last agreed state with ``history.interrupted`` True (written by a ``Checkpointing`` hook).
    """
    require_group()
    checks = check_checks(options.get("checks"))
    hooks = _group_checkpoints(check_hooks(options.pop("hooks", ())), every)
    state, history = split_start(start)
    first = history.steps if history is not None else 0
    try:
        group = GroupHook(state.particles, every=every, start=first, verbose=verbose, report_every=checks.every)
        loop = setup(problem, start, steps, dt, lr, rank_seed(seed), hooks=(group, *hooks), **options)
    except GroupError:
        raise
    except Exception as error:  # bad input on this rank: it joins the first agreement as failed
        try:
            check_group(state, first, code=FAILED)
        except Exception:
            pass
        raise error
    try:
        return execute(loop)
    except GroupError as stop:
        if stop.reason != "interrupted":
            raise
        good, noise = loop.good
        history = loop.history(good, noise, interrupted=True)
        for hook in hooks:
            if isinstance(hook, Checkpointing):
                hook.write(good.state, history)
        return Run(good.state, history)


__all__ = ["distributed_run"]
