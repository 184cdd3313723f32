"""Memory stays flat: resident set size over a long run of fwdtrain steps (default 10^6).

    python -m benchmarks.bench_memory                 # 10^6 steps, seed 1-D LQR, N = 1, fused K-step calls
    python -m benchmarks.bench_memory --quick         # 500 eager steps, seconds

Samples the current RSS (/proc/self/statm) 50 times over the run, after a warm-up
(compilation, first allocations), and reports the RSS after warm-up, the maximum,
the final value, the peak RSS of the process (ru_maxrss) and the least-squares slope
over the second half of the run in KiB per 10^5 steps (flat memory: |slope| ~ 0).
Writes JSON to benchmarks/results/bench_memory.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import time
from pathlib import Path

import torch

import fwdtrain as ft
from fwdtrain.compiled import compile_advance, compile_steps
from fwdtrain.core.kernel import advance, resolve_step_mode

from . import problems

RESULTS = Path(__file__).resolve().parent / "results"
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") / 1024


def rss_kib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_KIB


def slope_kib_per_100k(points: list[tuple[int, float]]) -> float:
    n = len(points)
    mean_s = sum(s for s, _ in points) / n
    mean_r = sum(r for _, r in points) / n
    var = sum((s - mean_s) ** 2 for s, _ in points)
    cov = sum((s - mean_s) * (r - mean_r) for s, r in points)
    return 1e5 * cov / var if var else 0.0


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--particles", type=int, default=1)
    parser.add_argument(
        "--variant", choices=("fused", "compiled", "eager"), default=None, help="default: fused (eager if --quick)"
    )
    parser.add_argument("--chunk", type=int, default=None, help="steps per fused call / noise block")
    parser.add_argument("--backend", default=None)
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_memory.json")
    args = parser.parse_args(argv)
    steps = args.steps or (500 if args.quick else 1_000_000)
    args.variant = args.variant or ("eager" if args.quick else "fused")
    chunk = args.chunk or (4 if args.quick else 8)
    backend = args.backend or ("eager" if args.quick else "inductor")
    steps = math.ceil(steps / chunk) * chunk

    problem = problems.lqr("lqr-1d")
    sde, dt = problem.sde, problem.dt
    lr = ft.schedules.staged(problem.lr)
    state = ft.init(sde, problem.theta, problem.x0, args.particles)
    m = ft.core.state.noise_dim(sde, state.theta, state.x)
    mode = resolve_step_mode("auto", state, m)
    generator = torch.Generator().manual_seed(0)

    if args.variant == "fused":
        fused = compile_steps(sde, dt, lr, mode, chunk, backend=backend)

        def run_chunk(state, noise):
            return fused(state, noise)
    else:
        one = (
            compile_advance(sde, dt, mode, backend=backend)
            if args.variant == "compiled"
            else (lambda s, dw, a: advance(sde, s, dw, dt, a, mode))
        )

        def run_chunk(state, noise):
            for dw in noise:
                state, info = one(state, dw, lr(state.t))
            return state, info

    def noise():
        return torch.randn((chunk, args.particles, m), generator=generator) * math.sqrt(dt)

    start = time.perf_counter()
    for _ in range(4):  # warm-up: compilation and the first allocations
        state, _ = run_chunk(state, noise())
    warmup_s = time.perf_counter() - start
    rss0 = rss_kib()
    samples = [(0, rss0)]
    every = max(1, steps // chunk // 50)
    start = time.perf_counter()
    for i in range(1, steps // chunk + 1):
        state, _ = run_chunk(state, noise())
        if i % every == 0:
            samples.append((i * chunk, rss_kib()))
    elapsed = time.perf_counter() - start
    second_half = [p for p in samples if p[0] >= steps // 2] or samples
    result = {
        "variant": args.variant,
        "backend": backend,
        "chunk": chunk,
        "particles": args.particles,
        "steps": steps,
        "warmup_s": warmup_s,
        "seconds": elapsed,
        "steps_per_s": steps / elapsed,
        "rss_after_warmup_mib": rss0 / 1024,
        "rss_max_mib": max(r for _, r in samples) / 1024,
        "rss_final_mib": samples[-1][1] / 1024,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "slope_kib_per_100k_steps": slope_kib_per_100k(second_half),
        "final_t": float(state.t),
        "samples": samples,
    }
    print(
        f"{args.variant} ({backend}, chunk {chunk}), N = {args.particles}: {steps:,} steps in {elapsed:.1f} s "
        f"({steps / elapsed:,.0f} steps/s) after {warmup_s:.1f} s warm-up"
    )
    print(
        f"RSS after warm-up {result['rss_after_warmup_mib']:.1f} MiB, max {result['rss_max_mib']:.1f} MiB, "
        f"final {result['rss_final_mib']:.1f} MiB, process peak {result['peak_rss_mib']:.1f} MiB; "
        f"slope over the second half {result['slope_kib_per_100k_steps']:+.1f} KiB per 10^5 steps"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
