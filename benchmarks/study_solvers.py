"""Issue 19's measurements of the solvers, all through fwdtrain's own step (``python benchmarks/validate.py
--study solvers``). float64 throughout.

1. Weak order. For the Ornstein-Uhlenbeck process dX = -kappa X dt + s dW every scheme's step is linear,
   X' = a(h) X + b(h) dW, so its chain has the exact stationary variance b^2 h / (1 - a^2) (the discrete
   Lyapunov equation). a and b are read off ``fwdtrain.step`` (lr = 0) on deterministic inputs
   (X = 1, dW = 0 gives a; X = 0, dW = 1 gives b) at h in {0.4, 0.2, 0.1, 0.05}, next to the closed forms
   (Euler and Milstein: a = 1 - kappa h, b = s; Heun: a = 1 - kappa h + (kappa h)^2 / 2,
   b = s (1 - kappa h / 2)); the order is the log-log slope of |bias| against h. A Monte Carlo run of
   ``fwdtrain.run`` (lr = 0) at one h cross-checks the read-off variance.
2. Strong order on geometric Brownian motion dX = mu X dt + s X dW (x-dependent diagonal noise), theta =
   (mu, s), X_0 = 1, T = 1: X_T = exp((mu - s^2 / 2) T + s W_T), dX_T/dmu = T X_T, dX_T/ds = (W_T - s T) X_T.
   ``fwdtrain.run`` at lr = 0 (theta frozen) with the increments of the same Brownian paths summed to each h;
   RMS errors of X and of both leaves of Xtilde at T, and their fitted orders. Heun must refuse this noise.
3. Accuracy per second on the seed's problem with a linear control: dX = (-X + u) dt + dW, cost X^2 + u^2,
   u = -k X, k* = sqrt(2) - 1. The gain each chain converges to is the minimiser of its exact stationary
   cost (1 + k^2) b^2 h / (1 - a^2), with a(k, h), b(k, h) read off ``fwdtrain.step`` (and from the closed
   forms of issue 19); next to it the gain trained by ``fwdtrain.run`` (Polyak average over the second half,
   mean and standard error over seeds) and the wall time of that training, Heun at dt = 0.05 against Euler
   at dt = 0.01 over the same horizon.
4. Compiled equals eager: ``ft.run(compile=True)`` against ``compile=False`` for every solver (the seed's
   MLP problem; GBM for the solvers that take it), training with lr > 0, and each kernel's compile time, in
   a fresh cache folder (the machine's one-time compiler set-up timed apart).
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import torch

import fwdtrain as ft
from fwdtrain.compile import kernels
from fwdtrain.core.solvers import Solver

F64 = torch.float64
SOLVERS = (ft.Euler(), ft.Heun(), ft.Milstein())


def _scalar(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=F64)


def fitted_order(steps: list[float], errors: list[float]) -> float:
    """Least-squares slope of log |error| against log h."""
    return float(np.polyfit(np.log(steps), np.log(np.abs(errors)), 1)[0])


def linear_map(sde: ft.SDE, theta: Any, solver: Solver, h: float) -> tuple[float, float]:
    """(a, b) of a step that is linear in (X, dW) for a 1-D SDE, X' = a X + b dW, read off ``fwdtrain.step``
    at lr = 0 on three particles (X, dW) = (1, 0), (0, 1), (1, 1) (the third checks the linearity)."""
    state = ft.init(sde, theta, torch.zeros(1, dtype=F64), 3)
    x = torch.tensor([[1.0], [0.0], [1.0]], dtype=F64)
    dw = torch.tensor([[0.0], [1.0], [1.0]], dtype=F64)
    a, b, both = ft.step(sde, state._replace(x=x), dw, h, 0.0, solver=solver).x[:, 0].tolist()
    if abs(both - a - b) > 1e-12 * (1 + abs(a) + abs(b)):
        raise AssertionError(f"{solver!r}'s step is not linear in (X, dW) here: {both} != {a} + {b}")
    return a, b


def chain_variance(a: float, b: float, h: float) -> float:
    """Stationary variance of X' = a X + b dW, dW ~ N(0, h): b^2 h / (1 - a^2) (|a| < 1)."""
    return b * b * h / (1 - a * a)


