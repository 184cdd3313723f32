"""Compiled steps: the kernel ``advance`` under ``torch.compile`` (inductor), one step or K steps per call.

    compile_advance(sde, dt, mode)        -> one_step(state, dw, alpha) -> (State, StepInfo)
    compile_steps(sde, dt, lr, mode, K)   -> fused(state, noise (K, N, m)) -> (State, StepInfo over K steps)

Both compute exactly what ``advance`` computes (same maths, same noise); they only
remove Python and dispatch overhead. ``dt``, ``mode`` and ``reduce`` are fixed when
the function is built and baked into the graph; everything that changes from step
to step (the state, t, alpha, the noise) is a tensor argument, so a warm function
never recompiles. The K fused steps are an unrolled chunk. Measured alternatives
(torch 2.13, benchmarks/bench_step.py, benchmarks/torch_scan.py):
``torch._higher_order_ops.scan`` compiles this body in a time independent of K,
but inductor drives its loop from the wrapper one iteration at a time (per step
about the cost of one compiled call), and it refuses bodies that close over
tensors (an SDE whose drift uses a matrix A: "lifted arguments" are unsupported);
``torch.compiler.nested_compile_region`` around the step compiled no faster and
ran no faster than plain unrolling.

If compilation fails (an unsupported operation in a user's SDE, no C++ compiler),
the function warns once (one line; torch's own logs are silenced during the attempt)
and runs the same code eagerly from then on. Called inside the user's ``torch.func``
transform (``grad``, ``jacfwd``, ``vmap``, ...), whose wrapped tensors dynamo cannot trace
from outside, a compiled function runs its eager twin for that call: the same values and
correct derivatives, without the speed-up.

Compiled kernels persist on disk in ``cache_dir()`` (``$FWDTRAIN_CACHE_DIR``, default
``~/.cache/fwdtrain``): torch's FX graph and AOTAutograd caches, pointed there. A second
launch skips inductor but not dynamo's trace (see ``use_persistent_cache`` for the
measurements). ``choose_compilation`` is the policy for ``compile="auto"``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import types
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import torch

from . import _checks
from ._tree import leaves, tree_map
from .euler import GradientReduce, LearningRate, StepInfo, advance, learning_rate
from .problem import SDE
from .state import State

# Inductor splits a C++ loop over OpenMP threads once each thread gets 512 elements; a
# fork/join costs more than that saves, and on a busy machine a step of N = 100 took
# 47 ms instead of 0.1 ms (a thread waits for a partner that is not running).
# Parallel loops only from 8192 elements on 2 threads.
STEP_OPTIONS = {"cpp.min_chunk_size": 4096}
# The C++ wrapper calls the kernels of all K steps without Python in between.
FUSED_OPTIONS = {**STEP_OPTIONS, "cpp_wrapper": True}

OneStep = Callable[[State, torch.Tensor, Any], tuple[State, StepInfo]]
FusedSteps = Callable[[State, torch.Tensor], tuple[State, StepInfo]]


CACHE_ENV = "FWDTRAIN_CACHE_DIR"


def cache_dir() -> Path:
    """Where compiled kernels persist between launches: ``$FWDTRAIN_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/fwdtrain`` (``~/.cache/fwdtrain``). Never the working directory.

    Torch's own default (``/tmp/torchinductor_$USER``) is wiped on reboot and shared by
    every torch program of the user; a user cache folder survives and holds only ours.
    """
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fwdtrain"


def use_persistent_cache() -> Path:
    """Point inductor's on-disk caches at ``cache_dir() / "inductor"`` unless the user chose a
    folder (``TORCHINDUCTOR_CACHE_DIR``); returns the folder in use.

    Measured (lqr_1d, N = 1, one step, 2-core CPU under load, fresh folder then the same one
    in a new process): 21.5 s cold, 10.5 s warm with the FX graph and AOTAutograd caches
    hitting (torch's defaults). The warm launch still traces with dynamo (~3 s through
    ``torch.func``), imports inductor (~3-5 s) and loads the cached kernel: the caches keep
    the compiler's work, not dynamo's; ``save_cache_artifacts`` bundles the same two caches
    and adds nothing on one machine. ``torch.compile(...).aot_compile`` (which would skip
    dynamo) fails on this step (TensorifyScalarRestartAnalysis, torch 2.13).
    """
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # a small file, no inductor import

    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # Inductor writes its default into the variable the first time it looks (importing dynamo
    # may do that): that value is torch's choice, not the user's.
    if not folder or os.path.abspath(folder) == os.path.abspath(default_cache_dir()):
        folder = str(cache_dir() / "inductor")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder  # read by inductor on every cache access
    return Path(folder)


def warm_cache_exists() -> bool:
    """Whether inductor's FX graph cache in the folder ``use_persistent_cache`` picks holds any
    compiled graph (a cheap hint for ``choose_compilation``; it does not say which problem)."""
    folder = use_persistent_cache() / "fxgraph"
    return folder.is_dir() and any(folder.iterdir())


@contextlib.contextmanager
def _quiet_torch_logs() -> Iterator[None]:
    """Silence torch's loggers (dynamo, inductor, ...) for the duration: a failed compile
    otherwise logs internal asserts and tracebacks before the error reaches us."""
    loggers = [logging.getLogger("torch")] + [
        logger for name, logger in logging.root.manager.loggerDict.items()
        if name.startswith("torch.") and isinstance(logger, logging.Logger)
    ]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _root_cause(error: BaseException) -> str:
    """"Type: first line" of the innermost cause (dynamo wraps a backend's error in its own)."""
    while (inner := getattr(error, "inner_exception", None) or error.__cause__) is not None:
        error = inner
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:200] if text else ''}"


