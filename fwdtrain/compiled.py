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
the function warns once and runs the same code eagerly from then on. Called inside
the user's ``torch.func`` transform (``grad``, ``jacfwd``, ``vmap``, ...), whose wrapped
tensors dynamo cannot trace from outside, a compiled function runs its eager twin for
that call: the same values and correct derivatives, without the speed-up.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

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


class CompiledOrEager:
    """Call ``torch.compile(fn)``; on the first failure warn and call ``fn`` eagerly for good."""

    def __init__(self, fn: Callable, what: str, backend: str | Callable, options: dict | None,
                 fullgraph: bool = True) -> None:
        from torch._dynamo.exc import RecompileError  # deferred: importing dynamo takes seconds

        self.recompile_error = RecompileError
        self.eager = fn
        self.what = what
        extra = {"options": dict(options)} if options and backend == "inductor" else {}
        self.compiled: Callable | None = torch.compile(fn, fullgraph=fullgraph, dynamic=False, backend=backend, **extra)

    def __call__(self, *args: Any) -> Any:
        if self.compiled is not None and not all(_checks.is_concrete(leaf) for leaf in leaves(args)):
            return self.eager(*args)  # inside the user's torch.func transform: dynamo cannot trace its wrappers
        if self.compiled is not None:
            try:
                return self.compiled(*args)
            except self.recompile_error:
                raise  # asked for by torch._dynamo.config.error_on_recompile: not a compiler failure
            except Exception as error:  # noqa: BLE001 - any compiler failure falls back; eager re-raises user errors
                result = self.eager(*args)
                warnings.warn(
                    f"fwdtrain: torch.compile of {self.what} failed ({type(error).__name__}: "
                    f"{str(error).splitlines()[0] if str(error) else ''}); running it eagerly instead",
                    RuntimeWarning, stacklevel=2,
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


def _advance_of(problem: Any) -> Callable[..., tuple[State, StepInfo]]:
    """The problem's unchecked step ``(state, dw, dt, alpha, mode, reduce)``: ``euler.advance`` for an SDE,
    the ``advance`` method of any other ``fwdtrain.trainable.Trainable`` (a calibration, SGDCT)."""
    return functools.partial(advance, problem) if isinstance(problem, SDE) else problem.advance


def _outside_graph(reduce: GradientReduce | None) -> GradientReduce | None:
    """A gradient hook run eagerly between compiled pieces (it may make collectives or count calls)."""
    return None if reduce is None else torch._dynamo.disable(reduce)


def _as_scalar(alpha: Any, like: torch.Tensor) -> torch.Tensor:
    """alpha as a 0-d tensor like t, so that a new value is new data, not a new graph."""
    return alpha if isinstance(alpha, torch.Tensor) else torch.tensor(alpha, dtype=like.dtype, device=like.device)


def compile_advance(
    sde: Any, dt: float, mode: str, reduce: GradientReduce | None = None, *,
    backend: str | Callable = "inductor", options: dict | None = STEP_OPTIONS,
) -> OneStep:
    """``advance(sde, ., ., dt, ., mode, reduce)`` compiled: ``one_step(state, dw, alpha) -> (State, StepInfo)``.

    The same contract as ``functools.partial(advance, sde, dt=dt, mode=mode, reduce=reduce)``
    with positional (state, dw, alpha); alpha may be a number or a 0-d tensor (numbers
    are turned into tensors, so changing alpha never recompiles). ``mode`` is
    "reverse" or "forward". ``backend`` and ``options`` go to ``torch.compile``
    ("eager" traces with dynamo only: quick, for tests).
    Inputs are not validated here: check them once with ``fwdtrain.stepping.check_step_inputs``.
    """
    _check_mode(mode)
    _checks.check_dt(dt)
    kernel = _advance_of(sde)
    fullgraph, reduce = reduce is None, _outside_graph(reduce)

    def one_step(state: State, dw: torch.Tensor, alpha: torch.Tensor) -> tuple[State, StepInfo]:
        new_state, info = kernel(state, dw, dt, alpha, mode, reduce)
        return canonical_strides(new_state), info

    compiled = CompiledOrEager(one_step, f"one step (mode={mode!r})", backend, options, fullgraph)

    def call(state: State, dw: torch.Tensor, alpha: Any) -> tuple[State, StepInfo]:
        return compiled(state, dw, _as_scalar(alpha, state.t))

    return call


def compile_steps(
    sde: Any, dt: float, lr: LearningRate, mode: str, steps: int, reduce: GradientReduce | None = None,
    *, backend: str | Callable = "inductor", options: dict | None = FUSED_OPTIONS,
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
    2-3x faster per step than the Python wrapper at N = 1).
    """
    _check_mode(mode)
    _checks.check_dt(dt)
    _checks.check_lr(lr)
    steps = _checks.check_count(steps, "steps")
    kernel = _advance_of(sde)
    fullgraph, reduce = reduce is None, _outside_graph(reduce)

    def fused(state: State, noise: torch.Tensor) -> tuple[State, StepInfo]:
        costs, gradients = [], []
        for k in range(steps):
            state, info = kernel(state, noise[k], dt, learning_rate(lr, state.t), mode, reduce)
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
