"""``stationary_cost``: a Monte Carlo estimate of J(theta) with theta frozen, for reports.

    J(theta) ~ (1 / (N (K - B))) sum_i sum_{B <= n < K} c(X_n^i, theta)

It draws its own noise from a seeded generator, streams the steps without storing them and returns
Python floats, so it cannot be transformed (it says so inside a transform instead of returning a
silent zero; ``fwdtrain.core.evaluate.average_cost`` is the pure, differentiable form). Long
evaluations run as one compiled loop (the same kernels and policy as ``run``).
"""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

import torch

from ..compile import policy
from ..compile.kernels import loop_kernel
from ..compile.options import as_compile
from ..core import _checks
from ..core._tree import leaves
from ..core.evaluate import frozen_step
from ..core.problem import SDE
from ..core.sensitivity import Theta
from ..core.solvers import Solver, as_solver
from ..core.state import evaluate_once


class CostEstimate(NamedTuple):
    """What ``stationary_cost`` returns.

    Attributes:
        mean: The time-and-particle average of c after burn-in.
        stderr: Its standard error over particles (the particles are independent; time averages are not).
    """

    mean: float
    stderr: float


def _refuse_transformed(tensors: Any) -> None:
    for leaf in leaves(tensors):
        kind = _checks.transform_of(leaf)
        if kind is not None:
            raise TypeError(
                f"stationary_cost cannot run inside torch.func.{kind}: it returns Python floats, "
                f"so its dependence on theta would be lost. Inside a transform call "
                f"fwdtrain.core.evaluate.average_cost(sde, theta, x0, dw, dt, burn_in), which takes the "
                f"Brownian increments dw (steps, particles, m) and returns a tensor"
            )


def _noise_block(
    generator: torch.Generator,
    count: int,
    length: int,
    shape: tuple[int, int],
    dtype: torch.dtype,
    device: torch.device,
    dt: float,
) -> torch.Tensor:
    """``count`` increments drawn one step at a time (the stream does not depend on the block length), zero-padded
    to ``length`` rows."""
    rows = [torch.randn(shape, generator=generator, dtype=dtype, device=device) * math.sqrt(dt) for _ in range(count)]
    rows += [torch.zeros(shape, dtype=dtype, device=device)] * (length - count)
    return torch.stack(rows)


class _Chooser:
    """Eager, or the compiled loop, decided as ``run`` decides (``compile.policy``): after one eager step for
    ``compile=True``, after a few timed ones for "auto"; never for ``compile=False``."""

    def __init__(self, options: Any, steps: int) -> None:
        self.options, self.steps = options, steps
        self.decided = options.enabled is False
        self.kernel: Any = None
        self.seconds: list[float] = []

    def timed(self, seconds: float, build: Any, done: int) -> None:
        self.seconds.append(seconds)
        if self.options.enabled is True:
            self.kernel, self.decided = build(), True
        elif len(self.seconds) > policy.EAGER_PROBE_STEPS:
            self.decided = True
            eager_step, remaining = min(self.seconds[1:]), self.steps - done
            if policy.worth_tracing(eager_step, remaining):
                kernel = build()
                if policy.decide(eager_step, remaining, warm=kernel.warm, nodes=max(kernel.nodes, 1)).compile:
                    self.kernel = kernel