# Below this many state numbers (x and x_tilde of all particles) kernels run on one thread.
# Measured (lqr_1d, N = 256: 12k numbers, run(compile=True), 2-core CPU at load 5-7): 22-38 ms
# per step with torch's 2 threads, 2.1 ms with one (a 2-thread region waits for a partner that
# is not running). Larger states keep torch's thread count: the README's idle-machine figure at
# N = 10^4 (480k numbers, 15.8M particle-steps/s fused) was measured with 2 threads.
SINGLE_THREAD_BELOW = 1 << 16


def _thread_options(args: tuple) -> dict:
    """{"cpp.threads": 1} for small inputs (see SINGLE_THREAD_BELOW), else {} (torch's default).

    Counts x and x_tilde of a ``State`` first argument, or every tensor of the arguments otherwise
    (e.g. the frozen-theta evaluation step's (theta, x, dw))."""
    first = args[0] if args else None
    counted = (first.x, first.x_tilde) if isinstance(first, State) else args
    numbers = sum(leaf.numel() for leaf in leaves(counted) if isinstance(leaf, torch.Tensor))
    return {"cpp.threads": 1} if numbers < SINGLE_THREAD_BELOW else {}


def _own_code(fn: Callable) -> Callable:
    """``fn`` with a code object of its own. Dynamo keeps its compiled graphs, and counts recompiles
    against ``recompile_limit`` (8), per code object: every kernel built here shares one code object
    (e.g. ``compile_advance``'s ``one_step``), so the ninth problem compiled in one process would fall
    back to eager. A copy of the code per kernel gives each its own cache."""
    if not isinstance(fn, types.FunctionType):
        return fn
    own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    own.__kwdefaults__, own.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    return own


