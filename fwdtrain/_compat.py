"""Where fwdtrain meets the parts of torch that change between releases: the one place for them.

Every check of "what is torch doing right now" and every work-around of a torch limitation
lives here, so the numerical code reads like its equations and a torch upgrade touches one file.

- ``tracing()``: whether a graph is being recorded (``torch.compile``'s dynamo, or
  ``make_fx`` in ``fwdtrain.compile``), so that eager-only shortcuts stay out of graphs.
- ``is_wrapped(tensor)`` / ``transform_of(tensor)``: whether a tensor belongs to a
  ``torch.func`` transform (its value cannot be read).
- ``DYNAMO_TRACES_FORWARD_MODE``: torch 2.13's dynamo cannot trace ``jvp`` under ``vmap``
  (fake-tensor propagation fails), so its fallback route compiles the reverse-mode step.
- Inductor's folders (``use_cache_folders``): its caches, its precompiled headers (which torch keeps
  in its default temporary folder whatever the cache folder) and the instruction-set probe's result
  go to fwdtrain's cache folder; a known probe result skips the probe (3-4 s of compiling test
  programs).
- ``pullback(y, inputs, seed, retain)``: one reverse pass of ``torch.autograd`` straight into its engine,
  skipping ``torch.autograd.grad``'s argument normalising and shape checks (11 of its 27 us on a tiny graph,
  paid three times per eager step at one particle); ``torch.autograd.grad`` where the engine's handle is gone.
- ``PRELOAD_MODULES``: what a forkserver preloads so that its children start warm (torch.func imports
  dynamo, a private module).
- ``shorter_first_compile()``: inductor's options for a machine's first compile: no precompiled headers (building
  them costs more than they save on one compile; ``benchmarks/bench_compile_stages.py``).
- AOTInductor (``aot_compile``, ``aot_load``): ``torch.export`` of a traced graph, compiled into a
  package, and loaded with the C++ loader (``torch._C._aoti.AOTIModelPackageLoader``: 3 ms, against
  2.4 s for ``torch._inductor.aoti_load_package``, which imports inductor; and ~50 us less per call).
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import get_proxy_mode  # a plain module, which ``import torch`` loads

# dynamo (torch.compile) fails on jvp under vmap in torch <= 2.13; make_fx traces both modes.
DYNAMO_TRACES_FORWARD_MODE = False


PRELOAD_MODULES = ("torch", "torch._dynamo", "fwdtrain")  # a forkserver's preload: torch.func imports dynamo


def forward_mode_traceable() -> bool:
    """False while dynamo records a graph (it cannot trace forward mode there): use reverse mode instead."""
    return DYNAMO_TRACES_FORWARD_MODE or not torch.compiler.is_compiling()


def in_dtype(tangents: Any, dtype: torch.dtype) -> Any:
    """``tangents`` (a pytree) cast to ``dtype``. torch <= 2.13's forward mode promotes the tangent of
    ``0.1 * y`` for a 0-d float32 y to float64 (the Python scalar becomes a 0-d float64 tensor in the
    derivative formula), so a forward-mode derivative can come out in another dtype than its value."""
    import optree

    return optree.tree_map(lambda t: t if t.dtype == dtype else t.to(dtype), tangents)


def tracing() -> bool:
    """True while torch.compile (dynamo) or ``make_fx`` records a graph of the code being run."""
    if torch.compiler.is_compiling():
        return True
    return get_proxy_mode() is not None


_ENGINE = getattr(getattr(torch.autograd, "Variable", None), "_execution_engine", None)


def pullback(
    y: torch.Tensor, inputs: list[torch.Tensor], seed: torch.Tensor, retain: bool
) -> tuple[torch.Tensor | None, ...]:
    """``torch.autograd.grad(y, inputs, seed, retain_graph=retain, allow_unused=True)`` for a y that requires
    grad, a seed of y's shape and dtype and leaf inputs (the caller guarantees all three)."""
    if _ENGINE is None or torch.overrides.has_torch_function((y, *inputs)):
        return torch.autograd.grad(y, inputs, seed, retain_graph=retain, allow_unused=True)
    return _ENGINE.run_backward((y,), (seed,), retain, False, tuple(inputs), True, False)


def flushing_subnormals() -> bool:
    """True when this thread reads and writes subnormal floats as zero: a subnormal float32 times one is 0."""
    return bool((torch.full((1,), 1e-40, dtype=torch.float32) * 1.0)[0] == 0)


