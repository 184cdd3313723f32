"""The public pure step: ``step``, ``step_with_info`` and the prepared ``jit_step``.

    X_{n+1}, Xtilde_{n+1} = the solver's step and its exact sensitivity
    theta_{n+1}           = theta_n - alpha(t_n) h G_n,   G_n = (1/N) sum_i (c_x Xtilde_n^i + c_theta)
    t_{n+1}               = t_n + h

A call is split by what it depends on. What depends only on the structure of the inputs (the
problem, the pytree of the state, every leaf's shape, dtype and device, dt for a compiled step)
is checked once per such key and the derivative plan is decided then (``JitStep.prepare``); what
depends on values is checked on every call, and cheaply: dt, the learning rate alpha(t_n), leaves
that require grad. A repeated call of the compiled step is then one dictionary look-up and one
call of the compiled kernel on the flat leaves; an eager one is the maths and nothing more.

``jit_step(sde, ...)`` is that prepared object; ``step(..., compile=True)`` uses the same one, so
the two are the same thing (``jit_step`` returns one object per problem and options).

Under the user's ``vmap``, ``vmap(lambda s, w: fwdtrain.step(sde, s, w, dt, lr, compile=True))(states, dws)``
reaches the step with tensors that carry a hidden run axis: that axis is taken out of every input (moved to the
front, or broadcast for an input that the runs share), the runs' step ``vmap(advance)`` runs as one compiled
kernel on the stacked runs, and its outputs go back to ``vmap`` with the run axis in front (``JitStep.batched``).
Each run is checked as ``step`` checks one (the first run, once per key; the learning rates of all runs on every
call). Nested transforms (``vmap`` inside ``grad``, two ``vmap``s) run the eager step instead.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import torch
from torch.func import vmap

from .. import _compat
from ..compile import cache
from ..compile.kernels import Kernel, function_kernel
from ..compile.options import Compile, as_compile
from ..core import _checks
from ..core._tree import flatten, tree_map, unflatten
from ..core._tree import leaves as leaves_of
from ..core.problem import SDE
from ..core.sensitivity import MODES, Mode, Plan
from ..core.solvers import Solver, as_solver
from ..core.state import State
from ..core.step import LearningRate, StepInfo, learning_rate
from ..optim import GradientTransformation, check_optimizer
from .cost import CostForm, check_fit, check_solver, check_step_inputs, explain_failure

Flat = list[torch.Tensor]


class _Compiled(NamedTuple):
    """A compiled step for one key: the kernel, and its loaded runner on flat leaves (None: call the kernel)."""

    kernel: Kernel
    run: Callable[[Flat], Flat] | None


def _dt_key(dt: Any) -> float | None:
    """dt as the float a compiled step is keyed by (a bad dt is keyed too: its first call raises in ``prepare``);
    None for what is not a number or a 0-d floating tensor."""
    if isinstance(dt, (float, int)) and not isinstance(dt, bool):
        return float(dt)
    if isinstance(dt, torch.Tensor) and dt.ndim == 0 and dt.is_floating_point():
        return float(dt)
    return None


class JitStep:
    """``fast(state, dw, dt, lr) -> State``: ``fwdtrain.step`` of one problem and options, prepared.

    Made by ``fwdtrain.jit_step``. Structure checks and the derivative plan are done once per key (the
    state's pytree, each leaf's shape, dtype, device and, compiled, its strides, and dt); value checks on
    every call; the compiled kernel is built (or loaded from disk) on a key's first call. ``preparations``
    counts the keys prepared, for tests that count events.

    Under the user's ``torch.func`` transforms the step runs eagerly (``grad``, ``jacfwd``: a compiled kernel
    has no derivative), except under ``vmap`` alone, where a compiled step runs one batched kernel over the
    vmapped axis.
    """

    def __init__(self, problem: CostForm, mode: Mode, options: Compile) -> None:
        self.problem, self.mode, self.options = problem, mode, options
        self.compiled = options.enabled is True
        self.preparations = 0
        self._plans: dict[Hashable, Plan] = {}
        self._kernels: dict[Hashable, _Compiled] = {}
        self.batched_kernels: dict[Hashable, Any] = {}  # the kernels of ``batched``

    @property
    def sde(self) -> SDE:
        return self.problem.sde

    def __repr__(self) -> str:
        options = f"solver={self.problem.solver!r}, optimizer={self.problem.optimizer!r}, mode={self.mode!r}"
        return f"jit_step({type(self.sde).__name__}, {options}, compile={self.options})"

    def __call__(self, state: State, dw: torch.Tensor, dt: Any, lr: LearningRate) -> State:
        return self.with_info(state, dw, dt, lr)[0]

    def with_info(self, state: State, dw: torch.Tensor, dt: Any, lr: LearningRate) -> tuple[State, StepInfo]:
        """``(state_{n+1}, StepInfo(cost_n, G_n))``, as ``fwdtrain.step_with_info``."""
        if not (_compat.transforms_active() or _compat.tracing()):
            if self.compiled:
                return self._compiled_step(state, dw, dt, lr)
            return self.eager(state, dw, dt, lr)
        if self.compiled and _compat.top_transform_is_vmap():
            return self.batched(state, dw, dt, lr)
        return self.eager(state, dw, dt, lr)

    # ---- once per key ----
    def prepare(self, state: State, dw: torch.Tensor, dt: Any, lr: LearningRate) -> Plan:
        """Every check of ``step`` (structure and values), and the derivative plan for inputs shaped like these."""
        self.preparations += 1
        sde, problem = self.sde, self.problem
        check_step_inputs(sde, state, dw, dt, lr, problem.optimizer)
        check_fit(sde, state)
        _checks.check_alpha(learning_rate(lr, state.t), state.t, lr)
        try:
            check_solver(problem.solver, sde, state.theta, state.x[0])
            return problem.plan(state, self.mode)
        except Exception as error:
            explain_failure(sde, state, error)
            raise

    def _per_call(self, state: State, dw: Any, dt: Any, lr: LearningRate, leaves: list[Any]) -> Any:
        """The value checks of every call: leaves that require grad, dt; returns alpha(t_n), checked."""
        if any(leaf.requires_grad for leaf in leaves) and all(_checks.is_concrete(leaf) for leaf in leaves):
            check_step_inputs(self.sde, state, dw, dt, lr, self.problem.optimizer)  # raises with the message
        _checks.check_lr(lr)  # a number: finite and >= 0; a schedule: its value alpha(t_n), below
        alpha = learning_rate(lr, state.t)
        if callable(lr):
            _checks.check_alpha(alpha, state.t, lr)
        return alpha

    # ---- eager ----
    def eager(self, state: State, dw: Any, dt: Any, lr: LearningRate) -> tuple[State, StepInfo]:
        """The eager step, its key's checks and plan prepared once (also inside the user's transforms)."""
        leaves, spec = flatten((state, dw))
        if not all(isinstance(leaf, torch.Tensor) for leaf in leaves):
            self.prepare(state, dw, dt, lr)  # raises for the leaf that is not a tensor
        key = (spec, tuple((leaf.shape, leaf.dtype, leaf.device) for leaf in leaves))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self.prepare(state, dw, dt, lr)
        else:
            _checks.check_dt(dt)
        alpha = self._per_call(state, dw, dt, lr, leaves)
        try:
            return self.problem.advance(state, dw, dt, alpha, plan)
        except Exception as error:
            explain_failure(self.sde, state, error)
            raise

    # ---- compiled ----
    def _compiled_step(self, state: State, dw: Any, dt: Any, lr: LearningRate) -> tuple[State, StepInfo]:
        leaves, spec = flatten((state, dw))
        dt_key = _dt_key(dt)
        if dt_key is None or not all(isinstance(leaf, torch.Tensor) for leaf in leaves):
            self.prepare(state, dw, dt, lr)  # raises for a bad dt or a leaf that is not a tensor
            raise TypeError(f"dt must be a positive number, got {type(dt).__name__}")
        key = (spec, dt_key, tuple((leaf.shape, leaf.stride(), leaf.dtype, leaf.device) for leaf in leaves))
        compiled = self._kernels.get(key)
        if compiled is None:
            return self._first_compiled_call(state, dw, dt_key, lr, key)
        alpha = self._per_call(state, dw, dt, lr, leaves)
        if not (isinstance(alpha, torch.Tensor) and alpha.dtype == torch.float64 and alpha.device == state.t.device):
            alpha = torch.tensor(float(alpha), dtype=torch.float64, device=state.t.device)
        if compiled.run is None:
            return compiled.kernel(state, dw, alpha)
        leaves.append(alpha)
        return unflatten(compiled.kernel.out_spec, compiled.run(leaves))

    def _first_compiled_call(
        self, state: State, dw: Any, dt: float, lr: LearningRate, key: Hashable
    ) -> tuple[State, StepInfo]:
        plan = self.prepare(state, dw, dt, lr)
        problem = self.problem
        alpha = torch.as_tensor(learning_rate(lr, state.t), dtype=torch.float64, device=state.t.device)
        try:
            kernel = function_kernel(
                lambda s, d, a: problem.advance(s, d, dt, a, plan),
                (state, dw, alpha),
                key=(problem, plan, dt, "advance"),
                options=self.options,
                what="the step",
            )
            out = kernel(state, dw, alpha)
        except Exception as error:
            explain_failure(self.sde, state, error)
            raise
        self._kernels[key] = _Compiled(kernel, kernel.flat_runner(leaves_of((state, dw, alpha))))
        return out

    # ---- compiled, under the user's vmap ----
    def batched(self, state: State, dw: Any, dt: Any, lr: LearningRate) -> tuple[State, StepInfo]:
        """``with_info`` of every run of the innermost ``vmap`` in one compiled kernel (see the module docstring)."""
        level = _compat.vmap_level()
        alpha = learning_rate(lr, state.t)
        if not isinstance(alpha, torch.Tensor):
            alpha = torch.as_tensor(alpha, dtype=torch.float64)
        leaves, spec = flatten((state, dw, alpha))
        if not all(isinstance(leaf, torch.Tensor) for leaf in leaves):
            return self.eager(state, dw, dt, lr)
        unwrapped = [_compat.unwrap_batched(leaf, level) for leaf in leaves]
        runs = next((tensor.shape[dim] for tensor, dim in unwrapped if dim is not None), None)
        if runs is None or any(_compat.is_wrapped(tensor) for tensor, _ in unwrapped) or _compat.tracing():
            return self.eager(state, dw, dt, lr)
        stacked = [_runs_first(tensor, dim, runs) for tensor, dim in unwrapped]
        state_1, dw_1, _ = unflatten(spec, [tensor[0] for tensor in stacked])
        key = (spec, float(dt), runs, tuple((t.shape, t.dtype, t.device) for t in stacked))
        with _compat.outside_transforms():  # plain tensors from here: the kernel is built and called outside vmap
            kernel = self.batched_kernels.get(key)
            if kernel is None:
                plan = self.prepare(state_1, dw_1, dt, lr)
                kernel = self.batched_kernels[key] = _batched_kernel(self, plan, float(dt), unflatten(spec, stacked))
            alphas = stacked[-1]
            good = _checks.good_rates(alphas)
            if not bool(good.all()):
                _checks.check_alpha(alphas[int((~good).nonzero()[0])], state_1.t, lr)  # raises with that run's message
            states, dws, _ = unflatten(spec, stacked)
            out = kernel(states, dws, alphas.to(torch.float64))
        return tree_map(lambda tensor: _compat.add_batch_dim(tensor, 0, level), out)


def _batched_kernel(jit: JitStep, plan: Hashable, dt: float, example: tuple) -> Kernel:
    """The compiled ``vmap`` over runs of the one-run step (alpha per run, float64 like the clock)."""
    problem = jit.problem
    states, dws, alphas = example

    def runs_step(s: State, w: torch.Tensor, a: torch.Tensor) -> tuple[State, StepInfo]:
        return vmap(lambda s1, w1, a1: problem.advance(s1, w1, dt, a1, plan))(s, w, a)

    return function_kernel(
        runs_step,
        (states, dws, alphas.to(torch.float64)),
        key=(problem, plan, dt, "advance over runs"),
        options=jit.options,
        what="the step over vmapped runs",
    )


def _runs_first(tensor: torch.Tensor, dim: int | None, runs: int) -> torch.Tensor:
    """The tensor of every run with the run axis in front (an input shared by the runs broadcast), contiguous."""
    if dim is None:
        return tensor.unsqueeze(0).expand(runs, *tensor.shape).contiguous()
    return tensor.movedim(dim, 0).contiguous()


def jit_step(
    sde: SDE,
    *,
    solver: Solver | str | None = None,
    optimizer: GradientTransformation | None = None,
    mode: Mode = "auto",
    compile: bool | Compile = True,
) -> JitStep:
    """``fwdtrain.step`` of ``sde`` prepared once: ``fast = jit_step(sde); state = fast(state, dw, dt, lr)``.

    The same maths, checks and errors as ``step(sde, state, dw, dt, lr, solver=..., optimizer=..., mode=...,
    compile=compile)``; ``fast.with_info(state, dw, dt, lr)`` is ``step_with_info``. One object per problem and
    options (calling ``jit_step`` again returns it), so its kernels and checks are shared with ``step``.

    Args:
        sde: The problem (``SDE`` or ``ControlledSDE``).
        solver: ``Euler()`` (default), ``Heun()``, ``Milstein()`` or a name.
        optimizer: The ``fwdtrain.optim`` rule of ``state.opt_state``; None: plain sgd.
        mode: ``"auto"``, ``"reverse"`` or ``"forward"``.
        compile: Take the steps through a compiled kernel (default: True, AOTInductor); a
            ``fwdtrain.Compile`` chooses the compiler (``Compile(True, compiler="dynamo")``: ``torch.compile``);
            False: eager, with the checks and plans still prepared once per key.

    Returns:
        A ``JitStep``: ``fast(state, dw, dt, lr) -> State``.

    Raises:
        TypeError, ValueError: A problem that is not an SDE, an unknown solver or mode (at once); bad inputs on
            a call, as ``fwdtrain.step``.
    """
    given = (solver, optimizer, mode, compile, type(compile))  # the type: compile=1 is not compile=True
    jitted = cache.prepared_steps(sde) if isinstance(sde, SDE) else {}
    if _hashable(given) and given in jitted:  # a repeated call: no option rebuilt
        return jitted[given]
    if not isinstance(sde, SDE):
        raise TypeError(f"step(sde, ...) expects a fwdtrain.SDE or ControlledSDE, got {type(sde).__name__}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    solver = as_solver(solver)
    check_optimizer(optimizer)
    compiling = as_compile(compile)
    if compiling.enabled == "auto":
        raise ValueError('jit_step(compile="auto") is not a choice for one step: pass True, False or a Compile')
    options = (solver, optimizer, mode, compiling)
    if options not in jitted:
        jitted[options] = JitStep(CostForm(sde, solver, optimizer), mode, compiling)
    if _hashable(given):
        jitted[given] = jitted[options]  # the options as passed, for the look-up of the next call
    return jitted[options]


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def step_with_info(
    sde: SDE,
    state: State,
    dw: torch.Tensor,
    dt: Any,
    lr: LearningRate,
    *,
    solver: Solver | str | None = None,
    optimizer: GradientTransformation | None = None,
    mode: Mode = "auto",
    compile: bool | Compile = False,
) -> tuple[State, StepInfo]:
    """``step``, also returning the step's diagnostics at time n; the arguments are those of ``fwdtrain.step``.

    Returns:
        ``(new_state, StepInfo(cost, gradient))``: cost = (1/N) sum_i c(X_n^i, theta_n), 0-d, and
        gradient = G_n = (1/N) sum_i D c(X_n^i), a pytree like theta, the estimate the update used.

    Raises:
        TypeError, ValueError: As ``fwdtrain.step``.
    """
    fast = jit_step(sde, solver=solver, optimizer=optimizer, mode=mode, compile=compile)
    return fast.with_info(state, dw, dt, lr)


def step(
    sde: SDE,
    state: State,
    dw: torch.Tensor,
    dt: Any,
    lr: LearningRate,
    *,
    solver: Solver | str | None = None,
    optimizer: GradientTransformation | None = None,
    mode: Mode = "auto",
    compile: bool | Compile = False,
) -> State:
    """One pure step of the forward-propagation algorithm: (X, Xtilde, theta, t) at n -> n + 1.

        X_{n+1}, Xtilde_{n+1} = the solver's step and its exact sensitivity
        theta_{n+1}           = theta_n - alpha(t_n) h G_n,   G_n = (1/N) sum_i (c_x Xtilde_n^i + c_theta)
        t_{n+1}               = t_n + h

    every right-hand side at time n (with an update rule: theta_{n+1} = theta_n + s_n of the rule).
    ``step`` is pure and composes with ``torch.func`` (grad, jacrev, jacfwd, vjp, jvp, vmap) in all its
    tensor inputs. Structure is checked once per problem and input shapes (``jit_step``); values (dt, the
    learning rate, leaves that require grad) on every call, and only on concrete tensors.

    Args:
        sde: The problem (``SDE`` or ``ControlledSDE``).
        state: The current ``State``; never modified.
        dw: Brownian increments W_{n+1} - W_n, shape (N, m), variance dt each.
        dt: The step h > 0.
        lr: The learning rate alpha: a number, a 0-d tensor or a schedule t -> alpha(t); alpha(t_n)
            must be one finite number >= 0.
        solver: ``fwdtrain.Euler()`` (default), ``Heun()`` or ``Milstein()`` (or their names).
        optimizer: The ``fwdtrain.optim`` rule whose state is ``state.opt_state`` (from
            ``init(..., optimizer=...)``); None: theta_{n+1} = theta_n - alpha h G_n.
        mode: "reverse" (vjp), "forward" (jacfwd) or "auto" (the one with fewer passes).
        compile: Take the step through a compiled kernel (the first call per problem and shapes traces and
            compiles it, or loads it from disk; later calls are one kernel call). Under the user's ``vmap``
            it runs one batched kernel; under ``grad``/``jacfwd``/... the step runs eagerly.

    Returns:
        The new ``State``; no tensor in it requires grad or has a grad_fn.

    Raises:
        TypeError, ValueError: For inputs the step cannot use (shapes, dtypes, a state of another SDE or
            rule, non-finite or negative learning rates, a noise the solver does not take), before any
            computation.
    """
    return step_with_info(sde, state, dw, dt, lr, solver=solver, optimizer=optimizer, mode=mode, compile=compile)[0]


__all__ = ["JitStep", "jit_step", "step", "step_with_info"]
