"""The compile's own process: ``python -m fwdtrain.compile.worker JOB PACKAGE``.

``JOB`` holds what ``kernels._Package.start`` saved: the traced module (plain ATen graphs and ``graphs.BlockLoop``,
no closure), its example inputs and inductor's options. The worker exports the module (``torch.export``), compiles
it with AOTInductor (on a machine's first compile without precompiled headers: ``_compat.shorter_first_compile``)
into a temporary file and renames it to ``PACKAGE`` (a crash never leaves half a package),
prunes the cache to its cap and removes ``JOB``. A failure's last line on stderr says why (the parent warns with
it). Started detached: a run that ends first leaves the compile to finish for the next launch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch._higher_order_ops.triton_kernel_wrap  # unpickling a traced graph looks it up

from .. import _compat
from . import cache


def load_job(job: Path) -> tuple[torch.nn.Module, list[torch.Tensor], dict]:
    """(module, example inputs, inductor's options) as ``kernels._Package.start`` saved them."""
    module, example, options = torch.load(job, weights_only=False)  # our own file, in the user's cache
    for owner in module.modules():  # a saved graph's constants may share memory: export refuses aliased inputs
        for name, buffer in list(owner.named_buffers(recurse=False)):
            setattr(owner, name, buffer.clone())
    return module, example, options


def compile_job(job: Path, package: Path) -> None:
    """The package of ``job`` written to ``package`` (see the module docstring)."""
    module, example, options = load_job(job)
    _compat.use_cache_folders(cache.cache_dir())
    machine = cache.machine()
    _compat.skip_known_probe(machine)
    options = {**options, **_compat.shorter_first_compile()}  # after the key: the package is the same either way
    temporary = cache.writable_temporary(package)
    try:
        _compat.aot_compile(module, tuple(example), temporary, options)
        os.replace(temporary, package)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    cache.prune(keep=package)
    _compat.record_probe(machine)


def main(argv: list[str]) -> int:
    job, package = Path(argv[0]), Path(argv[1])
    try:
        compile_job(job, package)
        package.with_suffix(".log").unlink(missing_ok=True)  # its messages: read only where it fails
        return 0
    except BaseException as error:
        from .kernels import root_cause

        sys.stderr.write(f"\n{root_cause(error)}\n")
        return 1
    finally:
        job.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
