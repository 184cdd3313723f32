"""``fwdtrain.ensemble``: ensembles of independent runs.

The names of ``fwdtrain.problems.ensemble`` at their public path.
"""

from .problems.ensemble import *  # noqa: F403  # every public name of the layer's module, once
from .problems.ensemble import __all__ as __all__
