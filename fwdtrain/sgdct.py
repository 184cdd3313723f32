"""``fwdtrain.sgdct``: SGDCT, drift estimation from an observed path.

The names of ``fwdtrain.problems.sgdct`` at their public path.
"""

from .problems.sgdct import *  # noqa: F403  (the public path of every name the module exports)
from .problems.sgdct import __all__ as __all__
