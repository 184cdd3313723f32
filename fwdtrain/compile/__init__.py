"""Compiled steps: traced once, compiled by AOTInductor in another process, kept on disk (``torch.compile`` as
the fallback).

- ``options``: ``Compile``, what ``run(compile=...)`` takes;
- ``kernels``: ``block_kernel`` (a block of steps in one call) and ``function_kernel``, cached per process;
- ``graphs``: tracing a pure step into a flat ATen graph, and the block loop built around it;
- ``cache``: ``cache_dir()``, the kernels' keys and their cap (``touch`` on load, ``prune`` after a write), the
  process's kernels and its compile events (``counts``);
- ``worker``: the compile's own process (``python -m fwdtrain.compile.worker``), which a run steps eagerly beside.
"""

from .cache import cache_dir, counts, forget_kernels
from .kernels import block_kernel, function_kernel
from .options import Compile

__all__ = ["Compile", "block_kernel", "cache_dir", "counts", "forget_kernels", "function_kernel"]