# ---------------------------------------------------------------- 1. weak order (OU)

KAPPA, SIGMA = 1.0, 1.0
WEAK_STEPS = (0.4, 0.2, 0.1, 0.05)


def ou_sde() -> tuple[ft.SDE, dict[str, torch.Tensor]]:
    """dX = -kappa X dt + s dW, theta = (kappa, s) (sigma depends on theta only: every solver takes it), cost X^2."""
    sde = ft.SDE(
        lambda th, x: -th["kappa"] * x, lambda th, x: th["s"] * torch.ones_like(x), lambda th, x: (x * x).sum()
    )
    return sde, {"kappa": _scalar(KAPPA), "s": _scalar(SIGMA)}


def ou_closed_form(solver: Solver, h: float) -> tuple[float, float]:
    if isinstance(solver, ft.Heun):
        return 1 - KAPPA * h + (KAPPA * h) ** 2 / 2, SIGMA * (1 - KAPPA * h / 2)
    return 1 - KAPPA * h, SIGMA  # Euler, and Milstein (additive noise: no correction)


def ou_monte_carlo(solver: Solver, h: float, particles: int, steps: int, burn_in: int) -> tuple[float, float]:
    """E X^2 of fwdtrain's chain at lr = 0: mean and standard error of the records' window means of the
    particle-mean cost X^2 after ``burn_in`` steps (windows of 50 steps, independent for kappa h >= 0.01)."""
    sde, theta = ou_sde()
    start = ft.init(sde, theta, torch.zeros(1, dtype=F64), particles)
    warm = ft.run(sde, start, burn_in, h, 0.0, 1, solver=solver, compile=False)
    done = ft.run(sde, warm, steps, h, 0.0, solver=solver, save=ft.SaveAt(every=50), compile=False)
    windows = done.history.cost[done.history.step > burn_in].double()
    return float(windows.mean()), float(windows.std() / math.sqrt(len(windows)))


def weak_order(quick: bool) -> dict[str, Any]:
    sde, theta = ou_sde()
    exact = SIGMA**2 / (2 * KAPPA)
    rows, orders = [], {}
    for solver in SOLVERS:
        biases = []
        for h in WEAK_STEPS:
            a, b = linear_map(sde, theta, solver, h)
            closed = chain_variance(*ou_closed_form(solver, h), h)
            variance = chain_variance(a, b, h)
            biases.append(variance / exact - 1)
            rows.append(
                {
                    "solver": solver.name,
                    "h": h,
                    "a": a,
                    "b": b,
                    "variance": variance,
                    "closed_form": closed,
                    "relative_bias": variance / exact - 1,
                }
            )
        orders[solver.name] = fitted_order(list(WEAK_STEPS), biases)
    h = 0.4 if quick else 0.2
    particles, steps = (200, 100) if quick else (10_000, 1_000)
    monte_carlo = []
    for solver in SOLVERS:
        a, b = linear_map(sde, theta, solver, h)
        mean, stderr = ou_monte_carlo(solver, h, particles, steps, burn_in=50)
        monte_carlo.append(
            {"solver": solver.name, "h": h, "mc": mean, "stderr": stderr, "lyapunov": chain_variance(a, b, h)}
        )
    return {
        "exact": exact,
        "rows": rows,
        "orders": orders,
        "monte_carlo": monte_carlo,
        "mc_size": {"particles": particles, "steps": steps},
    }


