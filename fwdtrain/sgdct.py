"""``fwdtrain.sgdct``: SGDCT, drift estimation from an observed path.

The names of ``fwdtrain.problems.sgdct`` at their public path.
"""

from .problems.sgdct import (
    DriftEstimation,
    SGDCTInfo,
    SGDCTState,
    as_state,
    check_inputs,
    init,
    step,
    step_with_info,
)

__all__ = [
    "DriftEstimation",
    "SGDCTInfo",
    "SGDCTState",
    "as_state",
    "check_inputs",
    "init",
    "step",
    "step_with_info",
]
