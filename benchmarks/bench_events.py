"""Event streams: the exact fits of a 2-D exponential Hawkes process against an exact MLE in numpy/scipy.

    python -m benchmarks.bench_events            # ~40,000 events, a few minutes on a 2-core CPU
    python -m benchmarks.bench_events --quick    # ~800 events, seconds

The data: tick's 2-D exponential Hawkes process (baseline (0.5, 0.3), adjacency [[0.5, 0.2], [0.3, 0.4]],
decay 1.5) on [0, T], drawn by a numpy cluster (branching) simulator written here (tick's own simulator does not
import without pandas and its preprocessing package). The reference (``scipy_hawkes``): an exact MLE in vectorised
numpy/scipy, the profile likelihood over the decay by bounded Brent, each inner concave fit by L-BFGS-B with the
analytic gradient, the exponential sums by ``np.logaddexp.accumulate``. Rows, all in one run, each the best of
``--repeats`` (other jobs may share the machine): the reference, ``fit(method="batch")`` cold (the process's first
torch.func call included) and warm with its ratio to the reference, ``method="online"``, the standard errors alone
(``information``); the largest relative difference of each estimate to the reference. Then a 2-D process with
four exponentials (decays 1, 10, 100, 1000; ~10,000 events): the scipy fit at those fixed decays, fwdtrain's fit
at fixed decays and with the decays fitted, and one derivative pass with 4 fitted decays against one decay. Then
a state-dependent jump (lambda = mu + Y, jump alpha / (1 + Y / cap); ~5,000 events): fwdtrain's general engine
against a Python-loop log-likelihood with scipy's L-BFGS-B, with one log L pass and one derivative pass. Then
``simulate`` against Ogata's thinning in plain numpy (``numpy_thinning``) on the same models: the 2-D Hawkes
process (~10,000 events) and the saturating jump.
Writes JSON to benchmarks/results/bench_events.json.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import minimize

import fwdtrain as ft

from . import machine, numpy_thinning, scipy_hawkes

RESULTS = Path(__file__).resolve().parent / "results"
MU, ALPHA, BETA = np.array([0.5, 0.3]), np.array([[0.5, 0.2], [0.3, 0.4]]), 1.5


def simulate(end: float, seed: int, mu=MU, alpha=ALPHA[..., None], decays=(BETA,)) -> list[np.ndarray]:
    """Immigrants at rate mu_i; each type-j event has Poisson(alpha_iju) type-i children at Exp(b_u) delays
    (alpha (K, K, U): sum-of-exponential kernels)."""
    rng = np.random.default_rng(seed)
    k = len(mu)
    generation = [rng.uniform(0, end, rng.poisson(m * end)) for m in mu]
    out = [list(g) for g in generation]
    while any(g.size for g in generation):
        children: list[list[np.ndarray]] = [[] for _ in range(k)]
        for j, parents in enumerate(generation):
            for i in range(k):
                for u, b in enumerate(decays):
                    counts = rng.poisson(alpha[i, j, u], parents.size)
                    times = np.repeat(parents, counts) + rng.exponential(1 / b, counts.sum())
                    children[i].append(times[times < end])
        generation = [np.concatenate(c) for c in children]
        for i in range(k):
            out[i].extend(generation[i])
    return [np.sort(np.asarray(t)) for t in out]


def flat(params: dict[str, torch.Tensor], names=("baseline", "adjacency", "decay")) -> np.ndarray:
    return np.concatenate([params[k].reshape(-1).numpy() for k in names])


SCALES = (1.0, 10.0, 100.0, 1000.0)
MULTI_ALPHA = np.full((2, 2, 4), 0.06)


def multi_scale(rows: list[dict], repeats: int, end: float) -> dict:
    """The 4-decay rows: fixed decays against the scipy fit at the same decays, the decays fitted, and the cost of
    one derivative pass (jets and closed-form derivatives) with 4 fitted decays against one decay."""
    pp = ft.pointprocess
    timestamps = simulate(end, 5, MU, MULTI_ALPHA, SCALES)
    n = sum(t.size for t in timestamps)
    data = pp.from_tick(timestamps, end_time=end)
    print(f"2-D Hawkes with 4 exponentials (decays {SCALES}), {n} events on [0, {end:g}]")

    def timed(name, call, times=repeats, against=None):
        seconds, out = best(call, times)
        row = {"variant": name, "seconds": seconds, "events": n, "repeats": times}
        ratio = ""
        if against is not None:
            reference = next(r for r in rows if r["variant"] == against)["seconds"]
            row["x_faster_than"] = {against: reference / seconds}
            ratio = f"{' ' * 22}{reference / seconds:>8.2f}x"
        rows.append(row)
        print(f"{name:<44}{seconds:>9.3f} s{ratio}", flush=True)
        return out

    scipy_name = "scipy, 4 fixed decays"
    often = max(repeats, 10)  # tens of milliseconds each: the best of more runs
    mu, alpha, _, _ = timed(scipy_name, lambda: scipy_hawkes.fixed_decays(timestamps, end, SCALES), often)
    fixed = pp.hawkes(dimension=2, decays=SCALES)
    mine = timed("fwdtrain batch, 4 fixed decays", lambda: pp.fit(fixed, data), often, scipy_name)
    fitted = pp.hawkes(dimension=2, decays=SCALES, fit_decays=True)
    free = timed("fwdtrain batch, 4 decays fitted", lambda: pp.fit(fitted, data), 1)
    one = pp.hawkes(dimension=2)
    timed("one derivative pass, 1 decay", lambda: pp.information(one, one.start(data), data))
    timed("one derivative pass, 4 decays fitted", lambda: pp.information(fitted, free.params, data))
    exact = np.concatenate([mu, alpha.reshape(-1)])
    return {
        "multi_scale_events": n,
        "fixed_x_faster_than_scipy": rows[-5]["seconds"] / rows[-4]["seconds"],
        "fixed_iterations": mine.iterations,
        "fixed_max_abs_difference_to_scipy": float(
            np.max(np.abs(flat(mine.params, ("baseline", "adjacency")) - exact))
        ),
        "fitted_seconds": rows[-3]["seconds"],
        "fitted_iterations": free.iterations,
        "fitted_decays": free.params["decays"].tolist(),
        "fitted_decays_stderr": free.stderr["decays"].tolist(),
        "pass_4_decays_over_1": rows[-1]["seconds"] / rows[-2]["seconds"],
    }


def best(call, repeats: int) -> tuple[float, object]:
    """The least wall time of ``repeats`` calls (other jobs share the machine) and the last result."""
    times, out = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - started)
    return min(times), out


SATURATING = {"mu": 0.5, "alpha": 0.8, "kappa": 1.2, "cap": 2.0}


def saturating_model() -> ft.events.GeneralModel:
    """lambda = mu + Y, dY = -kappa Y dt, Y jumps by alpha / (1 + Y / cap): a jump that depends on Y."""
    return ft.pointprocess.intensity_model(
        lambda theta, y: (theta["mu"] + y).reshape(1),
        parameters={name: ft.pointprocess.Parameter((), positive=True) for name in SATURATING},
        decay=lambda theta: theta["kappa"].reshape(1),
        jump=lambda theta, y, k, z: theta["alpha"] / (1 + y / theta["cap"]),
        bound=lambda theta, y, horizon: (theta["mu"] + y + theta["alpha"]).reshape(1),
    )


def saturating_scipy(times: np.ndarray, end: float, start: np.ndarray) -> np.ndarray:
    """The saturating model's MLE as a user writes it: log L by a Python loop over the events (closed-form
    compensator), scipy's L-BFGS-B on the log parameters with its finite-difference gradient."""

    def negative(x: np.ndarray) -> float:
        mu, alpha, kappa, cap = np.exp(x)
        y = previous = value = 0.0
        for t in times.tolist():
            gap = t - previous
            fade = math.exp(-kappa * gap)
            value -= mu * gap + y * (1 - fade) / kappa
            y *= fade
            value += math.log(mu + y)
            y += alpha / (1 + y / cap)
            previous = t
        gap = end - previous
        return -(value - mu * gap - y * (1 - math.exp(-kappa * gap)) / kappa)

    return np.exp(minimize(negative, np.log(start), method="L-BFGS-B").x)


