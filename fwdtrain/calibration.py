"""``fwdtrain.calibration``: calibration of a stationary law.

The names of ``fwdtrain.problems.calibration`` at their public path.
"""

from .problems.calibration import (
    Calibration,
    CalibrationInfo,
    calibration,
    check_inputs,
    init,
    propagate,
    resolve_mode_for,
    step,
    step_with_info,
)

__all__ = [
    "Calibration",
    "CalibrationInfo",
    "calibration",
    "check_inputs",
    "init",
    "propagate",
    "resolve_mode_for",
    "step",
    "step_with_info",
]
