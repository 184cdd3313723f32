"""A block: K steps of a run as one function, with the learning rates, the checks and the records inside.

Per step k of the block (n = n0 + k + 1 the step count it makes):

    state_n, info_n = advance(state_{n-1}, dW_k, dt, alpha(t_{n-1}))      (a member frozen stays where it is)
    total_n         = total_{n-1} + cost_n                              (float64)

and at the end of each stage (the next step on the ``Checks`` grid or the ``SaveAt`` grid, or the block's
end) the check, x, x_tilde and theta finite (and |.| <= bound), and, on the record grid, the record
``observe(state_n, total_n, info_n)``. A failed check ends the block: the loop keeps the carry of the last
passed check and steps the failed stage from it one step at a time, checking each, to the step that failed
(``Block.step_eagerly``), so an error names its step and keeps the state before it, as if every step were
checked, at the cost of a few reductions per stage. (Where those eager steps pass the whole stage, a compiled
stage blew up where steps that differ from it by rounding do not, as a run at the edge of diverging may: the
run goes on from them.) The learning rates enter as a table, alpha(t_k) of the
block's clocks t_k (``clocks``: rounded as the step's own t + dt), checked before the block runs (a block
stops before the first step whose state's rate is not a finite number >= 0); so one kernel serves every
learning rate and schedule.

The same function runs eagerly (``graphs.run_block``) or compiled into one kernel (``kernels.block_kernel``;
``Block.compiled`` says which, and the loop sets it when the kernel is ready): compiling changes the speed,
never what is computed (to rounding). A gradient
hook (a collective between the two halves of a step) makes the step ``propagate``, the hook, ``update``,
each half compiled on its own where the run compiles; its block runs eagerly between them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import optree
import torch

from ..compile import graphs
from ..compile.kernels import Kernel, block_kernel, function_kernel
from ..compile.options import Compile
from ..core._checks import good_rates
from ..core._tree import tree_map
from ..core.schedules import Schedule
from ..core.state import State
from ..core.step import GradientReduce, StepInfo
from ..optim import Average
from ..problems.trainable import Trainable


class Carry(NamedTuple):
    """What the loop carries from block to block (assigned in one statement, so Ctrl-C never splits it).

    state: the training state at step n; n: the step count since the start of training;
    total: float64 sum of the per-step costs since the start of training; info: the last step's StepInfo.
    """

    state: State
    n: int
    total: torch.Tensor
    info: StepInfo | None


class Stepping(NamedTuple):
    """What every step needs: the problem, dt, the plan, the schedule and the gradient hook (or None)."""

    problem: Trainable
    dt: float
    plan: Any
    schedule: Schedule
    reduce: GradientReduce | None


class Outcome(NamedTuple):
    """A block's result: the ``carry`` after the steps known good, to its last passed check, the ``records`` of its
    steps on the record grid (a dict of stacked leaves, or None), ``bad_rate``: the step whose state's learning
    rate is not a finite number >= 0, where the block stopped before it (None: none), and ``stage_end``: where a
    check after ``carry`` failed, the step it checked, the end of the stage after ``carry`` (None: none failed)."""

    carry: Carry
    records: dict[str, Any] | None
    bad_rate: int | None = None
    stage_end: int | None = None


def clocks(t: torch.Tensor, dt: float, count: int) -> torch.Tensor:
    """t_k = t + dt + ... + dt for k < count, rounded as the step's own ``t + dt`` rounds in t's dtype (numpy
    scalars of that dtype add alike): (count, *t.shape)."""
    kind = {torch.float64: np.float64, torch.float32: np.float32}.get(t.dtype)
    if kind is None:  # another dtype: the tensor arithmetic itself
        rows = [t]
        for _ in range(count - 1):
            rows.append(rows[-1] + dt)
        return torch.stack(rows)
    clock = t.detach().cpu().numpy().astype(kind).reshape(1, -1)
    increments = np.concatenate([clock, np.full((count - 1, clock.shape[1]), dt, dtype=kind)])
    values = np.add.accumulate(increments, axis=0)  # sequential: row k is row k-1 + dt, rounded in ``kind``
    return torch.from_numpy(values).to(t.device).reshape((count, *t.shape))


def rates(schedule: Schedule, t: torch.Tensor, dt: float, count: int) -> torch.Tensor:
    """alpha(t_k) for the count + 1 clocks of ``count`` steps from t (a schedule that takes one clock at a time is
    asked once per clock): (count + 1, *t.shape), in the dtype the schedule gives."""
    times = clocks(t, dt, count + 1)
    try:
        alphas = torch.as_tensor(schedule(times))
        return alphas.broadcast_to(times.shape) if alphas.shape != times.shape else alphas
    except (RuntimeError, TypeError, ValueError):
        return torch.stack([torch.as_tensor(schedule(clock)).broadcast_to(t.shape) for clock in times])


def zero_info(state: State) -> StepInfo:
    """A StepInfo of zeros shaped like every problem's (``Trainable.propagate``): a cost of the clock's shape
    (0-d, or (E,) per member) and x's dtype, a gradient like theta. The block's carry before a run's first step."""
    return StepInfo(
        torch.zeros(state.t.shape, dtype=state.x.dtype, device=state.x.device), tree_map(torch.zeros_like, state.theta)
    )


