"""Event streams: the exact fits of a 2-D exponential Hawkes process against an exact MLE in numpy/scipy.

    python -m benchmarks.bench_events            # ~40,000 events, a few minutes on a 2-core CPU
    python -m benchmarks.bench_events --quick    # ~800 events, seconds

The data: tick's 2-D exponential Hawkes process (baseline (0.5, 0.3), adjacency [[0.5, 0.2], [0.3, 0.4]],
decay 1.5) on [0, T], drawn by a numpy cluster (branching) simulator written here. The reference: the exact
log-likelihood and its analytic gradient by the O(n) recursion over the events in plain Python floats,
maximised by scipy's L-BFGS-B from the truth (the way one writes it by hand). Rows, all in one run:
``pointprocess.fit(method="batch")`` cold (the process's first torch.func call included) and warm,
``method="online"``, the standard errors alone (``pointprocess.information`` and its inverse), and the scipy
MLE; with events/s and the largest relative difference of each estimate to the scipy MLE. Writes JSON to
benchmarks/results/bench_events.json.
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

from . import machine

RESULTS = Path(__file__).resolve().parent / "results"
MU, ALPHA, BETA = np.array([0.5, 0.3]), np.array([[0.5, 0.2], [0.3, 0.4]]), 1.5


def simulate(end: float, seed: int) -> list[np.ndarray]:
    """Immigrants at rate mu_i; each type-j event has Poisson(alpha_ij) type-i children at Exp(beta) delays."""
    rng = np.random.default_rng(seed)
    generation = [rng.uniform(0, end, rng.poisson(m * end)) for m in MU]
    out = [list(g) for g in generation]
    while any(g.size for g in generation):
        children: list[list[np.ndarray]] = [[], []]
        for j, parents in enumerate(generation):
            for i in range(2):
                counts = rng.poisson(ALPHA[i, j], parents.size)
                times = np.repeat(parents, counts) + rng.exponential(1 / BETA, counts.sum())
                children[i].append(times[times < end])
        generation = [np.concatenate(c) for c in children]
        for i in range(2):
            out[i].extend(generation[i])
    return [np.sort(np.asarray(t)) for t in out]


def scipy_mle(timestamps: list[np.ndarray], end: float) -> np.ndarray:
    """(mu, alpha row-major, beta) maximising log L by L-BFGS-B with the recursion's analytic gradient."""
    times = np.concatenate(timestamps)
    kinds = np.concatenate([np.full(len(t), j) for j, t in enumerate(timestamps)])
    order = np.argsort(times, kind="stable")
    times, kinds = times[order], kinds[order]
    n = times.size

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        mu, alpha, beta = x[:2], x[2:6].reshape(2, 2), x[6]
        r, dr = [0.0, 0.0], [0.0, 0.0]
        value, g_mu, g_alpha, g_beta = 0.0, np.zeros(2), np.zeros((2, 2)), 0.0
        previous, last = 0.0, -1
        for t, i in zip(times.tolist(), kinds.tolist(), strict=True):
            delta = t - previous
            fade = math.exp(-beta * delta)
            for j in range(2):
                jumped = r[j] + (1.0 if j == last else 0.0)
                dr[j] = fade * dr[j] - delta * fade * jumped
                r[j] = fade * jumped
            rate = mu[i] + beta * (alpha[i, 0] * r[0] + alpha[i, 1] * r[1])
            value += math.log(rate)
            g_mu[i] += 1 / rate
            for j in range(2):
                g_alpha[i, j] += beta * r[j] / rate
                g_beta += alpha[i, j] * (r[j] + beta * dr[j]) / rate
            previous, last = t, i
        tails = np.exp(-beta * (end - times))
        for j in range(2):
            mine = kinds == j
            integral, d_integral = float((1 - tails[mine]).sum()), float(((end - times[mine]) * tails[mine]).sum())
            value -= alpha[:, j].sum() * integral
            g_alpha[:, j] -= integral
            g_beta -= alpha[:, j].sum() * d_integral
        value -= mu.sum() * end
        g_mu -= end
        gradient = np.concatenate([g_mu, g_alpha.reshape(-1), [g_beta]])
        return -value / n, -gradient / n

    start = np.concatenate([MU, ALPHA.reshape(-1), [BETA]])
    options = {"ftol": 1e-15, "gtol": 1e-11, "maxiter": 2000, "maxcor": 30}
    return minimize(objective, start, jac=True, method="L-BFGS-B", bounds=[(1e-8, None)] * 7, options=options).x


def flat(params: dict[str, torch.Tensor]) -> np.ndarray:
    return np.concatenate([params[k].reshape(-1).numpy() for k in ("baseline", "adjacency", "decay")])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~800 events")
    parser.add_argument("--end", type=float, default=None, help="the window's end (14,500: ~40,000 events)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_events.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    end = args.end or (300.0 if args.quick else 14_500.0)
    before = machine.describe()
    timestamps = simulate(end, 11)
    n = sum(t.size for t in timestamps)
    pp = ft.pointprocess
    model = pp.hawkes(dimension=2)
    data = pp.from_tick(timestamps, end_time=end)
    rows = []

    def timed(name: str, call):
        started = time.perf_counter()
        out = call()
        seconds = time.perf_counter() - started
        rows.append({"variant": name, "seconds": seconds, "events_per_s": n / seconds})
        print(f"{name:<34}{seconds:>10.3f} s{n / seconds:>14,.0f} events/s", flush=True)
        return out

    print(f"2-D exponential Hawkes, {n} events on [0, {end:g}]")
    cold = timed("fwdtrain batch (cold)", lambda: pp.fit(model, data))
    warm = timed("fwdtrain batch (warm)", lambda: pp.fit(model, data))
    online = timed("fwdtrain online", lambda: pp.fit(model, data, method="online"))
    information = timed("fwdtrain standard errors", lambda: pp.information(model, warm.params, data))
    reference = timed("numpy/scipy exact MLE (L-BFGS-B)", lambda: scipy_mle(timestamps, end))
    covariance = np.linalg.inv(information.numpy())
    for row, result in zip(rows, (cold, warm, online, None, None), strict=True):
        if result is not None:
            row["max_relative_difference_to_scipy"] = float(np.max(np.abs(flat(result.params) / reference - 1)))
    summary = {
        "events": n,
        "batch_over_scipy_time": rows[0]["seconds"] / rows[4]["seconds"],
        "max_relative_difference_batch_scipy": rows[1]["max_relative_difference_to_scipy"],
        "stderr": flat(warm.stderr).tolist(),
        "stderr_from_information": np.sqrt(np.diag(covariance)).tolist(),
        "online_z_to_truth": (
            np.abs(flat(online.params) - np.concatenate([MU, ALPHA.reshape(-1), [BETA]])) / flat(online.stderr)
        ).tolist(),
    }
    print(json.dumps(summary))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": before, "rows": rows, "summary": summary}, indent=1))
    print(machine.caption(before))


if __name__ == "__main__":
    main()
