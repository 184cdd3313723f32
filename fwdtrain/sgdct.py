"""``fwdtrain.sgdct``: SGDCT, drift estimation from an observed path.

The names of ``fwdtrain.problems.sgdct`` at their public path.
"""

from .problems.sgdct import *  # noqa: F403  # every public name of the layer's module, once
from .problems.sgdct import __all__ as __all__
