"""``fwdtrain.noise``: Brownian noise sources, the names of ``fwdtrain.core.noise`` at their public path."""

from .core.noise import (
    BLOCK,
    BrownianNoise,
    FunctionNoise,
    Noise,
    TensorNoise,
    as_noise,
)

__all__ = [
    "BLOCK",
    "BrownianNoise",
    "FunctionNoise",
    "Noise",
    "TensorNoise",
    "as_noise",
]
