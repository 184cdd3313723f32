"""Derivative strategies for D h = h_x Xtilde + h_theta, eager, side by side (one vmapped linearisation).

    python -m benchmarks.bench_strategies [--quick]

- partial-jacrev:    fwdtrain's reverse mode: jacrev over (theta, x), then h_x Xtilde + h_theta.
- composed-jacrev:   jacrev of theta' -> h(x + Xtilde (theta' - theta), theta') (ALGORITHM.md's single pass).
- composed-jacfwd:   fwdtrain's forward mode: jacfwd of the same composed function.
- partial-jacrev, diffusion skipped: as partial-jacrev but without differentiating sigma,
  the saving available when sigma depends on neither x nor theta (constant noise, as in these LQRs).

Prints ms per linearisation of all N particles and writes benchmarks/results/bench_strategies.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from torch.func import jacrev, vmap

import fwdtrain as ft
from fwdtrain.core._tree import tree_map
from fwdtrain.core.problem import Coefficients
from fwdtrain.core.sensitivity import linearise

from . import machine, problems

RESULTS = Path(__file__).resolve().parent / "results"


def _composed(coefficients, theta, x, x_tilde, jacobian):
    def along_sensitivity(theta_prime):
        shift = tree_map(torch.sub, theta_prime, theta)
        out = Coefficients(*coefficients(theta_prime, x + ft.core._tree.contract(x_tilde, shift)))
        return out, out

    return jacobian(along_sensitivity, has_aux=True)(theta)


def _partial_without_sigma(coefficients, theta, x, x_tilde):
    def evaluate(theta_, x_):
        out = Coefficients(*coefficients(theta_, x_))
        return (out.mu, out.cost), out

    ((mu_theta, mu_x), (c_theta, c_x)), value = jacrev(evaluate, argnums=(0, 1), has_aux=True)(theta, x)
    d_mu = tree_map(lambda h, xt: h + torch.tensordot(mu_x, xt, dims=1), mu_theta, x_tilde)
    d_c = tree_map(lambda h, xt: h + torch.tensordot(c_x, xt, dims=1), c_theta, x_tilde)
    return value, d_mu, d_c


STRATEGIES = {
    "partial-jacrev": lambda c, th, x, xt: linearise(c, th, x, xt, "reverse"),
    "composed-jacrev": lambda c, th, x, xt: _composed(c, th, x, xt, jacrev),
    "composed-jacfwd": lambda c, th, x, xt: linearise(c, th, x, xt, "forward"),
    "partial-jacrev, diffusion skipped": _partial_without_sigma,
}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_strategies.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    before = machine.describe()
    sizes = [("lqr-1d", 2), ("lqr-3d", 4)] if args.quick else [("lqr-1d", 1), ("lqr-1d", 10_000), ("lqr-10d", 256)]
    repeats = 3 if args.quick else 7
    rows = []
    for name, particles in sizes:
        problem = problems.lqr(name)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(particles, problem.x0.shape[0], generator=gen)
        x_tilde = tree_map(
            lambda leaf: 0.1 * torch.randn(particles, x.shape[1], *leaf.shape, generator=gen), problem.theta
        )
        strategies = dict(STRATEGIES)
        if ft.core._tree.size(problem.theta) > 200:  # p forward passes: what mode="auto" avoids (50 s per call at 10-D)
            strategies.pop("composed-jacfwd")
        calls = {
            k: (lambda fn=fn: vmap(lambda xi, xti: fn(problem.sde.coefficients, problem.theta, xi, xti))(x, x_tilde))
            for k, fn in strategies.items()
        }
        samples: dict[str, list[float]] = {k: [] for k in calls}
        for call in calls.values():
            call()
        for _ in range(repeats):  # round-robin, so load changes hit every strategy alike
            for k, call in calls.items():
                start = time.perf_counter()
                with torch.no_grad():
                    call()
                samples[k].append(1e3 * (time.perf_counter() - start))
        for k, v in samples.items():
            rows.append({"work": f"{name} N={particles}", "strategy": k, "ms": statistics.median(v), "samples_ms": v})
    print(f"{'work':<18}{'strategy':<36}{'ms per linearisation':>22}")
    for r in rows:
        print(f"{r['work']:<18}{r['strategy']:<36}{r['ms']:>22.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    after = os.getloadavg()
    print(machine.caption(before, after))
    payload = {"quick": args.quick, "machine": {**before, "load_average_after": after}, "rows": rows}
    args.out.write_text(json.dumps(payload, indent=2))
    print(f"wrote {args.out}")
    return {"rows": rows}


if __name__ == "__main__":
    main()
