"""``fwdtrain.calibration``: calibration of a stationary law.

The names of ``fwdtrain.problems.calibration`` at their public path.
"""

from .problems.calibration import *  # noqa: F403  (the public path of every name the module exports)
from .problems.calibration import __all__ as __all__
