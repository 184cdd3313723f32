"""``fwdtrain.core.kernel`` is ``fwdtrain.core.step`` since 0.5 ("kernel" names compiled artefacts only); this
alias warns and goes in 0.6."""

import warnings

from .step import *  # noqa: F403
from .step import __all__ as __all__

warnings.warn(
    "fwdtrain.core.kernel is fwdtrain.core.step since fwdtrain 0.5; import from fwdtrain.core.step",
    DeprecationWarning,
    stacklevel=2,
)
