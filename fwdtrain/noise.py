"""``fwdtrain.noise``: Brownian noise sources, the names of ``fwdtrain.core.noise`` at their public path."""

from .core.noise import *  # noqa: F403  # every public name of the layer's module, once
from .core.noise import __all__ as __all__