class Block:
    """The steps of one run as blocks: ``block(carry, dw, start, count, alive) -> Outcome``, eager or compiled.

    ``dw``: a block of drawn increments (at most ``chunk`` rows), of which rows start .. start + count - 1 are
    stepped; ``alive``: (E,) bool for the members still running (a 0-d True without members); ``every``: the
    record grid; ``bound``: the check's bound; ``record``: what a record stores of the state.
    """

    def __init__(
        self,
        stepping: Stepping,
        carry: Carry,
        *,
        bound: float | None,
        record: Callable[[State], Any],
        members: bool,
        chunk: int,
        every: int,
        check_every: int,
        options: Compile,
    ) -> None:
        s, state = stepping, carry.state
        self.stepping, self.chunk, self.options = stepping, chunk, options
        self.every, self.check_every = every, check_every
        template = (state, torch.zeros(state.t.shape, dtype=torch.float64, device=state.x.device), zero_info(state))
        carry_leaves, spec = optree.tree_flatten(template)  # type: ignore[arg-type,var-annotated]
        size = self.size = len(carry_leaves)
        # with a gradient hook the step's two halves are compiled apart (compile=True), the block eager between them
        self.compiled = options.enabled is True and s.reduce is not None
        advance = self._advance(options if self.compiled else None, template)

        def tree_body(carry: tuple, dw: Any, alpha: Any, alive: Any) -> tuple:
            current, total, _ = carry
            new, info = advance(current, dw, alpha)
            if members:  # a frozen member keeps its state and total
                return s.problem.freeze(current, new, alive), torch.where(alive, total + info.cost, total), info
            return new, total + info.cost, info

        def flat_body(fn: Callable[..., tuple]) -> Callable[..., tuple[torch.Tensor, ...]]:
            def body(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
                out = fn(optree.tree_unflatten(spec, list(flat[:size])), *flat[size:])
                return tuple(optree.tree_leaves(out))  # type: ignore[arg-type]

            return body

        def check(*flat: torch.Tensor) -> torch.Tensor:
            """0-d bool: x, x_tilde and theta finite (and within the bound) for every member still running."""
            state: Any = optree.tree_unflatten(spec, list(flat[:size]))[0]
            flags = s.problem.within(state, bound)
            return (flags | ~flat[size]).all() if members else flags.all()

        def observe(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
            seen = _observed(s.problem, optree.tree_unflatten(spec, list(flat)), record)  # type: ignore[arg-type]
            return tuple(optree.tree_leaves(seen))  # type: ignore[arg-type]

        self.body, self.check, self.observe, self.spec = flat_body(tree_body), check, observe, spec
        seen, self.seen_spec = optree.tree_flatten(_observed(s.problem, template, record))  # type: ignore[arg-type,var-annotated]
        self.seen = graphs.Packing.of(tuple(seen))
        self.capacity = chunk // every + 2
        self.kernel: Kernel | None = None

        def kernel() -> Kernel:
            alive = torch.ones(state.t.shape if members else (), dtype=torch.bool, device=state.x.device)
            dw = torch.zeros((chunk, *s.problem.noise_shape(state)), dtype=state.x.dtype, device=state.x.device)
            blocks = self._blocks(dw, 0, 0, rates(s.schedule, state.t, s.dt, 0))
            grids = [torch.tensor(v, dtype=torch.int64) for v in (chunk, 0, 0, every, check_every)]
            return block_kernel(
                self.body,
                check,
                observe,
                self.capacity,
                (*grids, alive, blocks, tuple(carry_leaves)),
                key=(s.problem, s.plan, s.dt, bound, _by_value(record), members, every),
                options=options,
                part=tree_body,
                wrap=flat_body,
            )

        self._kernel = kernel

    def build_kernel(self) -> Kernel:
        """The block's kernel (``kernels.block_kernel``: traced, its package not yet loaded or compiled), built once;
        the block steps through it once ``compiled`` is set. Not for a step with a gradient hook."""
        if self.kernel is None:
            self.kernel = self._kernel()
        return self.kernel

    def _advance(self, options: Compile | None, template: tuple) -> Callable[..., tuple[State, StepInfo]]:
        """The step: ``advance``; with a gradient hook its two halves around the hook, compiled apart when
        ``options`` are given (the hook's collective cannot be in a kernel)."""
        s = self.stepping
        if s.reduce is None:
            return lambda state, dw, alpha: s.problem.advance(state, dw, s.dt, alpha, s.plan)
        reduce = s.reduce
        propagate: Callable[..., Any] = lambda st, d: s.problem.propagate(st, d, s.dt, s.plan)
        update: Callable[..., Any] = lambda m, g, a: s.problem.update(m, g, a, s.dt)
        if options is not None:
            state = template[0]
            alpha = torch.as_tensor(s.schedule(state.t))
            dw = torch.zeros(s.problem.noise_shape(state), dtype=state.x.dtype, device=state.x.device)
            key = (s.problem, s.plan, s.dt)
            propagate = function_kernel(
                propagate, (state, dw), key=(*key, "propagate"), options=options, what="the step's first half"
            )
            update = function_kernel(
                update,
                (state, template[2].gradient, alpha),
                key=(*key, "update"),
                options=options,
                what="the parameter update",
            )

        def advance(state: State, dw: torch.Tensor, alpha: torch.Tensor) -> tuple[State, StepInfo]:
            moved, info = propagate(state, dw)
            gradient = reduce(info.gradient)
            return update(moved, gradient, alpha), StepInfo(info.cost, gradient)

        return advance

    def _blocks(self, dw: torch.Tensor, start: int, count: int, alphas: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(dw, alpha) of ``chunk`` rows each: rows start .. start + count - 1 those of the steps."""
        if dw.shape[0] != self.chunk:
            dw = torch.cat([dw, dw.new_zeros((self.chunk - dw.shape[0], *dw.shape[1:]))])
        table = alphas.new_zeros((self.chunk, *alphas.shape[1:]))
        table[start : start + count] = alphas[:count]
        return dw, table

    def step_eagerly(self, carry: Carry, dw: torch.Tensor, alive: torch.Tensor) -> tuple[Carry, bool]:
        """One step from ``carry`` with the increments ``dw`` (one row), eagerly, and its check: (the carry after
        it, ok)."""
        s = self.stepping
        alpha = rates(s.schedule, carry.state.t, s.dt, 0)[0]
        out = self.body(*self._flat(carry), dw, alpha, alive)
        unpacked: Any = optree.tree_unflatten(self.spec, list(out))
        state, total, info = unpacked
        return Carry(state, carry.n + 1, total, info), bool(self.check(*out, alive))

    def _flat(self, carry: Carry) -> list[torch.Tensor]:
        info = carry.info if carry.info is not None else zero_info(carry.state)
        return optree.tree_leaves((carry.state, carry.total, info))  # type: ignore[arg-type]

    def __call__(self, carry: Carry, dw: torch.Tensor, start: int, count: int, alive: torch.Tensor) -> Outcome:
        s = self.stepping
        alphas = rates(s.schedule, carry.state.t, s.dt, count)
        bad = (~good_rates(alphas[1:])).nonzero()
        bad_rate = carry.n + int(bad[0]) + 1 if len(bad) else None  # the first step whose state has a bad rate
        count = count if bad_rate is None else bad_rate - carry.n - 1
        blocks, flat = self._blocks(dw, start, count, alphas), tuple(self._flat(carry))
        at = graphs.Grids(count, start, carry.n, self.every, self.check_every)
        if self.kernel is not None and self.compiled:
            out = self.kernel(*[torch.tensor(v) for v in at], alive, blocks, flat)
        else:
            out = graphs.run_block(self.body, self.check, self.observe, self.capacity, at, blocks, alive, flat)
        done, rows = int(out.done), int(out.rows)
        unpacked: Any = optree.tree_unflatten(self.spec, list(out.carry))
        state, total, info = unpacked
        records: Any = None
        if rows:
            own = torch.contiguous_format  # its own memory, strides of its own shape (a size-1 axis too)
            leaves = [leaf[:rows].clone(memory_format=own) for leaf in self.seen.unpack(tuple(out.tables))]
            records = optree.tree_unflatten(self.seen_spec, leaves)
        stage_end = None if bool(out.ok) else carry.n + int(at.stop(done))
        return Outcome(Carry(state, carry.n + done, total, info), records, bad_rate, stage_end)


def _by_value(fn: Callable[..., Any]) -> Any:
    """``fn`` as a key: a bound method as (its function, its object), equal for equal objects (a bound method
    compares its object by identity, and each ``run`` binds a problem's ``record`` anew)."""
    return (fn.__func__, fn.__self__) if hasattr(fn, "__self__") and hasattr(fn, "__func__") else fn


def _observed(problem: Trainable, carry: tuple, record: Callable[[State], Any]) -> dict[str, Any]:
    """What a record reads of the block's carry (state, cost total, StepInfo): the clock, the total, the gradient's
    norm, the record and, when the state carries one, the average of theta."""
    state, total, info = carry
    seen = {"t": state.t, "total": total, "grad_norm": problem.gradient_norm(info.gradient), "record": record(state)}
    if isinstance(state.average, Average):
        seen["theta_average"] = state.average.mean
    return seen


__all__ = ["Block", "Carry", "Outcome", "Stepping", "clocks", "rates", "zero_info"]