def state_dependent(rows: list[dict], repeats: int, end: float) -> dict:
    """The saturating model (a general model: Newton over the events for the path, the gradient and Hessian by
    the adjoint of the recursion, no Python per event) against scipy; one log L pass and one derivative pass
    (``information``: log L's gradient and Hessian) beside them."""
    pp = ft.pointprocess
    model = saturating_model()
    truth = {name: torch.tensor(value, dtype=torch.float64) for name, value in SATURATING.items()}
    data = pp.simulate(model, truth, end, seed=2)
    n = data.events
    times = data.times[data.mask].numpy()
    start = {"mu": 0.6, "alpha": 0.7, "kappa": 1.0, "cap": 1.5}
    print(f"state-dependent jump (lambda = mu + Y, jump alpha / (1 + Y / cap)), {n} events on [0, {end:g}]")
    out = {}
    scipy_name, fit_name = "scipy L-BFGS-B, Python-loop log L", "fwdtrain batch (general engine)"
    for name, call in (
        (scipy_name, lambda: saturating_scipy(times, end, np.array(list(start.values())))),
        (fit_name, lambda: pp.fit(model, data, start=start)),
        ("fwdtrain one pass (log L)", lambda: pp.log_likelihood(model, truth, data)),
        ("fwdtrain one derivative pass (information)", lambda: pp.information(model, truth, data)),
    ):
        seconds, out[name] = best(call, repeats)
        rows.append({"variant": name, "seconds": seconds, "events": n, "repeats": repeats})
        print(f"{name:<44}{seconds:>9.3f} s", flush=True)
    seconds = {row["variant"]: row["seconds"] for row in rows[-4:]}
    mine = out[fit_name]
    exact = np.array([float(mine.params[k]) for k in SATURATING])
    return {
        "state_dependent_events": n,
        "state_dependent_fit_over_scipy_time": seconds[fit_name] / seconds[scipy_name],
        "state_dependent_max_relative_difference": float(np.max(np.abs(exact / out[scipy_name] - 1))),
        "state_dependent_iterations": mine.iterations,
        "state_dependent_derivative_pass_over_log_likelihood_pass": rows[-1]["seconds"] / rows[-2]["seconds"],
    }


