"""The run: the loop over a problem's pure steps, its options and hooks, and its files.

- ``run``: ``run`` and ``setup`` (a ``Loop`` one can advance), ``Run``; ``choose_route`` (how a run starts);
- ``options``: ``SaveAt`` (what to record, how often) and ``Checks`` (divergence checks);
- ``hooks``: ``Progress``, ``Checkpointing``, ``Callback``, ``GradientHook`` and the ``Hook`` base class;
- ``loop``: the ``Loop`` itself; ``block``: a block of steps, eager or compiled (one function);
- ``checkpoint``: ``save``, ``load``, ``check_compatible`` (atomic, weights_only, digest-checked files);
- ``evaluate``: ``stationary_cost`` (J with theta frozen, for reports).
"""

from .checkpoint import Checkpoint, check_compatible, load, save
from .evaluate import CostEstimate, stationary_cost
from .hooks import Callback, Checkpointing, GradientHook, Hook, Progress
from .loop import Loop
from .options import Checks, SaveAt
from .runner import Run, choose_route, execute, run, setup

__all__ = [
    "Callback",
    "Checkpoint",
    "Checkpointing",
    "Checks",
    "CostEstimate",
    "GradientHook",
    "Hook",
    "Loop",
    "Progress",
    "Run",
    "SaveAt",
    "check_compatible",
    "choose_route",
    "execute",
    "load",
    "run",
    "save",
    "setup",
    "stationary_cost",
]
