"""How the loop's steps are computed: the one place where a run chooses eager or compiled steps.

A stepper takes ``count`` steps from a noise block, ``steps(carry, block, start, count) -> carry``,
where ``Carry(state, n, total, info)`` is what the loop carries (``total``: the float64 sum of the
per-step costs since the start of training, ``info``: the last step's ``StepInfo``):

- ``Eager``: one ``Trainable.advance`` per step, alpha(t_n) from the schedule at each step.
- ``Compiled``: every run of steps between two events in one call of a compiled loop
  (``fwdtrain.compile.kernels.loop_kernel``), with the block's learning rates computed beforehand.
- ``Split``: for a gradient hook (an all-reduce across processes), the two halves of each step
  compiled (``Trainable.propagate`` and ``Trainable.update``) with the hook run eagerly between them.
- ``Auto``: ``compile="auto"``: eager first, timed, then compiled where ``compile.policy.decide``
  projects that compiling pays (the decision is taken once, after a few eager steps).

Every stepper computes what the eager one does, to rounding.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import numpy as np
import torch

from ..compile import policy
from ..compile.kernels import FunctionKernel, LoopKernel, ObservedKernel, function_kernel, loop_kernel, observed_kernel
from ..compile.options import Compile
from ..core._tree import leaves, tree_map
from ..core.kernel import GradientReduce, StepInfo
from ..core.state import State
from ..problems.trainable import Schedule, Trainable


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


class Eager:
    """One eager ``advance`` per step; the loop's carry is set after every step (Ctrl-C keeps whole steps)."""

    route = "eager"

    def __init__(self, stepping: Stepping) -> None:
        self.s = stepping

    def steps(self, carry: Carry, block: torch.Tensor, start: int, count: int, set_carry: Setter) -> Carry:
        s = self.s
        for i in range(start, start + count):
            new, info = s.problem.advance(carry.state, block[i], s.dt, s.schedule(carry.state.t), s.plan, s.reduce)
            carry = Carry(new, carry.n + 1, carry.total + info.cost, info)
            set_carry(carry)
        return carry


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


def block_rates(
    schedule: Schedule, t: torch.Tensor, dt: float, start: int, count: int, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(alpha(t_k), t_k) for the steps start .. start + count - 1 of a block of ``length`` (alpha zero elsewhere),
    t_k as the step accumulates it (``clocks``: (count, *t.shape)); alpha in the dtype the schedule gives at t:
    (length, *t.shape)."""
    times = clocks(t, dt, count)
    try:
        alphas = torch.as_tensor(schedule(times))
        alphas = alphas.broadcast_to(times.shape) if alphas.shape != times.shape else alphas
    except (RuntimeError, TypeError, ValueError):  # a schedule that takes one clock at a time
        alphas = torch.stack([torch.as_tensor(schedule(clock)).broadcast_to(t.shape) for clock in times])
    out = torch.zeros((length, *t.shape), dtype=torch.as_tensor(schedule(t)).dtype, device=t.device)
    out[start : start + count] = alphas
    return out, times


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
        self._block: tuple[torch.Tensor, int, torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @property
    def route(self) -> str:
        return self.kernel.route

    def inputs(self, t: torch.Tensor, block: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(``block`` padded to ``length`` rows, alpha(t_k) for its steps from ``start`` on, zeros before)."""
        cached = self._block  # (block, first start, clocks from there, padded block, rates)
        if cached is not None and cached[0] is block:
            if cached[1] <= start and torch.equal(cached[2][start - cached[1]], t):
                return cached[3], cached[4]
            padded = cached[3]
        else:
            padded = padded_block(block, self.length)
        rates, times = block_rates(self.s.schedule, t, self.s.dt, start, block.shape[0] - start, self.length)
        self._block = (block, start, times, padded, rates)
        return padded, rates

    def steps(self, carry: Carry, block: torch.Tensor, start: int, count: int, set_carry: Setter) -> Carry:
        padded, alphas = self.inputs(carry.state.t, block, start)
        info = carry.info if carry.info is not None else zero_info(carry.state)
        state, total, info = self.kernel(count, start, (padded, alphas), (carry.state, carry.total, info))
        carry = Carry(state, carry.n + count, total, info)
        set_carry(carry)
        return carry

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
    ) -> tuple[Carry, Any, torch.Tensor] | None:
        """The steps of ``block`` up to each of ``stops`` (step counts from the block's first row, the last one the
        block's length) in one call of ``kernel``: (the carry at the last stop, the stacked observations, the
        block's learning rates); None where the kernel cannot run (the caller steps as usual). The carry is not
        set: the caller does, once the observations pass its checks."""
        padded, alphas = self.inputs(carry.state.t, block, 0)
        info = carry.info if carry.info is not None else zero_info(carry.state)
        out = kernel.observe_call(stops, 0, (padded, alphas), (carry.state, carry.total, info))
        if out is None:
            return None
        (state, total, info), seen = out
        return Carry(state, carry.n + stops[-1], total, info), seen, alphas[: block.shape[0]]


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

    def steps(self, carry: Carry, block: torch.Tensor, start: int, count: int, set_carry: Setter) -> Carry:
        s = self.s
        for i in range(start, start + count):
            alpha = torch.as_tensor(s.schedule(carry.state.t))
            moved, info = self.propagate(carry.state, block[i])
            gradient = s.reduce(info.gradient) if s.reduce is not None else info.gradient
            info = StepInfo(info.cost, gradient)
            carry = Carry(self.update(moved, gradient, alpha), carry.n + 1, carry.total + info.cost, info)
            set_carry(carry)
        return carry


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


