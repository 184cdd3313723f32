"""``fwdtrain.calibration``: calibration of a stationary law.

The names of ``fwdtrain.problems.calibration`` at their public path.
"""

from .problems.calibration import *  # noqa: F403  # every public name of the layer's module, once
from .problems.calibration import __all__ as __all__