class CompiledOrEager:
    """Call ``torch.compile(fn)``; on the first failure warn and call ``fn`` eagerly for good."""

    def __init__(self, fn: Callable, what: str, backend: str | Callable, options: dict | None,
                 fullgraph: bool = True) -> None:
        from torch._dynamo.exc import RecompileError  # deferred: importing dynamo takes seconds

        use_persistent_cache()
        self.recompile_error = RecompileError
        self.eager = fn
        self.attempted = False
        self.what = what
        self.backend, self.options, self.fullgraph = backend, options, fullgraph
        self.compiled: Callable | None = fn  # replaced by torch.compile(fn) on the first call

    def _build(self, args: tuple) -> Callable:
        extra = {}
        if self.options and self.backend == "inductor":
            extra = {"options": {**_thread_options(args), **self.options}}
        return torch.compile(_own_code(self.eager), fullgraph=self.fullgraph, dynamic=False, backend=self.backend,
                             **extra)

    def __call__(self, *args: Any) -> Any:
        if self.compiled is not None and not all(_checks.is_concrete(leaf) for leaf in leaves(args)):
            return self.eager(*args)  # inside the user's torch.func transform: dynamo cannot trace its wrappers
        if self.compiled is not None:
            try:
                if self.attempted:
                    return self.compiled(*args)
                with _quiet_torch_logs():  # the first call compiles: one warning line if it fails
                    self.compiled = self._build(args)
                    result = self.compiled(*args)
                self.attempted = True
                return result
            except self.recompile_error:
                raise  # asked for by torch._dynamo.config.error_on_recompile: not a compiler failure
            except Exception as error:  # noqa: BLE001 - any compiler failure falls back; eager re-raises user errors
                result = self.eager(*args)
                warnings.warn(
                    f"fwdtrain: torch.compile of {self.what} failed ({_root_cause(error)}); "
                    f"running it eagerly instead", RuntimeWarning, stacklevel=3,
                )
                self.compiled = None
                return result
        return self.eager(*args)


def canonical_strides(state: State) -> State:
    """The state's leaves as views with the row-major strides ``torch.empty`` would give them.

    Inductor may give a size-1 dimension of an output another (equally valid) stride
    than eager does; fed back in, that trips dynamo's stride guards and recompiles
    once. The view costs nothing and makes the compiled step's output look exactly
    like its input.
    """

    def canonical(leaf: torch.Tensor) -> torch.Tensor:
        strides, step = [], 1
        for n in reversed(leaf.shape):
            strides.append(step)
            step *= n
        return leaf.contiguous().as_strided(leaf.shape, tuple(reversed(strides)))

    return tree_map(canonical, state)


def _check_mode(mode: str) -> None:
    if mode not in ("reverse", "forward"):
        raise ValueError(f"mode must be 'reverse' or 'forward' (resolve 'auto' first, e.g. with "
                         f"fwdtrain.euler.resolve_step_mode), got {mode!r}")


def _advance_of(problem: Any, optimizer: Any = None) -> Callable[..., tuple[State, StepInfo]]:
    """The problem's unchecked step ``(state, dw, dt, alpha, mode, reduce)``: ``euler.advance`` for an SDE,
    the ``advance`` method of any other ``fwdtrain.trainable.Trainable`` (a calibration, SGDCT); with
    ``optimizer`` (a ``fwdtrain.optim`` rule) bound (``with_optimizer`` for a Trainable)."""
    if isinstance(problem, SDE):
        return functools.partial(advance, problem, optimizer=optimizer)
    if optimizer is not None:
        if not callable(getattr(problem, "with_optimizer", None)):
            raise NotImplementedError(f"{type(problem).__name__} does not take an optimizer (no with_optimizer)")
        problem = problem.with_optimizer(optimizer)
    return problem.advance


def _outside_graph(reduce: GradientReduce | None) -> GradientReduce | None:
    """A gradient hook run eagerly between compiled pieces (it may make collectives or count calls)."""
    return None if reduce is None else torch._dynamo.disable(reduce)


def _as_scalar(alpha: Any, like: torch.Tensor) -> torch.Tensor:
    """alpha as a 0-d tensor like t, so that a new value is new data, not a new graph."""
    return alpha if isinstance(alpha, torch.Tensor) else torch.tensor(alpha, dtype=like.dtype, device=like.device)


def _kernel(problem: Any, dt: float, mode: str, reduce: GradientReduce | None, optimizer: Any = None) -> OneStep:
    """The one place the kernel is called: ``(state, dw, alpha) -> advance(problem, state, dw, dt, alpha, ...)``,
    with ``optimizer`` (a ``fwdtrain.optim`` rule) bound to the problem when given."""
    advance_problem = _advance_of(problem, optimizer)
    return lambda state, dw, alpha: advance_problem(state, dw, dt, alpha, mode, reduce)


