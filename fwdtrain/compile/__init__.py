"""Compiled steps: traced once, compiled by AOTInductor, kept on disk (``torch.compile`` as the fallback).

- ``options``: ``Compile``, what ``run(compile=...)`` takes;
- ``kernels``: ``loop_kernel`` (a compiled loop of steps) and ``function_kernel``, cached per process; ``counts``;
- ``graphs``: tracing a pure step into a flat ATen graph, and the loop built around it;
- ``cache``: ``cache_dir()``, the kernels' keys and their cap (``touch`` on load, ``prune`` after a write);
- ``route``: what ``compile="auto"`` chooses, by a stated rule of the counted step, the steps and the cache.
"""

from .cache import cache_dir
from .kernels import clear, counts, function_kernel, loop_kernel
from .options import Compile

__all__ = ["Compile", "cache_dir", "clear", "counts", "function_kernel", "loop_kernel"]
