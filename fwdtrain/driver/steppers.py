"""How the loop's steps are computed: the one place where a run chooses eager or compiled steps.

A stepper takes ``count`` steps from a noise block, ``steps(carry, block, start, count) -> carry``,
where ``Carry(state, n, total, info)`` is what the loop carries (``total``: the float64 sum of the
per-step costs since the start of training, ``info``: the last step's ``StepInfo``):

- ``Eager``: one ``Trainable.advance`` per step, alpha(t_n) from the schedule at each step.
- ``Compiled``: every run of steps between two events in one call of a compiled loop
  (``fwdtrain.compile.kernels.loop_kernel``), with the block's learning rates computed beforehand.
- ``Split``: for a gradient hook (an all-reduce across processes), the two halves of each step
  compiled (``Trainable.propagate`` and ``Trainable.update``) with the hook run eagerly between them.
- ``Auto``: ``compile="auto"``: the first step eagerly and counted, then the route ``compile.route.choose``
  states (a rule of the counted step, the steps and whether its kernel is on disk; no stopwatch).

Every stepper computes what the eager one does, to rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from ..compile import route
from ..compile.kernels import FunctionKernel, LoopKernel, ObservedKernel, function_kernel, loop_kernel, observed_kernel
from ..compile.options import Compile
from ..core._tree import tree_map
from ..core.schedules import Schedule
from ..core.state import State
from ..core.step import GradientReduce, StepInfo
from ..problems.trainable import Trainable


class Carry(NamedTuple):
    """What the loop carries from step to step (assigned in one statement, so Ctrl-C never splits it).

    state: the training state at step n; n: the step count since the start of training;
    total: float64 sum of the per-step costs since the start of training; info: the last step's StepInfo.
    """

    state: State
    n: int
    total: torch.Tensor
    info: StepInfo | None


class Stepping(NamedTuple):
    """What every stepper needs: the problem, dt, the plan, the schedule and the gradient hook (or None)."""

    problem: Trainable
    dt: float
    plan: Any
    schedule: Schedule
    reduce: GradientReduce | None


Setter = Callable[[Carry], None]  # the loop's ``carry`` assignment, called after every eager step


def good_rates(alphas: Any, rows: int) -> torch.Tensor:
    """(rows,) bool: each row of learning rates (a member's each, with members) a finite number >= 0."""
    alphas = torch.as_tensor(alphas).reshape(rows, -1)
    return (torch.isfinite(alphas) & (alphas >= 0)).all(1)


class Eager:
    """One eager ``advance`` per step; the loop's carry is set after every step (Ctrl-C keeps whole steps).

    A step n whose state's learning rate alpha(t_n) is not a finite number >= 0 fails: the steps stop at n - 1.
    """

    route = "eager"

    def __init__(self, stepping: Stepping) -> None:
        self.s = stepping

    def steps(
        self, carry: Carry, block: torch.Tensor, start: int, count: int, set_carry: Setter
    ) -> tuple[Carry, int | None]:
        s = self.s
        alpha = s.schedule(carry.state.t)
        for i in range(start, start + count):
            new, info = s.problem.advance(carry.state, block[i], s.dt, alpha, s.plan, s.reduce)
            alpha = s.schedule(new.t)
            if not bool(good_rates(alpha, 1)):
                return carry, carry.n + 1
            carry = Carry(new, carry.n + 1, carry.total + info.cost, info)
            set_carry(carry)
        return carry, None


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


class Rates(NamedTuple):
    """A block's learning rates from row ``start``: ``alphas`` (length, *t.shape) alpha(t_k) for its steps (zeros
    before ``start`` and past the drawn rows), ``good`` (length,) whether the state each step makes has a good
    rate (alpha(t_{k+1}) a finite number >= 0), ``times`` (count + 1, *t.shape) the clocks t_k from ``start``."""

    alphas: torch.Tensor
    good: torch.Tensor
    times: torch.Tensor


def block_rates(schedule: Schedule, t: torch.Tensor, dt: float, start: int, count: int, length: int) -> Rates:
    """The ``Rates`` of the steps start .. start + count - 1 of a block of ``length``, t_k as the step accumulates
    it (``clocks``); alpha in the dtype the schedule gives at t. The schedule is asked at t_{start + count}, the
    clock of the block's last state, and never past it."""
    times = clocks(t, dt, count + 1)
    try:
        alphas = torch.as_tensor(schedule(times))
        alphas = alphas.broadcast_to(times.shape) if alphas.shape != times.shape else alphas
    except (RuntimeError, TypeError, ValueError):  # a schedule that takes one clock at a time
        alphas = torch.stack([torch.as_tensor(schedule(clock)).broadcast_to(t.shape) for clock in times])
    out = torch.zeros((length, *t.shape), dtype=alphas.dtype, device=t.device)
    out[start : start + count] = alphas[:count]
    good = torch.ones(length, dtype=torch.bool, device=t.device)
    good[start : start + count] = good_rates(alphas[1:], count)
    return Rates(out, good, times)


class Compiled:
    """Every run of steps between two events in one call of the compiled loop of ``advance``.

    The loop hands it the block as drawn; the kernel takes blocks of ``length`` rows (a shorter last block is
    padded with zeros). A block's padding and its learning rates are made at its first call and reused by its
    later calls while the clock is where those rates assumed (a member frozen at a check, its clock set back,
    gets them anew); the schedule is never asked for a step past the block's drawn rows.
    """

    def __init__(
        self, stepping: Stepping, kernel: LoopKernel, length: int, options: Compile, example: torch.Tensor
    ) -> None:
        self.s, self.kernel, self.length, self.options = stepping, kernel, length, options
        self.example = example  # a noise block of the kernel's length (its shape and dtype)
        self._block: tuple[torch.Tensor, int, torch.Tensor, Rates] | None = None

    @property
    def route(self) -> str:
        return self.kernel.route

    def inputs(self, t: torch.Tensor, block: torch.Tensor, start: int) -> tuple[torch.Tensor, Rates]:
        """(``block`` padded to ``length`` rows, the ``Rates`` of its steps from ``start`` on)."""
        cached = self._block  # (block, first start, padded block, rates)
        if cached is not None and cached[0] is block:
            if cached[1] <= start and torch.equal(cached[3].times[start - cached[1]], t):
                return cached[2], cached[3]
            padded = cached[2]
        else:
            padded = padded_block(block, self.length)
        rates = block_rates(self.s.schedule, t, self.s.dt, start, block.shape[0] - start, self.length)
        self._block = (block, start, padded, rates)
        return padded, rates

    def steps(
        self, carry: Carry, block: torch.Tensor, start: int, count: int, set_carry: Setter
    ) -> tuple[Carry, int | None]:
        padded, rates = self.inputs(carry.state.t, block, start)
        bad = (~rates.good[start : start + count]).nonzero()
        failing = None
        if len(bad):  # the step of row start + j makes a state with a bad rate: stop before it
            count = int(bad[0])
            failing = carry.n + count + 1
        if count:
            info = carry.info if carry.info is not None else zero_info(carry.state)
            state, total, info = self.kernel(count, start, (padded, rates.alphas), (carry.state, carry.total, info))
            carry = Carry(state, carry.n + count, total, info)
            set_carry(carry)
        return carry, failing

    def observer(self, observe: Callable[[Any], Any], rows: int, key: Any, carry: Carry) -> ObservedKernel:
        """The compiled loop of this stepper's step with ``observe(carry)`` taken at up to ``rows`` stops
        (``kernels.ObservedKernel``; ``key`` names what ``observe`` depends on)."""
        s = self.s
        template = (carry.state, carry.total, carry.info if carry.info is not None else zero_info(carry.state))
        padded = torch.zeros_like(self.example)
        rates = torch.as_tensor(s.schedule(carry.state.t)).broadcast_to(carry.state.t.shape)
        inputs = (padded, rates.expand((self.length, *carry.state.t.shape)).clone())
        return observed_kernel(
            self.kernel.step, observe, rows, template, inputs, key=(s.problem, s.plan, s.dt, key), options=self.options
        )

    def observed_steps(
        self, kernel: ObservedKernel, carry: Carry, block: torch.Tensor, stops: list[int]
    ) -> tuple[Carry, Any] | None:
        """The steps of ``block`` up to each of ``stops`` (step counts from the block's first row, the last one the
        block's length) in one call of ``kernel``: (the carry at the last stop, the stacked observations); None
        where the kernel cannot run or a state of the block has a bad learning rate (the caller steps as usual).
        The carry is not set: the caller does, once the observations pass its checks."""
        padded, rates = self.inputs(carry.state.t, block, 0)
        if not bool(rates.good.all()):
            return None
        info = carry.info if carry.info is not None else zero_info(carry.state)
        out = kernel.observe_call(stops, 0, (padded, rates.alphas), (carry.state, carry.total, info))
        if out is None:
            return None
        (state, total, info), seen = out
        return Carry(state, carry.n + stops[-1], total, info), seen


def padded_block(block: torch.Tensor, length: int) -> torch.Tensor:
    """``block`` with zero rows appended up to ``length`` rows (a compiled loop takes blocks of one shape)."""
    if block.shape[0] == length:
        return block
    return torch.cat([block, block.new_zeros((length - block.shape[0], *block.shape[1:]))])


class Split:
    """The two halves of each step compiled, the gradient hook eagerly between them."""

    def __init__(self, stepping: Stepping, propagate: FunctionKernel, update: FunctionKernel) -> None:
        self.s, self.propagate, self.update = stepping, propagate, update
        self.route = (propagate.package is not None and "aot") or "dynamo"

    def steps(
        self, carry: Carry, block: torch.Tensor, start: int, count: int, set_carry: Setter
    ) -> tuple[Carry, int | None]:
        s = self.s
        alpha = torch.as_tensor(s.schedule(carry.state.t))
        for i in range(start, start + count):
            moved, info = self.propagate(carry.state, block[i])
            gradient = s.reduce(info.gradient) if s.reduce is not None else info.gradient
            new = self.update(moved, gradient, alpha)
            alpha = torch.as_tensor(s.schedule(new.t))
            if not bool(good_rates(alpha, 1)):
                return carry, carry.n + 1
            carry = Carry(new, carry.n + 1, carry.total + info.cost, StepInfo(info.cost, gradient))
            set_carry(carry)
        return carry, None


def zero_info(state: State) -> StepInfo:
    """A StepInfo of zeros shaped like every problem's (``Trainable.propagate``): a cost of the clock's shape
    (0-d, or (E,) per member) and x's dtype, a gradient like theta. The compiled loop's carry before its first step."""
    return StepInfo(
        torch.zeros(state.t.shape, dtype=state.x.dtype, device=state.x.device), tree_map(torch.zeros_like, state.theta)
    )


def _template(s: Stepping, state: State, block: torch.Tensor) -> tuple[Any, Any]:
    """(carry, inputs) examples for the compiled loop: the state, a float64 total, a zero StepInfo; a block and
    its rates."""
    t = state.t
    alphas = torch.as_tensor(s.schedule(t)).broadcast_to(t.shape).expand((block.shape[0], *t.shape)).clone()
    total = torch.zeros(t.shape, dtype=torch.float64, device=t.device)
    return (state, total, zero_info(state)), (block, alphas)


def compiled(stepping: Stepping, state: State, block: torch.Tensor, options: Compile) -> Compiled | Split:
    """The compiled stepper for this problem, state and block shape (kernels reused from this process's cache)."""
    s = stepping
    key = (s.problem, s.plan, s.dt)
    if s.reduce is not None:
        alpha = torch.as_tensor(s.schedule(state.t))
        propagate = function_kernel(
            lambda st, d: s.problem.propagate(st, d, s.dt, s.plan),
            (state, block[0]),
            key=(*key, "propagate"),
            options=options,
            what="the step's first half",
        )
        update = function_kernel(
            lambda m, g, a: s.problem.update(m, g, a, s.dt),
            (state, zero_info(state).gradient, alpha),
            key=(*key, "update"),
            options=options,
            what="the parameter update",
        )
        return Split(s, propagate, update)

    def step(
        carry: tuple[State, torch.Tensor, StepInfo], inputs: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[State, torch.Tensor, StepInfo]:
        current, total, _ = carry
        dw, alpha = inputs
        new, info = s.problem.advance(current, dw, s.dt, alpha, s.plan)
        return new, total + info.cost, info

    carry, inputs = _template(s, state, block)
    kernel = loop_kernel(step, carry, inputs, key=(*key, "loop"), options=options, what="the step")
    return Compiled(s, kernel, block.shape[0], options, block)


def signature_key(stepping: Stepping, options: Compile) -> str:
    """What a compiled kernel of the step depends on besides the counted step's calls and shapes (``route``)."""
    return f"{float(stepping.dt)!r}|{options.unroll}|{options.route}|{stepping.reduce is not None}"


def counted_step(stepping: Stepping, state: State, dw: torch.Tensor, options: Compile) -> tuple[Any, route.StepCost]:
    """One eager ``advance`` from ``state`` with ``dw``, counted (``route.count_step``): ((state, info), its cost)."""
    s = stepping
    return route.count_step(
        lambda: s.problem.advance(state, dw, s.dt, s.schedule(state.t), s.plan, s.reduce),
        key=signature_key(stepping, options),
    )


class Auto:
    """``compile="auto"``: the route the rule chooses (``route.choose``), passed through ``agree`` (a group takes
    rank 0's), from the step's ``route.StepCost``: the one a continued run's history carries, else the run's first
    step taken eagerly and counted (``route.count_step``)."""

    def __init__(
        self,
        stepping: Stepping,
        options: Compile,
        end: int,
        taken: int,
        agree: Callable[[bool], bool],
        example: torch.Tensor,
        cost: route.StepCost | None = None,
    ) -> None:
        self.s, self.options, self.end, self.taken, self.agree = stepping, options, end, taken, agree
        self.example = example  # a block of the compiled loop's length
        self.chosen: Eager | Compiled | Split | None = None
        self.decision: route.Route | None = None
        self.cost = cost

    @property
    def route(self) -> str:
        return "eager" if self.chosen is None else self.chosen.route

    def _choose(self, carry: Carry, steps: int) -> None:
        assert self.cost is not None
        cost = self.cost
        decision = route.choose(
            cost, steps, self.taken, route.on_disk(cost), route.compiler_set_up(), route.eager_spent(cost)
        )
        compiling = self.agree(decision.compiled)
        self.decision = decision if compiling == decision.compiled else decision._replace(compiled=compiling)
        options = self.options._replace(enabled=True)
        self.chosen = compiled(self.s, carry.state, self.example, options) if compiling else Eager(self.s)

    def steps(
        self, carry: Carry, block: torch.Tensor, start: int, count: int, set_carry: Setter
    ) -> tuple[Carry, int | None]:
        if self.chosen is None and count > 0:
            steps = self.end - carry.n
            if self.cost is not None:  # known from the history: no step to count
                self._choose(carry, steps)
                return carry, None  # the loop hands the block to the route chosen (its fast path included)
            s = self.s
            (new, info), self.cost = counted_step(s, carry.state, block[start], self.options)
            self._choose(carry, steps)
            if not bool(good_rates(s.schedule(new.t), 1)):
                return carry, carry.n + 1
            carry = Carry(new, carry.n + 1, carry.total + info.cost, info)
            set_carry(carry)
            return carry, None  # one step taken: the loop hands the rest to the route chosen (its fast path included)
        assert self.chosen is not None
        return self.chosen.steps(carry, block, start, count, set_carry)


def stepper(
    stepping: Stepping,
    state: State,
    block: torch.Tensor,
    options: Compile,
    end: int,
    taken: int = 0,
    agree: Callable[[bool], bool] = bool,
    cost: route.StepCost | None = None,
) -> Eager | Compiled | Split | Auto:
    """The stepper ``options.enabled`` asks for: eager, compiled, or decided on the way ("auto", the decision
    passed through ``agree``)."""
    if options.enabled is False:
        return Eager(stepping)
    if options.enabled == "auto":
        return Auto(stepping, options, end, taken, agree, block, cost)
    return compiled(stepping, state, block, options)


__all__ = [
    "Auto",
    "Carry",
    "Compiled",
    "Eager",
    "Split",
    "Stepping",
    "block_rates",
    "compiled",
    "counted_step",
    "signature_key",
    "stepper",
]
