"""Compiled kernels: a pure step made fast, built once per process and kept on disk for the next.

Two kinds, both computing exactly what their eager twin computes (to rounding):

- ``loop_kernel(step, carry, inputs)``: ``chunk(count, start, inputs, carry)``, i.e.
  ``graphs.run_steps``: ``count`` steps ``carry = step(carry, inputs[start + i])`` in one call.
- ``function_kernel(fn, args)``: ``fn(*args)`` in one call (a single step in a loop of one's own,
  or the two halves of a step around a gradient hook).

Routes, tried in this order (``Compile.route``):

1. ``"aot"``: the function traced once with ``make_fx`` (``graphs.trace``), keyed by that graph
   (``cache.kernel_key``), loaded from ``cache_dir()/kernels`` when a package of that key exists,
   else compiled by AOTInductor into one (``_compat.aot_compile``) and loaded by the C++ loader.
   A package loaded from disk is checked against the eager step on its first call
   (``Compile.verify``); a package that cannot be loaded or fails the check is set aside with a
   one-line warning and rebuilt.
2. ``"dynamo"``: ``torch.compile`` of the step (the loop in Python between steps), when the first
   route fails; a one-line warning says why.
3. eager: when compilation fails altogether (one warning line, as for the others).

Kernels are cached in the process by the caller's key (the problem, dt, plan, solver, optimizer) and
the inputs' shapes, dtypes and devices, so a second ``run`` call, a resumed run or a continued
segment never traces or compiles again. ``counts()`` tells how many traces, compiles and loads a
process made (tests count these events, never seconds). Inside the user's ``torch.func``
transform a kernel runs its eager twin (its tensors cannot leave the transform).
"""

from __future__ import annotations

import contextlib
import logging
import os
import types
import warnings
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import optree
import torch

from .. import _compat
from . import cache, graphs
from .options import Compile

SINGLE_THREAD_BELOW = 1 << 16  # state numbers under which kernels run on one thread (no fork/join per kernel)
FUSED_CAT_UP_TO = 512  # state numbers up to which a kernel's concatenations are fused (one particle, small model)


def counts() -> dict[str, int]:
    """How many kernels this process traced, compiled (AOTInductor or torch.compile), loaded from disk,
    and how many fell back to another route; ``traced_ops`` and ``simplified_ops``: the ATen calls of every
    traced graph as traced and after ``graphs.simplify`` (``cache.events``)."""
    return cache.events()


def _simplified(traced: graphs.Traced, unfold: bool = False) -> graphs.Traced:
    """The traced graph with its shape chains folded (in place) and, with ``unfold``, its small products
    written out (``graphs.unfold_small_matmuls``); counted."""
    if unfold:
        graphs.unfold_small_matmuls(traced.graph)
    before, after = graphs.simplify(traced.graph)
    cache.count(traces=1, traced_ops=before, simplified_ops=after)
    return traced


def clear() -> None:
    """Forget the kernels built in this process (the packages on disk stay)."""
    cache.forget_kernels()


def _signature(tree: Any) -> tuple:
    return tuple(
        (tuple(t.shape), t.dtype, str(t.device)) if isinstance(t, torch.Tensor) else (type(t).__name__, t)
        for t in optree.tree_leaves(tree)
    )


def _leaves(tree: Any) -> list[torch.Tensor]:
    return optree.tree_leaves(tree)


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


# ---------------------------------------------------------------- the AOTInductor route