@contextlib.contextmanager
def subnormals_flushed(enabled: bool = True) -> Iterator[None]:
    """Subnormal floats (|v| < 1.2e-38 in float32) read and written as zero on this thread while the block runs
    (the CPU's flush-to-zero and denormals-are-zero modes, ``torch.set_flush_denormal``); the mode found before
    is restored after. A no-op when ``enabled`` is False, when the mode is on already, or where the CPU has none.
    Threads other than the caller (a kernel's OpenMP workers) keep their own mode."""
    if not enabled or flushing_subnormals() or not torch.set_flush_denormal(True):
        yield
        return
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def is_wrapped(value: Any) -> bool:
    """True for a tensor wrapped by a ``torch.func`` transform (vmap's BatchedTensor, grad's wrapper)."""
    return isinstance(value, torch.Tensor) and torch._C._functorch.is_functorch_wrapped_tensor(value)


def transform_of(value: Any) -> str | None:
    """The kind of ``torch.func`` transform wrapping ``value``, for error messages; None if none."""
    if not isinstance(value, torch.Tensor) or torch.compiler.is_compiling():
        return None
    functorch = torch._C._functorch
    if functorch.is_batchedtensor(value):
        return "vmap"
    if functorch.is_functorch_wrapped_tensor(value):
        return "grad/jacrev/jacfwd/vjp/jvp"
    return None


def primal(value: torch.Tensor) -> torch.Tensor:
    """The plain value under ``torch.func`` wrappers (grad's and jvp's unwrapped, vmap's first entry: the caller
    checks that vmap batches no primal it reads), detached: for work that only needs the numbers, such as the
    start of a Newton solve whose last steps are then differentiated."""
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(value):
        if functorch.is_batchedtensor(value):
            inner, dim = functorch._unwrap_batched(value, functorch.maybe_get_level(value))
            value = inner if dim is None else inner.select(dim, 0)
        else:
            value = functorch.get_unwrapped(value)
    with outside_transforms():  # an op under an active transform would wrap its result again
        return value.detach()


def transforms_active() -> bool:
    """True inside any ``torch.func`` transform (vmap, grad, jacrev, jacfwd, vjp, jvp): one look at functorch's
    interpreter stack, a fraction of a microsecond (no tensor inspected)."""
    return torch._C._functorch.peek_interpreter_stack() is not None


def top_transform_is_vmap() -> bool:
    """True when the innermost active ``torch.func`` transform is ``vmap``."""
    top = torch._C._functorch.peek_interpreter_stack()
    return top is not None and top.key() == torch._C._functorch.TransformType.Vmap


def outside_transforms() -> contextlib.AbstractContextManager[Any]:
    """The ``torch.func`` transforms of the caller set aside for a while (functorch's interpreter stack cleared,
    restored on exit): for work on tensors already unwrapped from a ``vmap``, such as compiling a kernel, which
    must not meet the caller's ``vmap`` (inductor's first compile in a process draws random numbers, which
    ``vmap`` refuses in its default randomness mode)."""
    from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack

    return temporarily_clear_interpreter_stack()


def vmap_level() -> int:
    """The level of the innermost ``vmap`` (call only when ``top_transform_is_vmap()``)."""
    return torch._C._functorch.peek_interpreter_stack().level()


def unwrap_batched(value: torch.Tensor, level: int) -> tuple[torch.Tensor, int | None]:
    """A tensor seen by ``vmap`` at ``level`` as (the tensor of every run, its batch dimension or None)."""
    if not torch._C._functorch.is_batchedtensor(value):
        return value, None
    tensor, dim = torch._C._functorch._unwrap_batched(value, level)
    return tensor, dim


def add_batch_dim(tensor: torch.Tensor, dim: int, level: int) -> torch.Tensor:
    """``tensor``'s dimension ``dim`` as the batch dimension of ``vmap`` at ``level`` (the inverse of unwrapping)."""
    return torch._C._functorch._add_batch_dim(tensor, dim, level)


def is_fake(value: Any) -> bool:
    """True for a tensor without data (a fake or meta tensor, as ``make_fx`` traces with)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(value, FakeTensor) or (isinstance(value, torch.Tensor) and value.is_meta)


def use_cache_folders(folder: Path) -> None:
    """Point inductor's caches at ``folder / "inductor"`` unless the user chose one (TORCHINDUCTOR_CACHE_DIR),
    and its precompiled headers beside them. Cheap: imports no part of inductor that is not loaded."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # a small module

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # inductor writes its default into the variable the first time it looks: that is torch's choice, not the user's
    if not chosen or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        chosen = str(folder / "inductor")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = chosen
    import sys

    codecache = sys.modules.get("torch._inductor.codecache")
    if codecache is not None:
        _move_headers(codecache, chosen)