def print_weak(result: dict[str, Any]) -> None:
    print(f"weak order: OU dX = -{KAPPA:g} X dt + {SIGMA:g} dW, stationary variance {result['exact']:g}")
    print(f"{'solver':<10}{'h':>6}{'a (read off)':>15}{'b':>10}{'variance':>12}{'closed form':>13}{'rel. bias':>11}")
    for r in result["rows"]:
        print(
            f"{r['solver']:<10}{r['h']:>6g}{r['a']:>15.6f}{r['b']:>10.6f}{r['variance']:>12.6f}"
            f"{r['closed_form']:>13.6f}{r['relative_bias']:>+11.4%}"
        )
    print("fitted weak order: " + ", ".join(f"{name} {order:.2f}" for name, order in result["orders"].items()))
    size = result["mc_size"]
    print(f"Monte Carlo cross-check ({size['particles']} particles, {size['steps']} steps after a burn-in):")
    for r in result["monte_carlo"]:
        deviation = (r["mc"] - r["lyapunov"]) / r["stderr"]
        print(
            f"  {r['solver']:<10} h = {r['h']:g}: E X^2 = {r['mc']:.5f} +- {r['stderr']:.5f}, "
            f"Lyapunov {r['lyapunov']:.5f} ({deviation:+.1f} standard errors)"
        )


# ---------------------------------------------------------------- 2. strong order (GBM)

GBM_MU, GBM_S, GBM_T = 0.5, 0.8, 1.0


def gbm_sde() -> tuple[ft.SDE, dict[str, torch.Tensor]]:
    """dX = mu X dt + s X dW (diagonal, x-dependent noise), theta = (mu, s), cost X^2."""
    sde = ft.SDE(lambda th, x: th["mu"] * x, lambda th, x: th["s"] * x, lambda th, x: (x * x).sum())
    return sde, {"mu": _scalar(GBM_MU), "s": _scalar(GBM_S)}


