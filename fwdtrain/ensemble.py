"""``fwdtrain.ensemble``: ensembles of independent runs.

The names of ``fwdtrain.problems.ensemble`` at their public path.
"""

from .problems.ensemble import (
    Ensemble,
    EnsembleNoise,
    PerMember,
    init,
    member,
    member_history,
    rates,
    size,
    stack,
    unstack,
)

__all__ = [
    "Ensemble",
    "EnsembleNoise",
    "PerMember",
    "init",
    "member",
    "member_history",
    "rates",
    "size",
    "stack",
    "unstack",
]