def stationary_cost(
    sde: SDE,
    theta: Theta,
    x0: torch.Tensor,
    *,
    particles: int = 1000,
    dt: float = 0.01,
    steps: int = 20_000,
    burn_in: int = 2_000,
    seed: int = 1,
    solver: Solver | str | None = None,
    compile: Any = "auto",
) -> CostEstimate:
    """J(theta) ~ (1 / (N (steps - burn_in))) sum_i sum_{n >= burn_in} c(X_n^i, theta), theta frozen.

    Simulates X alone (no sensitivity) with theta frozen and returns Python floats: for reports and
    references. Inside a transform use ``fwdtrain.core.evaluate.average_cost``, which is differentiable.

    Args:
        sde: The problem (``SDE`` or ``ControlledSDE``).
        theta: The parameters, frozen.
        x0: The initial point of every particle, shape (d,).
        particles: N (default 1000).
        dt: The step h (default 0.01).
        steps: Steps in all (default 20,000).
        burn_in: Steps left out of the average at the start (default 2,000).
        seed: Seed of the evaluation's own noise generator.
        solver: ``Euler()`` (default), ``Heun()``, ``Milstein()`` or a name.
        compile: As for ``run``: ``"auto"`` compiles the loop when the evaluation is long enough to repay
            it (timed on its first steps).

    Returns:
        ``CostEstimate(mean, stderr)``, the standard error over particles.

    Raises:
        TypeError: Inside a ``torch.func`` transform (use ``average_cost``).
        ValueError: For bad counts, a non-positive dt or a solver that does not take this noise.
    """
    _refuse_transformed((theta, x0, dt))
    dtype, device = _checks.check_theta(theta, allow_low_precision=True)
    _checks.check_dt(dt)
    particles = _checks.check_count(particles, "particles")
    steps = _checks.check_count(steps, "steps")
    if isinstance(burn_in, bool) or not isinstance(burn_in, int) or not 0 <= burn_in < steps:
        raise ValueError(f"need 0 <= burn_in < steps, got burn_in={burn_in}, steps={steps}")
    x0 = _checks.check_tensor(x0, "x0", dtype, device)
    scheme, options = as_solver(solver), as_compile(compile)
    scheme.check(sde, theta, x0)
    m = evaluate_once(sde, theta, x0).sigma.shape[-1]  # sigma (d, m), or (d,) for diagonal noise (m = d)
    generator = torch.Generator(device=device).manual_seed(seed)
    x = x0.expand(particles, -1).clone()
    total = torch.zeros(particles, dtype=torch.float64, device=device)

    def step(carry: tuple[torch.Tensor, torch.Tensor, Theta], inputs: tuple[torch.Tensor, torch.Tensor]) -> Any:
        x_n, total_n, theta_ = carry  # theta is carried (unchanged), not closed over: one kernel for every theta
        dw, counted = inputs
        x_next, cost = frozen_step(sde, theta_, x_n, dw, dt, scheme)
        return x_next, torch.where(counted, total_n + cost.double(), total_n), theta_

    length = min(options.chunk, steps)
    chooser = _Chooser(options, steps)
    with torch.no_grad():  # floats out: nothing to differentiate; a closure's grad-tracking tensors stay graph-free
        n = 0
        while n < steps:
            count = min(length, steps - n)
            block = _noise_block(generator, count, length, (particles, m), dtype, device, float(dt))
            counted = torch.arange(n, n + length, device=device) >= burn_in
            i = 0
            while i < count and not chooser.decided:  # eager steps, timed, until compiling is decided
                clock = time.perf_counter()
                x, total, _ = step((x, total, theta), (block[i], counted[i]))
                if n + i == 0:
                    _refuse_transformed(x)  # the SDE closes over a tensor of an enclosing transform
                chooser.timed(
                    time.perf_counter() - clock,
                    lambda: loop_kernel(
                        step,
                        (x, total, theta),
                        (block, counted),
                        key=(sde, float(dt), scheme, "frozen"),
                        options=options._replace(enabled=True),
                        what="the frozen-theta step",
                    ),
                    n + i + 1,
                )
                i += 1
            if i < count and chooser.kernel is not None:
                x, total, _ = chooser.kernel(count - i, i, (block, counted), (x, total, theta))
            else:
                for k in range(i, count):
                    x, total, _ = step((x, total, theta), (block[k], counted[k]))
            n += count
    total = total / (steps - burn_in)
    return CostEstimate(total.mean().item(), (total.std() / math.sqrt(particles)).item())


__all__ = ["CostEstimate", "stationary_cost"]
