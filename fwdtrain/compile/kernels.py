"""Compiled kernels: a pure function made fast, compiled in another process and kept on disk for the next.

A ``Kernel`` computes what its eager meaning computes (to rounding): ``block_kernel`` a block of checked steps
with its records (``graphs.run_block``), ``function_kernel`` one function (the public ``step``, the halves of
a step around a gradient hook). Building one traces the function once (``graphs.trace``) and keys the graph
(``cache.kernel_key``: its code, its constants, the inputs' layout, the options). Its package is loaded from
disk when there (and checked once against the eager meaning, ``Compile.verify``; set aside and rebuilt if off);
else the traced module is saved to a job file and compiled by AOTInductor in another process
(``python -m fwdtrain.compile.worker``: torch.export and ``aoti_compile_and_package`` there, no closure crosses),
which a run waits for (``compile=True``) or steps eagerly beside (``start``, ``poll``). Where tracing or the
compile fails, ``torch.compile`` of the step, else eager, each fallback said in one warning line.
``cache.counts()`` tells how many traces, compiles and loads the process made (tests count these, never seconds).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any

import optree
import torch

from .. import _compat
from ..core._tree import leaves
from . import cache, graphs
from .cache import counts as counts  # fwdtrain.compile.kernels.counts, as tests and benchmarks call it
from .options import Compile

SINGLE_THREAD_BELOW = 1 << 16  # state numbers under which kernels run on one thread (no fork/join per kernel)
FUSED_CAT_UP_TO = 512  # state numbers up to which a kernel's concatenations are fused (one particle, small model)


def _simplified(traced: graphs.Traced, unfold: bool = False) -> graphs.Traced:
    """The traced graph with its shape chains folded (in place) and, with ``unfold``, its small products
    written out (``graphs.unfold_small_matmuls``); counted."""
    if unfold:
        graphs.unfold_small_matmuls(traced.graph)
    before, after = graphs.simplify(traced.graph)
    cache.count(traces=1, traced_ops=before, simplified_ops=after)
    return traced


def _signature(tree: Any) -> tuple:
    return tuple(
        (tuple(t.shape), t.dtype, str(t.device)) if isinstance(t, torch.Tensor) else (type(t).__name__, t)
        for t in optree.tree_leaves(tree)
    )


def _concrete(tree: Any) -> bool:
    """No leaf belongs to a ``torch.func`` transform or a trace: outside every transform and trace (one look at
    each stack) a leaf cannot be a live transform's; inside one, each leaf is looked at."""
    if _compat.tracing():
        return False
    if not _compat.transforms_active():
        return True
    return not any(_compat.is_wrapped(leaf) for leaf in optree.tree_leaves(tree))


@contextlib.contextmanager
def _quiet_torch_logs() -> Iterator[None]:
    """Silence torch's loggers while compiling: a failed compile otherwise logs internal asserts first."""
    loggers = [logging.getLogger("torch")] + [
        logger
        for name, logger in logging.root.manager.loggerDict.items()
        if name.startswith("torch.") and isinstance(logger, logging.Logger)
    ]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def root_cause(error: BaseException) -> str:
    """ "Type: first line" of the innermost cause (compilers wrap an error in their own)."""
    while (inner := getattr(error, "inner_exception", None) or error.__cause__) is not None:
        error = inner
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:200] if text else ''}"


def _warn(message: str) -> None:
    warnings.warn(f"fwdtrain: {message}", RuntimeWarning, stacklevel=4)


def inductor_options(carry: Any) -> dict[str, Any]:
    """Options baked into a compiled kernel: one thread for small states (a two-thread region waits for a
    partner that is not running on a busy machine: 22-38 ms per step instead of 2 ms at N = 256); for a tiny
    state (one particle of a small model), every concatenation fused into the step's kernel (inductor otherwise
    writes each piece through an alias tensor made per step: 12.2 -> 9.1 us a step at N = 1; from N = 10 on the
    fused concatenation is slower, 2x at N = 100)."""
    numbers = sum(leaf.numel() for leaf in optree.tree_leaves(carry) if isinstance(leaf, torch.Tensor))
    options: dict[str, Any] = {"cpp.threads": 1 if numbers < SINGLE_THREAD_BELOW else torch.get_num_threads()}
    if numbers <= FUSED_CAT_UP_TO:
        options.update({"force_pointwise_cat": True, "max_pointwise_cat_inputs": 1 << 10})
    return options