def simulation(rows: list[dict], repeats: int, quick: bool) -> dict:
    """``simulate`` against a plain numpy thinning (``numpy_thinning``), same model and window: the 2-D Hawkes
    process (~10,000 events; quick ~800) and the saturating state-dependent jump (~5,000; quick ~250)."""
    pp = ft.pointprocess
    hawkes_end, saturating_end = (300.0, 200.0) if quick else (3_600.0, 4_000.0)
    theta = {"baseline": MU, "adjacency": ALPHA, "decay": BETA}
    model = saturating_model()
    cases = (
        (
            "2-D Hawkes",
            hawkes_end,
            lambda: pp.simulate(pp.hawkes(dimension=2), theta, hawkes_end, seed=1),
            lambda: numpy_thinning.hawkes(MU, ALPHA[..., None], np.array([BETA]), hawkes_end, 1),
        ),
        (
            "saturating jump",
            saturating_end,
            lambda: pp.simulate(model, SATURATING, saturating_end, seed=1),
            lambda: numpy_thinning.saturating(**SATURATING, end=saturating_end, seed=1),
        ),
    )
    summary = {}
    for name, end, mine, reference in cases:
        numpy_seconds, drawn = best(reference, repeats)
        seconds, data = best(mine, repeats)
        count = sum(t.size for t in drawn) if isinstance(drawn, list) else drawn.size
        for variant, time_s, n in (
            ("numpy thinning", numpy_seconds, count),
            ("fwdtrain simulate", seconds, data.events),
        ):
            rows.append({"variant": f"{variant} ({name})", "seconds": time_s, "events": n, "repeats": repeats})
        rows[-1]["x_faster_than"] = {rows[-2]["variant"]: numpy_seconds / seconds}
        print(
            f"simulate, {name} on [0, {end:g}]: numpy thinning {numpy_seconds:.3f} s ({count} events), "
            f"fwdtrain {seconds:.3f} s ({data.events} events), {numpy_seconds / seconds:.2f}x",
            flush=True,
        )
        summary[f"simulate_{name.replace(' ', '_').replace('-', '')}_x_faster_than_numpy"] = numpy_seconds / seconds
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~800 events")
    parser.add_argument("--end", type=float, default=None, help="the window's end (14,500: ~40,000 events)")
    parser.add_argument("--repeats", type=int, default=None, help="timings: the best of this many runs (3; quick: 1)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--multi-end", type=float, default=None, help="the 4-decay window (6,500: ~10,000 events)")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_events.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.repeats = args.repeats or (1 if args.quick else 3)
    end = args.end or (300.0 if args.quick else 14_500.0)
    before = machine.describe()
    timestamps = simulate(end, 11)
    n = sum(t.size for t in timestamps)
    pp = ft.pointprocess
    model = pp.hawkes(dimension=2)
    data = pp.from_tick(timestamps, end_time=end)
    rows: list[dict] = []

    def timed(name: str, call, repeats: int = args.repeats, against: str | None = None):
        seconds, out = best(call, repeats)
        row = {"variant": name, "seconds": seconds, "events_per_s": n / seconds, "repeats": repeats}
        if against is not None:
            reference = next(r for r in rows if r["variant"] == against)
            row["x_faster_than"] = {against: reference["seconds"] / seconds}
        rows.append(row)
        ratio = f"{row['x_faster_than'][against]:>8.2f}x" if against else ""
        print(f"{name:<44}{seconds:>9.3f} s{n / seconds:>12,.0f} events/s{ratio}", flush=True)
        return out

    print(f"2-D exponential Hawkes, {n} events on [0, {end:g}]; best of {args.repeats}")
    scipy_name = "numpy/scipy exact MLE (profile over decay)"
    reference = timed(scipy_name, lambda: scipy_hawkes.shared_decay(timestamps, end))
    cold = timed("fwdtrain batch (cold)", lambda: pp.fit(model, data), 1, scipy_name)
    warm = timed("fwdtrain batch (warm)", lambda: pp.fit(model, data), against=scipy_name)
    online = timed("fwdtrain online", lambda: pp.fit(model, data, method="online"), 1)
    information = timed("fwdtrain standard errors", lambda: pp.information(model, warm.params, data))
    mu, alpha, beta, _ = reference
    exact = np.concatenate([mu, alpha.reshape(-1), [beta]])
    for row, result in zip(rows[1:4], (cold, warm, online), strict=True):
        row["max_relative_difference_to_scipy"] = float(np.max(np.abs(flat(result.params) / exact - 1)))
    covariance = np.linalg.inv(information.numpy())
    summary = {
        "events": n,
        "warm_batch_x_faster_than_scipy": rows[0]["seconds"] / rows[2]["seconds"],
        "max_relative_difference_batch_scipy": rows[2]["max_relative_difference_to_scipy"],
        "batch_iterations": warm.iterations,
        "stderr": flat(warm.stderr).tolist(),
        "stderr_from_information": np.sqrt(np.diag(covariance)).tolist(),
        "online_z_to_batch": (np.abs(flat(online.params) - flat(warm.params)) / flat(warm.stderr)).tolist(),
    }
    summary.update(multi_scale(rows, args.repeats, args.multi_end or (100.0 if args.quick else 6_500.0)))
    summary.update(state_dependent(rows, args.repeats, 200.0 if args.quick else 5_000.0))
    summary.update(simulation(rows, args.repeats, args.quick))
    print(json.dumps(summary))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": before, "rows": rows, "summary": summary}, indent=1))
    print(machine.caption(before))


if __name__ == "__main__":
    main()
