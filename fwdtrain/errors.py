"""``fwdtrain.errors``: the errors of a run and its checkpoints.

The names of ``fwdtrain.core.errors`` at their public path.
"""

from .core.errors import *  # noqa: F403  # every public name of the layer's module, once
from .core.errors import __all__ as __all__
