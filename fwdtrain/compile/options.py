"""``Compile``: whether and how a run's steps are compiled (``run(..., compile=Compile(...))``)."""

from __future__ import annotations

import os
import warnings
from typing import Any, Literal, NamedTuple, get_args

from .. import _compat
from ..core import _checks

AFTER_ENV = "FWDTRAIN_COMPILE_AFTER"  # the default of Compile(after=...)
DEFAULT_AFTER = 1000

Compiler = Literal["aot", "dynamo"]
COMPILERS: tuple[str, ...] = get_args(Compiler)


class _Fields(NamedTuple):
    enabled: bool | Literal["auto"] = "auto"
    compiler: Compiler = "aot"
    backend: str = "inductor"
    chunk: int = 1024
    verify: bool = True
    unroll: int = 1
    flush_subnormals: bool = True
    after: int | None = None
    switch: bool = True


class Compile(_Fields):
    """How the steps of a run are computed.

    Attributes:
        enabled: ``"auto"`` (default): tiered. A run steps eagerly from its first step; one that reaches step
            ``after`` (counted from the start of training) loads its kernel before its first step when it is on
            disk, else compiles it in another process while it steps eagerly, and switches to it at the first
            block after it is ready (``History.compiled_from``: the step it switched at). ``True``: the kernel
            before the first step (loaded, else compiled first). ``False``: every step eager.
        after: the step a run must reach to compile (None: ``$FWDTRAIN_COMPILE_AFTER``, else 1000; tests and
            documentation examples stay below it and never compile).
        switch: False: a run keeps the route of its first step to its end (launches on the same route are
            bitwise equal), its background compile left for the next launch.
        compiler: ``"aot"`` (default): the step traced once into a flat graph and compiled by AOTInductor
            into a package kept in ``fwdtrain.compile.cache_dir()``, loaded by later runs and processes
            without compiling; every run of steps between two events is one call of a compiled loop.
            ``"dynamo"``: ``torch.compile`` of each step (the fallback, also taken with a one-line
            warning where the ``"aot"`` compiler fails).
        backend: the ``torch.compile`` backend of the ``"dynamo"`` compiler (``"eager"`` traces only: quick tests).
        chunk: steps of noise drawn at once: the most steps one compiled call takes (results do not depend on it).
        verify: check a kernel loaded from disk against the eager step on its first call (one eager step).
        unroll: steps per iteration of the compiled loop (the ``"aot"`` compiler): K > 1 fuses K steps into one
            kernel body, which cuts the per-step overhead of small problems (the seed problem on a 2-core CPU
            at K = 4: 12.0 to 8.5 us per step at N = 1, 16.4 to 12.1 at N = 100) for a compile about twice
            as long. Results do not
            depend on it beyond rounding.
        flush_subnormals: the loop's steps run with subnormal floats (|v| < 1.2e-38 in float32) read and
            written as zero, eager or compiled (the CPU's flush-to-zero mode, as XLA's CPU runtime runs; set
            for the calling thread while ``run`` steps, and restored after). Sensitivities that decay
            towards zero otherwise reach subnormals, which the CPU computes up to 100x slower: a continued
            run of the seed problem at N = 100 slowed from 14 to 88 us per step over 40 segments of 2,048
            steps. False: IEEE subnormals kept (results then differ from the default only below 1.2e-38).
    """

    __slots__ = ()

    def __new__(cls, *args: Any, route: Compiler | None = None, **kwargs: Any) -> Compile:
        if route is not None:  # the name of ``compiler`` until 0.5
            warnings.warn("Compile(route=...) is Compile(compiler=...) since 0.6", DeprecationWarning, stacklevel=2)
            kwargs["compiler"] = route
        return super().__new__(cls, *args, **kwargs)

    @property
    def route(self) -> Compiler:
        """``compiler``, by its name until 0.5 ("route" is now the eager-or-compiled choice of a run)."""
        warnings.warn("Compile.route is Compile.compiler since 0.6", DeprecationWarning, stacklevel=2)
        return self.compiler

    def derivative_mode(self, mode: str = "auto") -> str:
        """The derivative mode a run with these options plans with: ``mode``, except that a run that may compile
        with the ``"dynamo"`` compiler plans in reverse mode (torch's dynamo cannot trace ``jvp`` under ``vmap``;
        ``_compat.DYNAMO_TRACES_FORWARD_MODE``). The one place where compiling changes the derivative mode."""
        if self.enabled is False or self.compiler == "aot" or _compat.DYNAMO_TRACES_FORWARD_MODE:
            return mode
        return "reverse"


def as_compile(value: Any) -> Compile:
    """A ``Compile`` from what a user passes: a ``Compile``, True, False or "auto" (0.2's backend names too)."""
    if isinstance(value, Compile):
        options = value
    elif value is True or value is False or value == "auto":
        options = Compile(enabled=value)
    elif isinstance(value, str):  # a torch.compile backend name, as 0.2's run(compile="eager") took it
        options = Compile(enabled=True, compiler="dynamo", backend=value)
    else:
        raise TypeError(f'compile must be True, False, "auto" or a fwdtrain.Compile(...), got {value!r}')
    if not (options.enabled is True or options.enabled is False or options.enabled == "auto"):
        raise ValueError(f'Compile(enabled=...) must be True, False or "auto", got {options.enabled!r}')
    if options.compiler not in COMPILERS:
        raise ValueError(f"Compile(compiler=...) must be one of {COMPILERS}, got {options.compiler!r}")
    _checks.check_count(options.chunk, "Compile(chunk=...)")
    _checks.check_count(options.unroll, "Compile(unroll=...)")
    if options.after is None:
        text = os.environ.get(AFTER_ENV, "").strip()
        try:
            options = options._replace(after=int(text) if text else DEFAULT_AFTER)
        except ValueError:
            raise ValueError(f"{AFTER_ENV}={text!r} must be a whole number of steps") from None
    _checks.check_count(options.after, "Compile(after=...)", minimum=0)
    if not isinstance(options.switch, bool):
        raise TypeError(f"Compile(switch=...) must be True or False, got {options.switch!r}")
    if not isinstance(options.flush_subnormals, bool):
        raise TypeError(f"Compile(flush_subnormals=...) must be True or False, got {options.flush_subnormals!r}")
    if options.compiler == "dynamo" and isinstance(options.backend, str):
        import torch._dynamo  # only for this compiler: it takes a second to import

        known = torch._dynamo.list_backends(exclude_tags=())
        if options.backend not in known:
            raise ValueError(
                f'unknown torch.compile backend {options.backend!r}: compile takes True, False, "auto", '
                f"a fwdtrain.Compile(...) or a torch.compile backend name, one of {sorted(known)}"
            )
    return options


__all__ = ["AFTER_ENV", "COMPILERS", "DEFAULT_AFTER", "Compile", "Compiler", "as_compile"]
