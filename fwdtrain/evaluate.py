"""Evaluation with theta frozen: Monte Carlo estimates of the stationary cost.

Two entry points:

- ``average_cost`` (pure, differentiable): the time average of c along the Euler paths
  driven by the increments you pass; composes with ``torch.func.grad``/``jacrev``/
  ``jacfwd``/``vjp``/``jvp``/``vmap`` in theta, x0 and the increments.
- ``stationary_cost`` (a convenience for reports): draws its own noise from a seeded
  generator, streams 10^4 steps without storing them and returns Python floats. It
  cannot be transformed (its result is a float), and says so instead of returning a
  silent zero: inside a transform use ``average_cost``.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple

import torch
from torch.func import vmap

from . import _checks
from ._tree import leaves
from .problem import SDE, Coefficients, Theta
from .state import evaluate_once
from .euler import noise_term


class CostEstimate(NamedTuple):
    """Time-and-particle average of c after burn-in, with its standard error over particles."""

    mean: float
    stderr: float


def _particle_coefficients(sde: SDE, theta: Theta) -> Callable[[torch.Tensor], Coefficients]:
    return vmap(lambda x: Coefficients(*sde.coefficients(theta, x)))


def average_cost(sde: SDE, theta: Theta, x0: torch.Tensor, dw: torch.Tensor, dt: Any, burn_in: int = 0
                 ) -> torch.Tensor:
    """Per-particle time averages (1 / (K - burn_in)) sum_{burn_in <= n < K} c(X_n^i, theta), shape (N,).

    X_0^i = x0 (d,), X_{n+1} = X_n + mu h + sigma dW_n with dw (K, N, m) the increments and h = dt;
    theta frozen, no sensitivity. Pure: a function of (theta, x0, dw, dt) that ``torch.func``
    transforms see through, e.g. ``torch.func.grad(lambda th: average_cost(sde, th, x0, dw, dt).mean())``
    is the pathwise (backpropagation-through-time) gradient of the finite-horizon cost.
    """
    dtype, device = _checks.check_theta(theta, allow_low_precision=True)
    _checks.check_dt(dt)
    x0 = _checks.check_tensor(x0, "x0", dtype, device)
    dw = _checks.check_tensor(dw, "dw", dtype, device)
    if x0.ndim != 1 or dw.ndim != 3:
        raise ValueError(f"average_cost needs x0 of shape (d,) and dw of shape (steps, particles, m), "
                         f"got {tuple(x0.shape)} and {tuple(dw.shape)}")
    steps = dw.shape[0]
    if isinstance(burn_in, bool) or not isinstance(burn_in, int) or not 0 <= burn_in < steps:
        raise ValueError(f"need an integer 0 <= burn_in < steps = {steps}, got burn_in={burn_in!r}")
    coefficients = _particle_coefficients(sde, theta)
    x = x0.expand(dw.shape[1], -1)
    total = torch.zeros(dw.shape[1], dtype=dtype, device=device)
    for n in range(steps):
        mu, sig, cost = coefficients(x)
        if n >= burn_in:
            total = total + cost
        x = x + mu * dt + noise_term(sig, dw[n])
    return total / (steps - burn_in)


def _refuse_transformed(tensors: Any) -> None:
    for leaf in leaves(tensors):
        kind = _checks.transform_of(leaf)
        if kind is not None:
            raise TypeError(f"stationary_cost cannot run inside torch.func.{kind}: it returns Python floats, "
                            f"so its dependence on theta would be lost. Inside a transform call "
                            f"fwdtrain.evaluate.average_cost(sde, theta, x0, dw, dt, burn_in), which takes the "
                            f"Brownian increments dw (steps, particles, m) and returns a tensor")


# Seconds per frozen-theta step of ``stationary_cost`` (fixed + per particle) and to compile it, measured
# on the 2-core CPU with lqr_1d's 1 -> 16 -> 1 network at N = 1000: eager 0.21 ms/step (0.18 ms of it the
# coefficients), compiled 0.11 ms (0.055 ms the compiled kernel, one thread), 3.3-4 s to compile cold.
EAGER_FROZEN_STEP_S = (1.4e-4, 7e-8)
COMPILED_FROZEN_STEP_S = (9e-5, 1e-8)
FROZEN_COMPILE_S = {"cold": 5.0, "warm": 2.5}


def compiles_faster(steps: int, particles: int, warm_cache: bool) -> bool:
    """``compile="auto"`` of ``stationary_cost``: True when compiling plus compiled steps beat eager steps."""
    from .compiled import run_seconds

    compiled = run_seconds(steps, particles, COMPILED_FROZEN_STEP_S)
    return FROZEN_COMPILE_S["warm" if warm_cache else "cold"] + compiled < run_seconds(steps, particles,
                                                                                      EAGER_FROZEN_STEP_S)


@functools.lru_cache(maxsize=8)
def _frozen_step(sde: SDE, dt: float, compile: bool | str) -> Callable:
    """``(theta, x (N, d), dw (N, m)) -> (X_{n+1}, c(X_n))``, theta frozen: eager, or compiled once per (sde, dt)."""
    def frozen_step(theta: Theta, x: torch.Tensor, dw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu, sig, cost = _particle_coefficients(sde, theta)(x)
        return x + mu * dt + noise_term(sig, dw), cost

    if compile is False:
        return frozen_step
    from .compiled import STEP_OPTIONS, CompiledOrEager  # deferred: importing torch._dynamo takes seconds

    backend = compile if isinstance(compile, str) else "inductor"
    return CompiledOrEager(frozen_step, "the frozen-theta evaluation step", backend, STEP_OPTIONS)


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
    compile: bool | str = "auto",
) -> CostEstimate:
    """J(theta) ~ (1 / (N (steps - burn_in))) sum_i sum_{n >= burn_in} c(X_n^i, theta), theta frozen.

    Simulates X alone (no sensitivity), Euler-Maruyama with step dt, noise from a generator seeded
    with ``seed``. Not transformable (floats out): raises a TypeError inside ``torch.func`` transforms;
    ``average_cost`` is the pure, differentiable form. ``compile`` as for ``fwdtrain.run``: "auto"
    compiles the step only when the evaluation is long enough to repay it (``compiles_faster``);
    the compiled step computes what the eager one does (to rounding).
    """
    _refuse_transformed((theta, x0, dt))
    dtype, device = _checks.check_theta(theta, allow_low_precision=True)
    _checks.check_dt(dt)
    particles = _checks.check_count(particles, "particles")
    if not 0 <= burn_in < steps:
        raise ValueError(f"need 0 <= burn_in < steps, got burn_in={burn_in}, steps={steps}")
    x0 = _checks.check_tensor(x0, "x0", dtype, device)
    m = evaluate_once(sde, theta, x0).sigma.shape[-1]  # sigma (d, m), or (d,) for diagonal noise (m = d)
    if not (compile is True or compile is False or isinstance(compile, str)):
        raise TypeError(f"compile must be \"auto\", True, False or a torch.compile backend name, got {compile!r}")
    if compile == "auto":
        from .compiled import warm_cache_exists

        compile = compiles_faster(steps, particles, warm_cache_exists())
    first, step = _frozen_step(sde, float(dt), False), _frozen_step(sde, float(dt), compile)
    generator = torch.Generator(device=device).manual_seed(seed)
    x = x0.expand(particles, -1).clone()
    per_particle = torch.zeros(particles, dtype=torch.float64, device=device)
    with torch.no_grad():  # floats out: nothing to differentiate; keeps a closure's grad-tracking tensors graph-free
        for n in range(steps):
            dw = torch.randn((particles, m), generator=generator, dtype=dtype, device=device) * math.sqrt(dt)
            x_next, cost = (first if n == 0 else step)(theta, x, dw)
            if n == 0:
                _refuse_transformed(cost)  # the SDE closes over a tensor of an enclosing transform
            if n >= burn_in:
                per_particle += cost.double()
            x = x_next
    per_particle /= steps - burn_in
    return CostEstimate(per_particle.mean().item(), (per_particle.std() / math.sqrt(particles)).item())


__all__ = ["CostEstimate", "average_cost", "stationary_cost", "compiles_faster"]