class _Package:
    """A traced graph's AOTInductor package: ``warm`` when it is on disk; ``ready()`` loads or compiles it."""

    def __init__(
        self, module: torch.nn.Module, example: list[torch.Tensor], key: str, options: dict[str, Any], nodes: int
    ) -> None:
        self.module, self.example, self.options, self.nodes = module, example, options, nodes
        self.path = cache.package_path(key)
        self.device = next((t.device for t in example if isinstance(t, torch.Tensor)), torch.device("cpu"))
        self.run: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None
        self.loaded_from_disk = False
        self.signature = [(t.dtype, t.shape, t.stride()) for t in example]

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

    @property
    def warm(self) -> bool:
        """Whether a package of this key is on disk (loading it costs milliseconds)."""
        return self.run is not None or self.path.is_file()

    def ready(self) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
        """The package's ``run``: loaded from disk, else compiled first (a corrupt one is rebuilt with a warning)."""
        if self.run is not None:
            return self.run
        if self.path.is_file():
            try:
                self.run = self._load()
                self.loaded_from_disk = True
                return self.run
            except Exception as error:
                _warn(f"the compiled kernel {self.path.name} could not be loaded ({root_cause(error)}); rebuilding it")
                self.set_aside()
        self._build()
        assert self.run is not None
        return self.run

    def _load(self) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
        run = _compat.aot_load(str(self.path), self.device)
        cache.touch(self.path)
        cache.count(loads=1)
        return run

    def _build(self) -> None:
        machine = cache.machine()
        _compat.skip_known_probe(machine)
        temporary = cache.writable_temporary(self.path)
        try:
            with _quiet_torch_logs():
                _compat.aot_compile(self.module, tuple(self.example), temporary, self.options)
            os.replace(temporary, self.path)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
        cache.prune(keep=self.path)
        _compat.record_probe(machine)
        cache.count(compiles=1)
        self.run = self._load()

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


def _loop_package(step: graphs.StepFn, carry: Any, inputs: Any, unroll: int = 1) -> tuple[_Package, Any]:
    """Trace ``step`` once and wrap it in ``graphs.StepLoop`` (``unroll`` steps per iteration); (its package, the
    carry's pytree spec)."""
    example_step = optree.tree_map(lambda block: block[0], inputs)
    traced = _simplified(graphs.trace(step, (carry, example_step)), unfold=True)
    input_leaves, _ = optree.tree_flatten(inputs)
    carry_leaves, carry_spec = optree.tree_flatten(carry)
    count, start = torch.zeros((), dtype=torch.int64), torch.zeros((), dtype=torch.int64)  # two objects: export
    example = [count, start, *input_leaves, *carry_leaves]  # would alias one
    options = inductor_options(carry)
    key = cache.kernel_key(
        traced.graph.code, traced.constants(), example, options, f"loop-unroll-{unroll}-{graphs.loop_code()}"
    )
    module = graphs.StepLoop(
        traced.graph, len(input_leaves), unroll
    )  # the traced step takes (carry leaves, input leaves)
    return _Package(module, example, key, options, traced.nodes), carry_spec