def _own_code(fn: Callable) -> Callable:
    """``fn`` with a code object of its own, so dynamo's per-code recompile limit counts per kernel."""
    if not isinstance(fn, types.FunctionType):
        return fn
    own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    own.__kwdefaults__, own.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    return own


def _close(computed: Any, expected: Any) -> bool:
    """Every leaf equal to rounding: |a - b| <= 1e-3 (|b| + max |b|) (a stale kernel is far off)."""
    for a, b in zip(optree.tree_leaves(computed), optree.tree_leaves(expected), strict=True):
        if not isinstance(b, torch.Tensor) or not b.is_floating_point():
            if not torch.equal(torch.as_tensor(a), torch.as_tensor(b)):
                return False
            continue
        scale = float(b.detach().abs().max()) if b.numel() else 0.0
        if not bool(((a - b).abs() <= 1e-3 * (b.abs() + scale)).all()):
            return False
    return True


# ------------------------------------------------------------- the AOTInductor compiler

WORKER = ("-m", "fwdtrain.compile.worker")  # the compile's process: ``python -m fwdtrain.compile.worker job package``
QUIET_ENV = "FWDTRAIN_QUIET"  # set (to anything but "" or "0"): no line when a compile starts


def say(line: str) -> None:
    """One line on stderr (a compile starting), unless ``$FWDTRAIN_QUIET`` is set."""
    if os.environ.get(QUIET_ENV, "") in ("", "0"):
        sys.stderr.write(f"fwdtrain: {line}\n")
        sys.stderr.flush()