def strong_order(quick: bool) -> dict[str, Any]:
    levels = range(2, 5) if quick else range(3, 10)
    paths = 200 if quick else 10_000
    finest = 2 ** max(levels)
    generator = torch.Generator().manual_seed(19)
    fine = torch.randn((finest, paths, 1), generator=generator, dtype=F64) * math.sqrt(GBM_T / finest)
    w = fine.sum(0)[:, 0]
    x_exact = torch.exp((GBM_MU - GBM_S**2 / 2) * GBM_T + GBM_S * w)
    exact = {"x": x_exact, "mu": GBM_T * x_exact, "s": (w - GBM_S * GBM_T) * x_exact}
    sde, theta = gbm_sde()
    start = ft.init(sde, theta, torch.ones(1, dtype=F64), paths)
    rows, orders, refused = [], {}, {}
    for solver in SOLVERS:
        errors: dict[str, list[float]] = {"x": [], "mu": [], "s": []}
        steps_h = []
        try:
            for level in levels:
                count = 2**level
                increments = fine.reshape(count, finest // count, paths, 1).sum(1)
                clock = time.perf_counter()
                final = ft.run(sde, start, count, GBM_T / count, 0.0, increments, solver=solver, compile=False).state
                seconds = time.perf_counter() - clock
                computed = {"x": final.x[:, 0], "mu": final.x_tilde["mu"][:, 0], "s": final.x_tilde["s"][:, 0]}
                rms = {k: float((computed[k] - exact[k]).square().mean().sqrt()) for k in exact}
                for k, v in rms.items():
                    errors[k].append(v)
                steps_h.append(GBM_T / count)
                rows.append({"solver": solver.name, "h": GBM_T / count, **{f"rms_{k}": v for k, v in rms.items()}})
                rows[-1]["seconds"] = seconds
        except ValueError as error:
            refused[solver.name] = str(error)
            continue
        orders[solver.name] = {k: fitted_order(steps_h, v) for k, v in errors.items()}
    return {"paths": paths, "rows": rows, "orders": orders, "refused": refused}


def print_strong(result: dict[str, Any]) -> None:
    print(
        f"\nstrong order: GBM dX = {GBM_MU:g} X dt + {GBM_S:g} X dW, X_0 = 1, T = {GBM_T:g}, "
        f"{result['paths']} Brownian paths refined; RMS errors at T"
    )
    print(f"{'solver':<10}{'h':>10}{'X':>12}{'dX/dmu':>12}{'dX/ds':>12}")
    for r in result["rows"]:
        print(f"{r['solver']:<10}{r['h']:>10.5f}{r['rms_x']:>12.3e}{r['rms_mu']:>12.3e}{r['rms_s']:>12.3e}")
    for name, order in result["orders"].items():
        print(f"fitted strong order, {name}: X {order['x']:.2f}, dX/dmu {order['mu']:.2f}, dX/ds {order['s']:.2f}")
    for name, message in result["refused"].items():
        print(f"{name} refuses this noise: {message[:110]}...")


# ---------------------------------------------------------------- 3. accuracy per second (seed problem)

K_STAR = math.sqrt(2.0) - 1.0


def seed_linear() -> ft.ControlledSDE:
    """The seed's dX = (-X + u) dt + dW, cost X^2 + u^2, with the linear control u = -k X, theta = {"k"}."""
    return ft.ControlledSDE(
        lambda th, x: -th["k"] * x,
        lambda x, u: -x + u,
        lambda x, u: torch.ones_like(x),
        lambda x, u: (x * x + u * u).sum(),
        noise_type="additive",
    )


def closed_form_gain_map(name: str, k: float, h: float) -> tuple[float, float]:
    """Issue 19's one-step maps of the linear-control chain: Euler a = 1 - (1+k) h, b = 1; Heun
    a = 1 - (1+k) h + (1+k)^2 h^2 / 2, b = 1 - (1+k) h / 2."""
    rate = 1 + k
    if name == "heun":
        return 1 - rate * h + (rate * h) ** 2 / 2, 1 - rate * h / 2
    return 1 - rate * h, 1.0


def discrete_optimum(cost_of_gain: Any) -> float:
    """argmin over k in (0, 1) of a smooth, convex stationary cost (bounded Brent search; the cost is flat at its
    minimum, so k is found to about 1e-7)."""
    from scipy.optimize import minimize_scalar

    found = minimize_scalar(cost_of_gain, bounds=(0.0, 1.0), method="bounded", options={"xatol": 1e-12})
    return float(found.x)


def chain_optimum(solver: Solver, h: float) -> tuple[float, float]:
    """(the gain minimising fwdtrain's chain's stationary cost, the same from the closed forms)."""
    sde = seed_linear()

    def library(k: float) -> float:
        a, b = linear_map(sde, {"k": _scalar(k)}, solver, h)
        return (1 + k * k) * chain_variance(a, b, h)

    def closed(k: float) -> float:
        return (1 + k * k) * chain_variance(*closed_form_gain_map(solver.name, k, h), h)

    return discrete_optimum(library), discrete_optimum(closed)


def train_gain(solver: Solver, h: float, particles: int, horizon: float, seed: int, compile: Any) -> dict:
    """The gain trained by ``ft.run`` from k = 0.3 (alpha = 10 / (20 + t)), its Polyak average over the
    second half, and the wall time of the run."""
    sde = seed_linear()
    state = ft.init(sde, {"k": _scalar(0.3)}, torch.zeros(1, dtype=F64), particles, average_from=horizon / 2)
    steps = round(horizon / h)
    clock = time.perf_counter()
    done = ft.run(sde, state, steps, h, ft.schedules.inverse_time(10.0, 20.0), seed, solver=solver, compile=compile)
    seconds = time.perf_counter() - clock
    return {"k_last": float(done.state.theta["k"]), "k_average": float(done.state.average.mean["k"]), "wall_s": seconds}


def accuracy(quick: bool, compile: Any) -> dict[str, Any]:
    optima = []
    for solver in (ft.Euler(), ft.Heun()):
        for h in (0.01, 0.05):
            library, closed = chain_optimum(solver, h)
            optima.append({"solver": solver.name, "h": h, "k_chain": library, "k_closed_form": closed})
    particles, horizon, seeds = (64, 4.0, 1) if quick else (10_000, 400.0, 4)
    pairs = ((ft.Heun(), 0.05), (ft.Euler(), 0.01))
    trained = []
    for solver, h in pairs:
        clock = time.perf_counter()
        train_gain(solver, h, particles, 10 * h, 0, compile)  # the kernel built (or loaded) once, timed apart
        first = time.perf_counter() - clock
        runs = [train_gain(solver, h, particles, horizon, seed, compile) for seed in range(seeds)]
        averages = [r["k_average"] for r in runs]
        chain = next(o["k_chain"] for o in optima if o["solver"] == solver.name and o["h"] == h)
        trained.append(
            {
                "solver": solver.name,
                "h": h,
                "steps": round(horizon / h),
                "k_chain": chain,
                "k_trained": statistics.mean(averages),
                "k_trained_stderr": statistics.stdev(averages) / math.sqrt(seeds) if seeds > 1 else math.nan,
                "wall_s": statistics.median(r["wall_s"] for r in runs),
                "first_call_s": first,
                "runs": runs,
            }
        )
    heun, euler = trained
    error = {r["solver"]: abs(r["k_chain"] - K_STAR) for r in trained}
    summary = {
        "error_ratio": error["euler"] / error["heun"],  # how many times closer Heun lands
        "time_ratio": heun["wall_s"] / euler["wall_s"],  # Heun's wall time over Euler's
        "accuracy_per_second_ratio": (error["euler"] * euler["wall_s"]) / (error["heun"] * heun["wall_s"]),
    }
    return {
        "k_star": K_STAR,
        "optima": optima,
        "trained": trained,
        "size": {"particles": particles, "horizon": horizon, "seeds": seeds},
        **summary,
    }


def print_accuracy(result: dict[str, Any]) -> None:
    size = result["size"]
    print(f"\naccuracy per second: dX = (-X + u) dt + dW, u = -k X, k* = {K_STAR:.6f}")
    print(f"{'solver':<8}{'h':>6}{'k of the chain':>16}{'closed form':>13}{'vs k*':>10}")
    for r in result["optima"]:
        print(
            f"{r['solver']:<8}{r['h']:>6g}{r['k_chain']:>16.6f}{r['k_closed_form']:>13.6f}"
            f"{(r['k_chain'] - K_STAR) / K_STAR:>+10.3%}"
        )
    print(
        f"training: {size['particles']} particles, t = 0..{size['horizon']:g}, alpha = 10 / (20 + t), Polyak "
        f"average over the second half, {size['seeds']} seed(s)"
    )
    print(
        f"{'solver':<8}{'h':>6}{'steps':>8}{'k of the chain':>16}{'k trained':>12}{'+-':>10}{'wall s':>9}{'first s':>9}"
    )
    for r in result["trained"]:
        print(
            f"{r['solver']:<8}{r['h']:>6g}{r['steps']:>8}{r['k_chain']:>16.6f}{r['k_trained']:>12.6f}"
            f"{r['k_trained_stderr']:>10.6f}{r['wall_s']:>9.2f}{r['first_call_s']:>9.2f}"
        )
    print(
        f"Heun h = 0.05 against Euler h = 0.01: {result['error_ratio']:.1f}x closer to k* in "
        f"{result['time_ratio']:.2f}x the wall time: {result['accuracy_per_second_ratio']:.1f}x the accuracy per second"
    )


# ---------------------------------------------------------------- 4. compiled equals eager


def _relative_difference(a: Any, b: Any) -> float:
    """max over leaves of max |a - b| / max |b|."""
    worst = 0.0
    for left, right in zip(ft.core._tree.leaves(a), ft.core._tree.leaves(b)):
        scale = float(right.abs().max()) or 1.0
        worst = max(worst, float((left - right).abs().max()) / scale)
    return worst


def compiled_equals_eager(quick: bool, compile: Any) -> dict[str, Any]:
    """For every solver and problem it takes: the same training run eager and compiled, and the compile time."""
    seed_example = ft.examples.lqr_1d(dtype=F64, particles=64)
    gbm, gbm_theta = gbm_sde()
    problems = [
        ("lqr-1d MLP", seed_example.sde, seed_example.theta, seed_example.x0, seed_example.lr, 0.01),
        ("GBM", gbm, gbm_theta, torch.ones(1, dtype=F64), 0.01, 0.01),
    ]
    steps = 20 if quick else 400
    clock = time.perf_counter()
    tiny = ft.SDE(lambda th, x: -th * x, lambda th, x: torch.ones_like(x), lambda th, x: (x * x).sum())
    tiny_state = ft.init(tiny, _scalar(1.0), torch.zeros(1, dtype=F64), 2)
    ft.run(tiny, tiny_state, 4, 0.1, 0.0, compile=compile)  # the machine's compiler set-up (probe, headers)
    setup = time.perf_counter() - clock
    rows = []
    for name, sde, theta, x0, lr, dt in problems:
        for solver in SOLVERS:
            state = ft.init(sde, theta, x0, 64)
            try:
                eager = ft.run(sde, state, steps, dt, lr, 3, solver=solver, compile=False)
            except ValueError:
                continue  # Heun and GBM: refused (shown in the strong-order table)
            before = kernels.counts()
            clock = time.perf_counter()
            compiled = ft.run(sde, state, steps, dt, lr, 3, solver=solver, compile=compile)
            first = time.perf_counter() - clock
            clock = time.perf_counter()
            ft.run(sde, state, steps, dt, lr, 3, solver=solver, compile=compile)
            again = time.perf_counter() - clock
            counts = {k: v - before.get(k, 0) for k, v in kernels.counts().items()}
            rows.append(
                {
                    "problem": name,
                    "solver": solver.name,
                    "steps": steps,
                    "max_relative_difference": _relative_difference(compiled.state, eager.state),
                    "compile_s": first - again,
                    "compiled_run_s": again,
                    "kernels": counts,
                }
            )
    return {"setup_s": setup, "rows": rows}


def print_compiled(result: dict[str, Any]) -> None:
    print(
        f"\ncompiled equals eager (float64, 64 particles, training, fresh cache; the machine's compiler set-up "
        f"took {result['setup_s']:.1f} s before these)"
    )
    print(f"{'problem':<12}{'solver':<10}{'steps':>6}{'max rel. diff':>15}{'compile s':>11}{'run s':>8}  kernels")
    for r in result["rows"]:
        built = ", ".join(f"{k} {v}" for k, v in r["kernels"].items() if v)
        print(
            f"{r['problem']:<12}{r['solver']:<10}{r['steps']:>6}{r['max_relative_difference']:>15.2e}"
            f"{r['compile_s']:>11.1f}{r['compiled_run_s']:>8.3f}  {built}"
        )


# ---------------------------------------------------------------- the study


def solver_study(quick: bool) -> dict[str, Any]:
    """Every part above; compiled kernels go to a fresh temporary cache folder (quick: torch.compile's "eager")."""
    compile = ft.Compile(True, compiler="dynamo", backend="eager") if quick else ft.Compile(True)
    previous = os.environ.get("FWDTRAIN_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="fwdtrain-solvers-") as folder:
        os.environ["FWDTRAIN_CACHE_DIR"] = folder
        try:
            result = {
                "weak": weak_order(quick),
                "strong": strong_order(quick),
                "compiled": compiled_equals_eager(quick, compile),
                "accuracy": accuracy(quick, compile),
            }
        finally:
            if previous is None:
                os.environ.pop("FWDTRAIN_CACHE_DIR", None)
            else:
                os.environ["FWDTRAIN_CACHE_DIR"] = previous
    return result


def print_study(result: dict[str, Any]) -> None:
    print_weak(result["weak"])
    print_strong(result["strong"])
    print_accuracy(result["accuracy"])
    print_compiled(result["compiled"])


__all__ = ["print_study", "solver_study"]