class Kernel:
    """A pure function compiled: its AOTInductor package, or ``torch.compile`` where tracing fails, or eager.

    Written once for both kinds: the fallback (one warning line, then ``torch.compile``), the first call of a
    package loaded from disk checked against the eager function (``Compile.verify``; a package that is off
    is set aside and rebuilt), and the call on flat leaves. A subclass says how its function is traced
    (``_trace``: the package and the output's pytree spec) and how it is called; ``compilable`` is what the
    ``torch.compile`` route compiles (the step of a loop, the function itself).
    """

    def __init__(self, compilable: Callable[..., Any], options: Compile, what: str, *example: Any) -> None:
        self.compilable, self.what, self.options = compilable, what, options
        self.package: _Package | None = None
        self.compiled: Callable | None = None
        self.out_spec: Any = None
        self.checked = not options.verify
        if options.route == "aot":
            try:
                self.package, self.out_spec = self._trace(*example)
                return
            except Exception as error:
                self._fall_back(error)
                return
        self.compiled = _DynamoOrEager(compilable, options, what)

    def _trace(self, *example: Any) -> tuple[_Package, Any]:
        raise NotImplementedError

    @property
    def warm(self) -> bool:
        """Whether the first call costs no compile (a package on disk, or a kernel built in this process)."""
        return self.package is not None and self.package.warm

    @property
    def nodes(self) -> int:
        return self.package.nodes if self.package is not None else 0

    @property
    def route(self) -> str:
        return "aot" if self.package is not None else "dynamo"

    def _fall_back(self, error: BaseException) -> None:
        cache.count(fallbacks=1)
        _warn(f"the trace-once compile of {self.what} failed ({root_cause(error)}); using torch.compile instead")
        self.package = None
        self.compiled = _DynamoOrEager(self.compilable, self.options, self.what)

    def _checked_run(
        self, probe: Callable[[], tuple[list[torch.Tensor], list[Any]]]
    ) -> Callable[[list[torch.Tensor]], list[torch.Tensor]] | None:
        """The package's ``run``, loaded or built; a package loaded from disk is checked once against ``probe()``
        ((flat inputs, the eager function's output leaves)) and set aside and rebuilt when it is off. None where
        there is no package or it cannot be readied (then ``_fall_back`` has run)."""
        if self.package is None:
            return None
        try:
            run = self.package.ready()
        except Exception as error:
            self._fall_back(error)
            return None
        if not self.checked:
            self.checked = True
            if self.package.loaded_from_disk:
                inputs, expected = probe()
                if not _close(run(self.package.fits(inputs)), expected):
                    _warn(
                        f"the compiled kernel {self.package.path.name} on disk does not reproduce {self.what}; "
                        f"rebuilding it"
                    )
                    self.package.set_aside()
                    run = self.package.ready()
        return run

    def _run(self, flat: list[torch.Tensor], probe: Callable[[], tuple[list[torch.Tensor], list[Any]]]) -> Any | None:
        """The package's outputs on ``flat`` (unflattened); None when there is no package (call ``compiled``)."""
        run = self._checked_run(probe)
        if run is None or self.package is None:
            return None
        return optree.tree_unflatten(self.out_spec, run(self.package.fits(flat)))

    def flat_runner(self, flat: list[torch.Tensor]) -> Callable[[list[torch.Tensor]], list[torch.Tensor]] | None:
        """The loaded package's ``run`` on flat leaves, for a caller that has checked its inputs' layout once: given
        after the first call (the package checked), for leaves laid out as ``flat`` is, when that is the package's
        own layout; None otherwise (then call the kernel)."""
        package = self.package
        if package is None or package.run is None or not self.checked:
            return None
        if [(t.dtype, t.shape, t.stride()) for t in flat] != package.signature:
            return None
        return package.run


class LoopKernel(Kernel):
    """``chunk(count, start, inputs, carry) -> carry``: ``graphs.run_steps`` of ``step`` in one compiled call.

    Built in two stages, so that ``compile="auto"`` can look before it pays: construction traces the step
    and names its package (``warm``: on disk already; ``nodes``: the graph's size); the first call loads
    the package or compiles it. A package from disk is checked by one step.
    """

    def __init__(self, step: graphs.StepFn, carry: Any, inputs: Any, options: Compile, what: str) -> None:
        self.step = step
        self._scalars: dict[tuple[str, int], torch.Tensor] = {}
        super().__init__(step, options, what, carry, inputs)

    def scalar(self, role: str, value: int) -> torch.Tensor:
        """The 0-d int64 tensor ``value`` for ``role`` ("count", "start"), made once per kernel (the kernel only
        reads it; each role its own tensor, as export would alias equal ones)."""
        key = (role, value)
        if key not in self._scalars:
            if len(self._scalars) > 1 << 12:
                self._scalars.clear()
            self._scalars[key] = torch.tensor(value, dtype=torch.int64)
        return self._scalars[key]

    def _trace(self, carry: Any, inputs: Any) -> tuple[_Package, Any]:
        return _loop_package(self.step, carry, inputs, self.options.unroll)

    def __call__(self, count: int, start: int, inputs: Any, carry: Any) -> Any:
        if not (_concrete(inputs) and _concrete(carry)):  # inside the user's torch.func transform
            return graphs.run_steps(self.step, count, start, inputs, carry)

        def flat(steps: int) -> list[torch.Tensor]:
            return [
                self.scalar("count", steps),
                self.scalar("start", start),
                *optree.tree_leaves(inputs),
                *optree.tree_leaves(carry),
            ]

        def one_step() -> tuple[list[torch.Tensor], list[Any]]:
            return flat(1), optree.tree_leaves(graphs.run_steps(self.step, 1, start, inputs, carry))

        out = self._run(flat(count), one_step)
        if out is not None:
            return out
        return graphs.run_steps(self.compiled or self.step, count, start, inputs, carry)