class _Package:
    """A traced graph's AOTInductor package: ``load`` it from disk, or ``start`` its compile in another process
    (``worker``) and ``poll`` for it; ``run`` is the loaded package's call (None until then)."""

    def __init__(self, module: torch.nn.Module, example: list[torch.Tensor], key: str, options: dict[str, Any]) -> None:
        self.module, self.example, self.options = module, example, options
        self.path = cache.package_path(key)
        self.device = next((t.device for t in example if isinstance(t, torch.Tensor)), torch.device("cpu"))
        self.run: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None
        self.loaded_from_disk = False
        self.signature = [(t.dtype, t.shape, t.stride()) for t in example]
        self.child: subprocess.Popen | None = None
        self.job = self.path.with_suffix(".job")

    def fits(self, flat: list[torch.Tensor]) -> list[torch.Tensor]:
        """``flat`` laid out as the example the package was built for (its C++ runner reads memory as it was
        told to: another dtype or shape would be read as garbage, so it is refused; other strides are copied)."""
        if [(t.dtype, t.shape, t.stride()) for t in flat] == self.signature:  # the loop's own carry: as built
            return flat
        if len(flat) != len(self.signature) or any(
            (t.dtype, t.shape) != expected[:2] for t, expected in zip(flat, self.signature, strict=False)
        ):
            given = [(t.dtype, tuple(t.shape)) for t in flat]
            raise TypeError(
                f"fwdtrain internal error: the compiled kernel {self.path.name} was built for inputs "
                f"{[(d, tuple(s)) for d, s, _ in self.signature]} and was called with {given}; please report it"
            )
        return [
            t if t.stride() == stride or t.numel() <= 1 else _restrided(t, stride)
            for t, (_, _, stride) in zip(flat, self.signature, strict=True)
        ]

    def load(self) -> bool:
        """Load the package when it is on disk (counted; a corrupt one is set aside with a warning); whether
        ``run`` is ready."""
        if self.run is None and self.path.is_file():
            try:
                self.run = _compat.aot_load(str(self.path), self.device)
                cache.touch(self.path)
                cache.count(loads=1)
            except Exception as error:
                _warn(f"the compiled kernel {self.path.name} could not be loaded ({root_cause(error)}); rebuilding it")
                self.set_aside()
        return self.run is not None

    def start(self, where: str) -> None:
        """Start the compile in another process, unless this one or another process of this cache compiles it
        already (its job file, younger than ``cache.STALE_SECONDS``); one line says so (``say``)."""
        if self.child is not None or self.run is not None or self._elsewhere():
            return
        say(f"compiling the step's kernel {where} (AOTInductor: about 30 to 60 s on a first compile)")
        temporary = cache.writable_temporary(self.job)
        torch.save((self.module, self.example, self.options), temporary)
        os.replace(temporary, self.job)
        root = str(Path(__file__).resolve().parents[2])  # this fwdtrain, whatever the child's path would find
        path = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
        log = open(self.job.with_suffix(".log"), "w")  # noqa: SIM115  # the child's, closed below
        with log:
            self.child = subprocess.Popen(  # detached: a run that ends first leaves it to finish for the next launch
                [sys.executable, *WORKER, str(self.job), str(self.path)],
                env={**os.environ, "PYTHONPATH": path},
                cwd=self.path.parent,  # not the user's folder, whose modules would shadow the standard library's
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        # reaped when it ends, so a process that never polls again (a notebook) keeps no zombie; poll reads its code
        threading.Thread(target=self.child.wait, name="fwdtrain-compile-reaper", daemon=True).start()
        cache.count(compiles=1)

    def _elsewhere(self) -> bool:
        """Whether another process compiles this package: its job file, younger than ``cache.STALE_SECONDS``."""
        try:
            return self.child is None and time.time() - self.job.stat().st_mtime < cache.STALE_SECONDS
        except OSError:
            return False

    def poll(self, wait: bool = False) -> str | None:
        """Where the compile stands: "" while it runs, None once the package is loaded, else why it failed (the
        worker's last line). ``wait``: until it ends."""
        if self.load():
            return None
        if self.child is None:  # another process's compile (``start``): its job file goes when it ends
            while wait and self._elsewhere():
                time.sleep(0.5)
            if self._elsewhere():
                return ""
            return None if self.load() else "another process's compile of it left no package"
        if (self.child.wait() if wait else self.child.poll()) is None:
            return ""
        code, self.child, log = self.child.returncode, None, self.job.with_suffix(".log")
        self.job.unlink(missing_ok=True)  # a worker that failed before it could remove it
        try:
            lines = log.read_text().strip().splitlines()
            log.unlink()
        except OSError:
            lines = []
        if self.load():
            return None
        return lines[-1][:300] if lines else f"the compile process exited with status {code}"

    def set_aside(self) -> None:
        """Move the package out of the cache's way (a later build writes a fresh one) and forget it."""
        self.run, self.loaded_from_disk = None, False
        try:
            os.replace(self.path, self.path.with_suffix(".rejected"))
        except OSError:
            pass


def _restrided(tensor: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """A copy of ``tensor`` with the memory layout ``stride``."""
    out = torch.empty_strided(tensor.shape, stride, dtype=tensor.dtype, device=tensor.device)
    return out.copy_(tensor)


class Kernel:
    """``fn(*args)`` compiled: its AOTInductor package, or ``fn`` with its compilable part under ``torch.compile``
    where tracing or the compile fails, or ``fn`` eagerly (one warning line at each fallback).

    ``fn`` is the kernel's meaning and its eager twin; ``trace(*args)`` gives the package and the output's pytree
    spec; ``dynamo(compiled)`` gives ``fn`` with its compilable part replaced by ``compiled``, a ``torch.compile`` of
    that part. A call compiles in the foreground where the package is not ready (``ready``); ``compiled`` (None
    where tracing failed) lets a run step eagerly while the package compiles (``start``, ``poll``). The first call
    of a package loaded from disk is checked against ``fn`` on ``probe(args)`` (a short version of the arguments),
    and a package that is off is set aside and rebuilt. Inside the user's ``torch.func`` transform a kernel runs
    ``fn`` (its tensors cannot leave it).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple,
        trace: Callable[..., tuple[_Package, Any]],
        part: Callable[..., Any],
        dynamo: Callable[[Callable[..., Any]], Callable[..., Any]],
        options: Compile,
        what: str,
        probe: Callable[[tuple], tuple] = lambda args: args,
    ) -> None:
        self.fn, self.part, self.dynamo, self.options, self.what, self.probe = fn, part, dynamo, options, what, probe
        self.package: _Package | None = None
        self.compiled: Callable | None = None
        self.out_spec: Any = None
        self.checked = not options.verify
        self.failure = ""  # why tracing failed ("": it did not)
        if options.compiler == "aot":
            try:
                self.package, self.out_spec = trace(*args)
            except Exception as error:
                self.failure = root_cause(error)
                cache.count(fallbacks=1)
        else:
            self.compiled = dynamo(_DynamoOrEager(part, options, what))

    def loaded(self) -> bool:
        """Whether the package is loaded: from this process's compile, or now from disk (then checked first)."""
        package = self.package
        if package is None:
            return False
        on_disk = package.run is None and package.path.is_file()
        if package.load() and on_disk:
            package.loaded_from_disk = True
        return package.run is not None

    def _fall_back(self, error: str) -> None:
        cache.count(fallbacks=1)
        _warn(f"the trace-once compile of {self.what} failed ({error}); using torch.compile instead")
        self.package = None
        self.compiled = self.dynamo(_DynamoOrEager(self.part, self.options, self.what))

    def ready(self, args: tuple) -> Callable[[list[torch.Tensor]], list[torch.Tensor]] | None:
        """The package's ``run``: loaded, else compiled in the foreground; a package loaded from disk is checked
        once against ``fn`` and set aside and rebuilt when it is off. None where there is no package or it cannot
        be built (then ``_fall_back`` has run)."""
        package = self.package
        if package is None:
            if self.compiled is None:
                self._fall_back(self.failure)
            return None
        if not self.loaded():
            package.start("before the run's first step")
            failure = package.poll(wait=True)
            if failure is not None:
                self._fall_back(failure or "the compile stopped")
                return None
        run = package.run
        assert run is not None
        if not self.checked:
            self.checked = True
            if package.loaded_from_disk:
                short = self.probe(args)
                if not _close(run(package.fits(leaves(short))), leaves(self.fn(*short))):
                    _warn(
                        f"the compiled kernel {package.path.name} on disk does not reproduce {self.what}; rebuilding it"
                    )
                    package.set_aside()
                    return self.ready(args)
        return run

    def __call__(self, *args: Any) -> Any:
        if not _concrete(args):  # inside the user's torch.func transform
            return self.fn(*args)
        run = self.ready(args)
        if run is not None and self.package is not None:
            return optree.tree_unflatten(self.out_spec, run(self.package.fits(leaves(args))))
        assert self.compiled is not None
        return self.compiled(*args)

    def flat_runner(self, flat: list[torch.Tensor]) -> Callable[[list[torch.Tensor]], list[torch.Tensor]] | None:
        """The loaded package's ``run`` on flat leaves, for a caller that has checked its inputs' layout once: given
        after the first call (the package checked), for leaves laid out as ``flat`` is, when that is the package's
        own layout; None otherwise (then call the kernel)."""
        package = self.package
        if package is None or package.run is None or not self.checked or package.fits(flat) is not flat:
            return None
        return package.run


class _DynamoOrEager:
    """``torch.compile(fn)``; on its first failure one warning line, then ``fn`` eagerly for good."""

    def __init__(self, fn: Callable, options: Compile, what: str) -> None:
        _compat.use_cache_folders(cache.cache_dir())
        self.fn, self.options, self.what = fn, options, what
        self.compiled: Callable | None = None
        self.failed = False

    def __call__(self, *args: Any) -> Any:
        if self.failed or not _concrete(args):
            return self.fn(*args)
        if self.compiled is not None:
            return self.compiled(*args)
        try:
            with _quiet_torch_logs():
                extra = {"options": inductor_options(args)} if self.options.backend == "inductor" else {}
                compiled = torch.compile(  # type: ignore[call-overload]  # options: a plain dict
                    _own_code(self.fn), fullgraph=True, dynamic=False, backend=self.options.backend, **extra
                )
                result = compiled(*args)
            cache.count(compiles=1)
            self.compiled = compiled
            return result
        except Exception as error:
            from torch._dynamo.exc import RecompileError

            if isinstance(error, RecompileError):
                raise  # asked for by torch._dynamo.config.error_on_recompile: not a compiler failure
            result = self.fn(*args)
            self.failed = True
            cache.count(fallbacks=1)
            _warn(f"torch.compile of {self.what} failed ({root_cause(error)}); running it eagerly instead")
            return result


def block_kernel(
    body: Callable[..., tuple],
    check: Callable[..., torch.Tensor],
    observe: Callable[..., tuple],
    capacity: int,
    args: tuple,
    *,
    key: Hashable,
    options: Compile,
    part: Callable[..., Any] | None = None,
    wrap: Callable[[Callable[..., Any]], Callable[..., tuple]] = lambda fn: fn,
) -> Kernel:
    """``graphs.run_block`` of the flat ``body``, ``check`` and ``observe`` (records for up to ``capacity`` rows)
    compiled for arguments shaped like ``args`` = (*grids, alive, blocks, carry) (``graphs.Grids``: five 0-d int64
    tensors), built once per process (``key``: what the body depends on besides its inputs: the problem, dt, plan,
    bound, record). The ``"dynamo"`` compiler compiles ``part`` (default ``body``) and steps with ``wrap(compiled)``."""
    _compat.use_cache_folders(cache.cache_dir())

    def meaning(*args: Any, step: Callable[..., tuple] = body) -> Any:
        *grids, alive, blocks, carry = args
        return graphs.run_block(step, check, observe, capacity, graphs.Grids(*map(int, grids)), blocks, alive, carry)

    def trace(*args: Any) -> tuple[_Package, Any]:
        *grids, alive, blocks, carry = args
        one_step = tuple(block[0] for block in blocks)
        traced = [
            _simplified(graphs.trace(body, (*carry, *one_step, alive)), unfold=True),
            _simplified(graphs.trace(check, (*carry, alive)), unfold=True),
            _simplified(graphs.trace(observe, carry), unfold=True),
        ]
        example = [leaf.clone() for leaf in leaves(args)]  # one object per input: export would alias shared ones
        values = inductor_options(carry)
        kernel_key = cache.kernel_key(
            "".join(t.graph.code for t in traced),
            [c for t in traced for c in t.constants()],
            example,
            values,
            f"block-{capacity}-unroll-{options.unroll}-{graphs.loop_code()}",
        )
        step, check_graph, seen = (t.graph for t in traced)
        module = graphs.BlockLoop(step, check_graph, seen, len(blocks), capacity, options.unroll)
        tables = tuple(graphs.Packing.of(tuple(observe(*carry))).sizes())
        count = grids[0]
        spec = optree.tree_structure(graphs.BlockOut(count, count, count, carry, tables))  # type: ignore[arg-type]
        return _Package(module, example, kernel_key, values), spec

    def dynamo(compiled_body: Callable[..., tuple]) -> Callable[..., Any]:
        return lambda *args: meaning(*args, step=wrap(compiled_body))

    def probe(args: tuple) -> tuple:
        count, *rest = args
        return (torch.ones_like(count), *rest)

    signature = ("block", key, capacity, options, _signature(args))
    return cache.kernel(
        signature, lambda: Kernel(meaning, args, trace, part or body, dynamo, options, "the step", probe)
    )


def function_kernel(
    fn: Callable[..., Any], args: tuple, *, key: Hashable, options: Compile, what: str = "the step"
) -> Kernel:
    """``fn`` compiled for arguments shaped like ``args``, built once per process (``key`` as for ``block_kernel``)."""
    _compat.use_cache_folders(cache.cache_dir())

    def trace(*example_args: Any) -> tuple[_Package, Any]:
        traced = _simplified(graphs.trace(fn, example_args))
        example: list[torch.Tensor] = leaves(example_args)
        values = inductor_options(example_args)
        kernel_key = cache.kernel_key(traced.graph.code, traced.constants(), example, values, "function")
        return _Package(traced.graph, example, kernel_key, values), traced.out_spec

    signature = ("function", key, options, _signature(args))
    return cache.kernel(signature, lambda: Kernel(fn, args, trace, fn, lambda compiled: compiled, options, what))


__all__ = [
    "SINGLE_THREAD_BELOW",
    "Kernel",
    "block_kernel",
    "counts",
    "function_kernel",
    "inductor_options",
    "root_cause",
]