def compile_advance(
    sde: Any, dt: float, mode: str, reduce: GradientReduce | None = None, *,
    backend: str | Callable = "inductor", options: dict | None = STEP_OPTIONS, optimizer: Any = None,
) -> OneStep:
    """``advance(sde, ., ., dt, ., mode, reduce)`` compiled: ``one_step(state, dw, alpha) -> (State, StepInfo)``.

    The same contract as ``functools.partial(advance, sde, dt=dt, mode=mode, reduce=reduce)``
    with positional (state, dw, alpha); alpha may be a number or a 0-d tensor (numbers
    are turned into tensors, so changing alpha never recompiles). ``mode`` is
    "reverse" or "forward". ``backend`` and ``options`` go to ``torch.compile``
    ("eager" traces with dynamo only: quick, for tests). ``optimizer``: the ``fwdtrain.optim`` rule
    of state.opt_state (None: the problem's own; ``CostForm(sde, rule)`` binds it too).
    Inputs are not validated here: check them once with ``fwdtrain.stepping.check_step_inputs``.
    """
    _check_mode(mode)
    _checks.check_dt(dt)
    fullgraph, reduce = reduce is None, _outside_graph(reduce)
    kernel = _kernel(sde, dt, mode, reduce, optimizer)

    def one_step(state: State, dw: torch.Tensor, alpha: torch.Tensor) -> tuple[State, StepInfo]:
        new_state, info = kernel(state, dw, alpha)
        return canonical_strides(new_state), info

    compiled = CompiledOrEager(one_step, f"one step (mode={mode!r})", backend, options, fullgraph)

    def call(state: State, dw: torch.Tensor, alpha: Any) -> tuple[State, StepInfo]:
        return compiled(state, dw, _as_scalar(alpha, state.t))

    return call


def compile_steps(
    sde: Any, dt: float, lr: LearningRate, mode: str, steps: int, reduce: GradientReduce | None = None,
    *, backend: str | Callable = "inductor", options: dict | None = FUSED_OPTIONS, optimizer: Any = None,
) -> FusedSteps:
    """K = ``steps`` steps of ``advance`` in one compiled call: ``fused(state, noise) -> (State, StepInfo)``.

    ``noise`` is (K, N, m), the Brownian increments of the K steps; step k uses
    alpha = lr(t_k) (a schedule is evaluated inside the graph on the tensor t_k).
    The returned ``StepInfo`` stacks the per-step diagnostics: cost (K,) and the
    gradient pytree with leaves (K, *s). Equal to K calls of ``advance`` with the same
    noise. Compile time grows with K (the chunk is unrolled, ~5-10 s per step on a
    small CPU): K = 8..16 amortises the per-call overhead (~0.15 ms); run a remainder
    of fewer steps with ``compile_advance``. By default inductor's C++ wrapper calls
    the kernels of all K steps without Python in between (``options=FUSED_OPTIONS``,
    2-3x faster per step than the Python wrapper at N = 1). ``optimizer`` as for ``compile_advance``.
    """
    _check_mode(mode)
    _checks.check_dt(dt)
    _checks.check_lr(lr)
    steps = _checks.check_count(steps, "steps")
    fullgraph, reduce = reduce is None, _outside_graph(reduce)
    kernel = _kernel(sde, dt, mode, reduce, optimizer)

    def fused(state: State, noise: torch.Tensor) -> tuple[State, StepInfo]:
        costs, gradients = [], []
        for k in range(steps):
            state, info = kernel(state, noise[k], learning_rate(lr, state.t))
            costs.append(info.cost)
            gradients.append(info.gradient)
        return canonical_strides(state), StepInfo(torch.stack(costs), tree_map(lambda *g: torch.stack(g), *gradients))

    compiled = CompiledOrEager(fused, f"{steps} fused steps (mode={mode!r})", backend, options, fullgraph)

    def call(state: State, noise: torch.Tensor) -> tuple[State, StepInfo]:
        if not isinstance(noise, torch.Tensor) or noise.ndim < 2 or noise.shape[:2] != (steps, state.x.shape[0]):
            shape = tuple(noise.shape) if isinstance(noise, torch.Tensor) else type(noise).__name__
            raise ValueError(f"noise must have shape (steps, particles, m) = ({steps}, {state.x.shape[0]}, m), "
                             f"got {shape}")
        return compiled(state, noise)

    return call


