"""``fwdtrain.schedules``: learning-rate schedules, the names of ``fwdtrain.core.schedules`` at their public path."""

from .core.schedules import *  # noqa: F403  # every public name of the layer's module, once
from .core.schedules import __all__ as __all__
