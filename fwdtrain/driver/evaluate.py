"""``stationary_cost``: a Monte Carlo estimate of J(theta) with theta frozen, for reports.

    J(theta) ~ (1 / (N (K - B))) sum_i sum_{B <= n < K} c(X_n^i, theta)

It runs through ``run``'s loop (``fwdtrain.problems.frozen.FrozenCost``: the same noise, kernels, compile
route and divergence checks), streams the steps without storing them and returns Python floats, so it
cannot be transformed (it says so inside a transform instead of returning a silent zero;
``fwdtrain.core.evaluate.average_cost`` is the pure, differentiable form).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, cast

import torch

from ..compile.options import as_compile
from ..core import _checks
from ..core._tree import leaves
from ..core.errors import DivergenceError
from ..core.problem import SDE
from ..core.sensitivity import Theta
from ..core.solvers import Solver, as_solver
from ..core.state import evaluate_once
from ..problems.frozen import FrozenCost, FrozenPaths
from .options import Checks, SaveAt
from .runner import run


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
        compile: As for ``run``: ``"auto"`` steps eagerly and, for an evaluation past ``Compile(after=...)``
            steps, loads its kernel or compiles it beside (``fwdtrain.Compile``).

    Returns:
        ``CostEstimate(mean, stderr)``, the standard error over particles.

    Raises:
        TypeError: Inside a ``torch.func`` transform (use ``average_cost``).
        ValueError: For bad counts, a non-positive dt or a solver that does not take this noise.
        DivergenceError: Paths that became non-finite (never a NaN estimate).
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
    evaluate_once(sde, theta, x0)
    problem = FrozenCost(sde, scheme, burn_in)
    start = problem.start(theta, x0, particles)
    with torch.no_grad():  # floats out: nothing to differentiate; a closure's grad-tracking tensors stay graph-free
        # one record and one divergence check at the end (and the loop's check after the first step)
        try:
            end, _ = run(
                problem, start, steps, dt, 0.0, seed, compile=options, save=SaveAt(steps), checks=Checks(steps)
            )
        except DivergenceError as error:  # the same error (its last good state kept), in this function's words
            error.args = (
                f"stationary_cost: the paths became non-finite by step {error.step} (t = {error.step * float(dt):.4g}) "
                f"with theta frozen; the SDE is not ergodic at this theta, or dt = {float(dt)} is too large for it",
            )
            raise
    _refuse_transformed(end.x)  # the SDE closes over a tensor of an enclosing transform
    total = cast(FrozenPaths, end).sums / (steps - burn_in)  # run returns its problem's state kind
    return CostEstimate(total.mean().item(), (total.std() / math.sqrt(particles)).item())


__all__ = ["CostEstimate", "stationary_cost"]