class Compilation(NamedTuple):
    """What ``choose_compilation`` picked: ``compile`` and ``fuse`` as ``fwdtrain.run`` takes them,
    and the estimated seconds to finish the run by each option (for logs and tests)."""

    compile: bool
    fuse: int
    estimates: dict[str, float]


# Costs measured on the 2-core CPU (lqr_1d, torch 2.13; compiled and fused from bench_step.py, eager
# from ft.run(compile=False) under a load of ~1.5 with the structure-aware step: 1.9 ms/step at N = 1,
# 3.2 ms at N = 256, 12.5 ms at N = 10^4). Seconds per step = fixed + per-particle N.
EAGER_STEP_S = (3.0e-3, 1.0e-6)      # Python + torch.func dispatch of the small ops of one step
COMPILED_STEP_S = (1.5e-4, 8.3e-8)   # one compiled call per step (0.18 ms at N = 256, measured)
FUSED_STEP_S = (2.0e-5, 8.3e-8)      # K steps per call through the C++ wrapper (52k steps/s at N = 1)
# Seconds to compile one step at N = 256: cold 13-23 s by load (profile at 13.4 s: dynamo's trace 2.2 s,
# AOT + inductor lowering 1 s, C++ codegen and gcc ~9 s, loading 1.9 s); warm 4 s (trace 0.9 s, loading
# the cached module 1.3 s, imports). An unrolled chunk grows ~3.5 s per extra step cold (65 s at K = 16)
# and ~1 s per step warm (dynamo's trace).
COMPILE_S = {"cold": (20.0, 3.5), "warm": (4.5, 1.0)}
FUSE_CHOICES = (4, 8, 16)


def run_seconds(steps: int, particles: int, cost: tuple[float, float]) -> float:
    """Estimated seconds for ``steps`` steps of N = ``particles`` at ``cost`` = (fixed, per particle) s/step."""
    return steps * (cost[0] + cost[1] * particles)


def choose_compilation(steps: int, particles: int, warm_cache: bool) -> Compilation:
    """Eager, compiled or fused (K) for ``compile="auto"``: the option that finishes soonest.

    Estimated time = compile time + steps x (fixed + per-particle cost) with the measured
    constants above (fused adds a one-step compile for the gaps between records). With a cold
    cache, compiling one step (20 s) pays off after ~7,000 steps at N = 256 (eager 3.3 ms/step,
    compiled 0.17 ms), after ~1,600 at N = 10^4; a warm cache (4.5 s) pays after ~1,500 steps at
    N = 256. So the seed run (6,000 steps, N = 256) stays eager on a cold cache and compiles on a
    warm one; short runs and tests stay eager. A pure function of its arguments: pass
    ``warm_cache=warm_cache_exists()``.
    """
    steps = _checks.check_count(steps, "steps", minimum=0)
    particles = _checks.check_count(particles, "particles")
    base, per_extra = COMPILE_S["warm" if warm_cache else "cold"]

    run_s = functools.partial(run_seconds, steps, particles)
    estimates = {"eager": run_s(EAGER_STEP_S), "compiled": base + run_s(COMPILED_STEP_S)}
    for k in FUSE_CHOICES:
        if steps >= 4 * k:
            estimates[f"fused {k}"] = 2 * base + per_extra * (k - 1) + run_s(FUSED_STEP_S)
    best = min(estimates, key=estimates.__getitem__)
    fuse = int(best.split()[1]) if best.startswith("fused") else 1
    return Compilation(best != "eager", fuse, estimates)