def _move_headers(codecache: Any, folder: str) -> None:
    """Precompiled headers into ``folder`` (torch keeps them under its default temporary folder)."""
    headers = os.path.join(folder, "precompiled_headers")
    if getattr(codecache, "_HEADER_DIR", None) not in (None, headers):
        codecache._HEADER_DIR = headers
        codecache._HEADER_LOCK_DIR = os.path.join(headers, "locks")


def _probe_file() -> Path:
    return Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", ".")) / "isa.json"


def skip_known_probe(machine: str) -> bool:
    """If this machine's instruction-set probe passed before (``record_probe``), tell inductor so; whether it
    had (False: this compile also pays the machine's one-time set-up, the probe and precompiled headers)."""
    import torch._inductor.config as config

    try:
        known = json.loads(_probe_file().read_text())
    except (OSError, ValueError):
        return False
    same = isinstance(known, dict) and known.get("machine") == machine and known.get("torch") == torch.__version__
    if same and known.get("all_supported") is True and config.cpp.vec_isa_ok is None:
        config.cpp.vec_isa_ok = True
    return same


def record_probe(machine: str) -> None:
    """Remember whether every instruction set the CPU supports compiled and loaded (best effort)."""
    from torch._inductor import cpu_vec_isa

    try:
        valid = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]
        cpu = cpu_vec_isa.x86_isa_checker() if hasattr(cpu_vec_isa, "x86_isa_checker") else []
        supported = [
            str(isa) for isa in cpu_vec_isa.supported_vec_isa_list if all(flag in cpu for flag in str(isa).split())
        ]
        _probe_file().parent.mkdir(parents=True, exist_ok=True)
        _probe_file().write_text(
            json.dumps(
                {
                    "machine": machine,
                    "torch": torch.__version__,
                    "valid": valid,
                    "all_supported": bool(valid) and valid == supported,
                }
            )
        )
    except Exception:
        pass


def shorter_first_compile() -> dict[str, Any]:
    """Inductor's options that shorten this compile without changing its code, to merge into the options given to
    ``aot_compile`` after the kernel's key is made (the package is the same either way, so the key must not hold
    them). On a machine where inductor has not compiled yet (no probe record, ``record_probe``): no precompiled
    headers. Building them takes 15.4 of a first compile's 40.2 CPU seconds (and 300 MB), and they save 3.6 to
    4.7 s of the C++ compiler on each compile that has them (``benchmarks/bench_compile_stages.py``): a machine's
    first compile is 30% shorter without, its second builds them for the compiles after, and a machine that
    compiles once never holds them. The kernel is the same: the compiler's flags differ only by the header's
    ``-include``, and the trained results are equal bit for bit."""
    if _probe_file().is_file():
        return {}
    return {"aot_inductor.precompile_headers": False}


def aot_compile(module: torch.nn.Module, example: tuple, path: str, options: dict[str, Any]) -> None:
    """``torch.export`` ``module`` at ``example`` and compile it with AOTInductor into the package ``path``."""
    import torch._inductor
    import torch._inductor.codecache as codecache

    _move_headers(codecache, os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.export's deprecation notes about its own pytree classes
        program = torch.export.export(module, example, strict=False)
        torch._inductor.aoti_compile_and_package(program, package_path=path, inductor_configs=options)


def aot_load(path: str, device: torch.device) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """The package's ``run(list of tensors) -> list of tensors``, through the C++ loader."""
    index = device.index if device.index is not None else (-1 if device.type == "cpu" else 0)
    loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", True, 1, index)
    return loader.run


__all__ = [
    "DYNAMO_TRACES_FORWARD_MODE",
    "add_batch_dim",
    "aot_compile",
    "aot_load",
    "flushing_subnormals",
    "is_fake",
    "is_wrapped",
    "record_probe",
    "shorter_first_compile",
    "skip_known_probe",
    "subnormals_flushed",
    "top_transform_is_vmap",
    "tracing",
    "transform_of",
    "transforms_active",
    "unwrap_batched",
    "use_cache_folders",
    "vmap_level",
]