class ObservedKernel(LoopKernel):
    """``chunk(stops, start, inputs, carry) -> (carry, observations)``: ``graphs.run_observed`` of ``step`` and
    ``observe`` in one compiled call, for at most ``rows`` stops; observations come back stacked (leaves
    (rows, *shape), the rows past ``len(stops)`` zeros).

    The loop's fast path: where it cannot be built (the observation does not trace, the compiler fails) it says
    so once through ``failed`` and the loop takes its ordinary path; it never falls back to another route.
    """

    def __init__(
        self, step: graphs.StepFn, observe: Callable[[Any], Any], rows: int, carry: Any, inputs: Any, options: Compile
    ) -> None:
        self.observe, self.rows, self.failed = observe, rows, False
        self.observed_spec: Any = None
        self.observed_packing: graphs.Packing | None = None
        super().__init__(step, carry, inputs, options._replace(route="aot"), "the observed loop")

    def _fall_back(self, error: BaseException) -> None:
        self.failed, self.package = True, None

    def _trace(self, carry: Any, inputs: Any) -> tuple[_Package, Any]:
        example_step = optree.tree_map(lambda block: block[0], inputs)
        step = _simplified(graphs.trace(self.step, (carry, example_step)), unfold=True)
        observe = _simplified(graphs.trace(self.observe, (carry,)), unfold=True)
        observed_example = optree.tree_leaves(self.observe(carry))
        self.observed_packing = graphs.Packing.of(tuple(observed_example))
        self.observed_spec = observe.out_spec
        input_leaves, _ = optree.tree_flatten(inputs)
        carry_leaves, carry_spec = optree.tree_flatten(carry)
        stops = torch.arange(1, self.rows + 1, dtype=torch.int64)
        n_stops, start = torch.tensor(self.rows, dtype=torch.int64), torch.zeros((), dtype=torch.int64)
        example = [stops, n_stops, start, *input_leaves, *carry_leaves]
        options = inductor_options(carry)
        unroll = self.options.unroll
        key = cache.kernel_key(
            step.graph.code + observe.graph.code,
            step.constants() + observe.constants(),
            example,
            options,
            f"observed-loop-unroll-{unroll}-{graphs.loop_code()}",
        )
        module = graphs.ObservedStepLoop(step.graph, observe.graph, len(input_leaves), unroll)
        return _Package(module, example, key, options, step.nodes + observe.nodes), carry_spec

    def stacked(self, seen: list[Any]) -> Any:
        """The eager twin's observations stacked as the kernel gives them (``rows`` rows, zeros past the last)."""
        stacked = optree.tree_map(lambda *rows: torch.stack(rows), *seen)
        return optree.tree_map(
            lambda leaf: torch.cat([leaf, leaf.new_zeros((self.rows - leaf.shape[0], *leaf.shape[1:]))]), stacked
        )

    def observe_call(self, stops: list[int], start: int, inputs: Any, carry: Any) -> tuple[Any, Any] | None:
        """(the carry at the last stop, the stacked observations); None where the fast path failed (the caller
        takes its ordinary path). ``stops``: at most ``rows`` increasing step counts, the first > 0."""
        if self.failed or len(stops) > self.rows or not (_concrete(inputs) and _concrete(carry)):
            return None
        flat_stops = torch.zeros(self.rows, dtype=torch.int64)
        flat_stops[: len(stops)] = torch.tensor(stops, dtype=torch.int64)

        def flat(n: int) -> list[torch.Tensor]:
            return [
                flat_stops,
                self.scalar("count", n),
                self.scalar("start", start),
                *optree.tree_leaves(inputs),
                *optree.tree_leaves(carry),
            ]

        def probe() -> tuple[list[torch.Tensor], list[Any]]:
            end, seen = graphs.run_observed(self.step, self.observe, stops[:1], start, inputs, carry)
            assert self.observed_packing is not None
            leaves = optree.tree_leaves(self.stacked(seen))
            tables = [
                torch.cat(
                    [leaf.reshape(self.rows, -1) for leaf, place in zip(leaves, places, strict=True) if place[0] == b],
                    1,
                )
                for b, places in enumerate([self.observed_packing.places] * len(self.observed_packing.dtypes))
            ]
            return flat(1), [*optree.tree_leaves(end), *tables]

        run = self._checked_run(probe)
        if run is None or self.package is None:
            return None
        out = run(self.package.fits(flat(len(stops))))
        assert self.observed_packing is not None
        n_carry = len(optree.tree_leaves(carry))
        carry_out = optree.tree_unflatten(self.out_spec, out[:n_carry])
        tables = tuple(out[n_carry:])
        leaves = [
            tables[b][:, offset : offset + n].reshape((self.rows, *shape))
            for b, offset, n, shape in self.observed_packing.places
        ]
        return carry_out, optree.tree_unflatten(self.observed_spec, leaves)