class Auto:
    """``compile="auto"``: eager for a warm-up step and ``policy.EAGER_PROBE_STEPS`` timed steps, then compiled
    when ``policy.decide`` projects that it pays for the steps left (a kernel on disk counts as nearly free)."""

    def __init__(
        self, stepping: Stepping, options: Compile, end: int, agree: Callable[[bool], bool], example: torch.Tensor
    ) -> None:
        self.s, self.options, self.end, self.agree = stepping, options, end, agree
        self.example = example  # a block of the compiled loop's length
        self.eager = Eager(stepping)
        self.chosen: Eager | Compiled | Split | None = None
        self.timed: list[float] = []
        self.decision: policy.Decision | None = None
        # the kernel a compiled run would call instead of the stepper's own loop kernel (the loop's fast path,
        # ``Loop._observer``): its package decides whether compiling is nearly free
        self.fast_kernel: Callable[[Compiled, Carry], Any] | None = None

    @property
    def route(self) -> str:
        return "eager" if self.chosen is None else self.chosen.route

    def steps(self, carry: Carry, block: torch.Tensor, start: int, count: int, set_carry: Setter) -> Carry:
        if self.chosen is None and not self.timed and policy.compiled_before(self._key(carry.state)):
            # a run of this problem compiled before in this process (a continued run): its kernel is built
            self.chosen = compiled(self.s, carry.state, self.example, self.options._replace(enabled=True))
            if self.fast_kernel is not None and isinstance(self.chosen, Compiled):
                return carry  # the loop's fast path takes the block
        while count > 0 and self.chosen is None:
            clock = time.perf_counter()
            carry = self.eager.steps(carry, block, start, 1, set_carry)
            self.timed.append(time.perf_counter() - clock)
            start, count = start + 1, count - 1
            if len(self.timed) > policy.EAGER_PROBE_STEPS:
                self.chosen = self._choose(carry)
                if self.fast_kernel is not None and isinstance(self.chosen, Compiled):
                    return carry  # the loop's fast path takes the rest (``Loop._advance``)
        if count == 0:
            return carry
        assert self.chosen is not None
        return self.chosen.steps(carry, block, start, count, set_carry)

    def _key(self, state: State) -> Hashable:
        """What the eager time spent is remembered by: the problem, its plan and dt, the state's leaves' shapes."""
        s = self.s
        shapes = tuple((tuple(leaf.shape), leaf.dtype) for leaf in leaves(state) if isinstance(leaf, torch.Tensor))
        return (s.problem, s.plan, s.dt, shapes)

    def _choose(self, carry: Carry) -> Eager | Compiled | Split:
        """This process's choice, then the run's (``agree``: every rank of a group takes rank 0's)."""
        eager_step = min(self.timed[1:])  # the first step pays one-time costs (imports, caches)
        remaining = self.end - carry.n
        key = self._key(carry.state)
        spent = policy.spent(key)
        chosen = None
        if policy.worth_tracing(eager_step, remaining, spent):
            chosen = compiled(self.s, carry.state, self.example, self.options._replace(enabled=True))
            kernel = chosen.kernel if isinstance(chosen, Compiled) else None
            if isinstance(chosen, Compiled) and self.fast_kernel is not None:
                fast = self.fast_kernel(chosen, carry)
                kernel = kernel if fast.failed else fast
            warm = kernel.warm if kernel is not None else False
            nodes = kernel.nodes if kernel is not None else 0
            self.decision = policy.decide(eager_step, remaining, warm=warm, nodes=max(nodes, 1), spent_s=spent)
        if not self.agree(self.decision is not None and self.decision.compile):
            policy.spend(key, eager_step * remaining)
            return self.eager
        policy.chose_compiled(key)
        return (
            chosen
            if chosen is not None
            else compiled(self.s, carry.state, self.example, self.options._replace(enabled=True))
        )


def stepper(
    stepping: Stepping,
    state: State,
    block: torch.Tensor,
    options: Compile,
    end: int,
    agree: Callable[[bool], bool] = bool,
) -> Eager | Compiled | Split | Auto:
    """The stepper ``options.enabled`` asks for: eager, compiled, or decided on the way ("auto", the decision
    passed through ``agree``)."""
    if options.enabled is False:
        return Eager(stepping)
    if options.enabled == "auto":
        return Auto(stepping, options, end, agree, block)
    return compiled(stepping, state, block, options)


__all__ = ["Auto", "Carry", "Compiled", "Eager", "Split", "Stepping", "block_rates", "compiled", "stepper"]
