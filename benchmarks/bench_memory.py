"""Memory stays flat: resident set size over one long ``fwdtrain.run`` (default 10^6 steps).

    python -m benchmarks.bench_memory                 # 10^6 compiled steps, seed 1-D LQR, N = 1 (a minute)
    python -m benchmarks.bench_memory --quick         # 500 eager steps, seconds

A warm-up run (compilation, first allocations) is continued by one ``ft.run`` of ``--steps`` steps
with a ``Callback`` hook that samples the current RSS (/proc/self/statm) 50 times. Records every
``--record-every`` steps (default: 100 records in all, so the history's own growth stays below a
page) and the default checks (every 100 steps). Reports the RSS after warm-up, the maximum, the
final value, the peak RSS of the process (ru_maxrss) and the least-squares slope over the second
half of the run in KiB per 10^5 steps (flat memory: |slope| ~ 0).
Writes JSON to benchmarks/results/bench_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import torch

import fwdtrain as ft
from fwdtrain.driver.hooks import Callback

from . import machine, problems

RESULTS = Path(__file__).resolve().parent / "results"
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") / 1024


def rss_kib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_KIB


def slope_kib_per_100k(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of RSS (KiB) against the step count, per 10^5 steps."""
    n = len(points)
    mean_s = sum(s for s, _ in points) / n
    mean_r = sum(r for _, r in points) / n
    var = sum((s - mean_s) ** 2 for s, _ in points)
    cov = sum((s - mean_s) * (r - mean_r) for s, r in points)
    return 1e5 * cov / var if var else 0.0


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 eager steps")
    parser.add_argument("--steps", type=int, default=None, help="steps of the measured run (default 10^6)")
    parser.add_argument("--particles", type=int, default=1)
    parser.add_argument("--variant", choices=("compiled", "eager"), help="default compiled; quick: eager")
    parser.add_argument("--chunk", type=int, default=None, help="Compile(chunk=...): noise steps drawn at once")
    parser.add_argument("--record-every", type=int, default=None, help="SaveAt(every=...) (default steps / 100)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_memory.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    steps = args.steps or (500 if args.quick else 1_000_000)
    variant = args.variant or ("eager" if args.quick else "compiled")
    compile = ft.Compile(variant == "compiled", chunk=args.chunk or 1024)
    record_every = args.record_every or max(1, steps // 100)

    before = machine.describe()
    problem = problems.lqr("lqr-1d")
    lr = ft.schedules.staged(problem.lr)
    state = ft.init(problem.sde, problem.theta, problem.x0, args.particles)

    start = time.perf_counter()
    warm = ft.run(problem.sde, state, 4 * 1024 if not args.quick else 20, problem.dt, lr, 0, compile=compile)
    warmup_s = time.perf_counter() - start

    rss0 = rss_kib()
    samples: list[tuple[int, float]] = [(0, rss0)]
    first = warm.history.steps

    def sample(n: int, _state: Any) -> None:
        samples.append((n - first, rss_kib()))

    start = time.perf_counter()
    final = ft.run(
        problem.sde,
        warm,
        steps,
        problem.dt,
        lr,
        0,
        save=ft.SaveAt(every=record_every),
        compile=compile,
        hooks=(Callback(sample, every=max(1, steps // 50)),),
    )
    elapsed = time.perf_counter() - start
    samples.append((steps, rss_kib()))
    second_half = [p for p in samples if p[0] >= steps // 2] or samples
    result = {
        "variant": variant,
        "chunk": compile.chunk,
        "particles": args.particles,
        "steps": steps,
        "record_every": record_every,
        "records": len(final.history.step),
        "warmup_s": warmup_s,
        "seconds": elapsed,
        "steps_per_s": steps / elapsed,
        "rss_after_warmup_mib": rss0 / 1024,
        "rss_max_mib": max(r for _, r in samples) / 1024,
        "rss_final_mib": samples[-1][1] / 1024,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "slope_kib_per_100k_steps": slope_kib_per_100k(second_half),
        "final_t": float(final.state.t),
        "machine": {**before, "load_average_after": os.getloadavg()},
        "samples": samples,
    }
    print(machine.caption(before, result["machine"]["load_average_after"]))
    print(
        f"{variant} (chunk {compile.chunk}), N = {args.particles}: {steps:,} steps in {elapsed:.1f} s "
        f"({steps / elapsed:,.0f} steps/s) after {warmup_s:.1f} s warm-up; {result['records']} records"
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