class FunctionKernel(Kernel):
    """``fn(*args)`` compiled: the AOTInductor package of its traced graph, or ``torch.compile``."""

    def __init__(self, fn: Callable[..., Any], args: tuple, options: Compile, what: str) -> None:
        self.fn = fn
        super().__init__(fn, options, what, *args)

    def _trace(self, *args: Any) -> tuple[_Package, Any]:
        traced = _simplified(graphs.trace(self.fn, args))
        example: list[torch.Tensor] = optree.tree_leaves(args)  # type: ignore[arg-type]
        values = inductor_options(args)
        key = cache.kernel_key(traced.graph.code, traced.constants(), example, values, "function")
        return _Package(traced.graph, example, key, values, traced.nodes), traced.out_spec

    def __call__(self, *args: Any) -> Any:
        if not _concrete(args):
            return self.fn(*args)
        out = self._run(_leaves(args), lambda: (_leaves(args), optree.tree_leaves(self.fn(*args))))
        if out is not None:
            return out
        assert self.compiled is not None
        return self.compiled(*args)


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


def loop_kernel(
    step: graphs.StepFn, carry: Any, inputs: Any, *, key: Hashable, options: Compile, what: str = "the step"
) -> LoopKernel:
    """The compiled loop of ``step`` for carries and input blocks shaped like these, built once per process
    (``key``: what the step depends on besides its inputs: the problem, dt, plan, solver, optimizer)."""
    _compat.use_cache_folders(cache.cache_dir())
    signature = ("loop", key, options, _signature(carry), _signature(inputs))
    return cache.kernel(signature, lambda: LoopKernel(step, carry, inputs, options, what))


def observed_kernel(
    step: graphs.StepFn,
    observe: Callable[[Any], Any],
    rows: int,
    carry: Any,
    inputs: Any,
    *,
    key: Hashable,
    options: Compile,
) -> ObservedKernel:
    """The compiled observed loop (``ObservedKernel``) of ``step`` and ``observe``, built once per process (``key``
    names both: the problem, dt, plan, solver, optimizer, and what is observed)."""
    _compat.use_cache_folders(cache.cache_dir())
    signature = ("observed", key, rows, options, _signature(carry), _signature(inputs))
    return cache.kernel(signature, lambda: ObservedKernel(step, observe, rows, carry, inputs, options))


def function_kernel(
    fn: Callable[..., Any], args: tuple, *, key: Hashable, options: Compile, what: str = "the step"
) -> FunctionKernel:
    """``fn`` compiled for arguments shaped like ``args``, built once per process (``key`` as for ``loop_kernel``)."""
    _compat.use_cache_folders(cache.cache_dir())
    signature = ("function", key, options, _signature(args))
    return cache.kernel(signature, lambda: FunctionKernel(fn, args, options, what))


__all__ = [
    "SINGLE_THREAD_BELOW",
    "FunctionKernel",
    "Kernel",
    "LoopKernel",
    "ObservedKernel",
    "clear",
    "counts",
    "function_kernel",
    "inductor_options",
    "loop_kernel",
    "observed_kernel",
    "root_cause",
]
