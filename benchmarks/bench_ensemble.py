"""Ensemble throughput: E members of lqr-1d as one vmapped, fused, compiled run against E sequential runs.

    python -m benchmarks.bench_ensemble            # E = 16, the default lqr-1d (N = 256) and N = 1; minutes
    python -m benchmarks.bench_ensemble --quick    # E = 2, N = 4, few steps, backend "eager" (seconds)

Every variant runs K-step fused compiled kernels (``fwdtrain.compile_steps``) on the members'
own noise (``BrownianNoise(seed = e)``, drawn inside the timed loop), theta0 from seed e and the
problem's schedule: "ensemble" is ``compile_steps(Ensemble(sde, E), ...)`` on the stacked state,
"sequential" is E single runs one after the other (one compiled kernel, reused), "single" is
one of them. The table gives steps/s per member (member-steps/s: E x steps / seconds) and the
ratio to the sequential runs; compile time is reported apart. Medians over rounds. Writes JSON
to benchmarks/results/bench_ensemble.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

import fwdtrain as ft
from fwdtrain import ensemble

RESULTS = Path(__file__).resolve().parent / "results"


def _timed(fn) -> tuple[object, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _advance(kernel, state, source, steps: int, fuse: int):
    """``steps`` steps of a fused kernel, drawing its noise as it goes."""
    for _ in range(steps // fuse):
        state, _ = kernel(state, source.draw(fuse))
    return state


def measure(members: int, particles: int, steps: int, fuse: int, rounds: int, backend: str) -> list[dict]:
    examples = [ft.examples.lqr_1d(particles=particles, seed=e) for e in range(members)]
    sde, dt, lr = examples[0].sde, examples[0].dt, examples[0].lr
    states = [ft.init(sde, ex.theta, ex.x0, particles) for ex in examples]
    stacked = ensemble.stack(states)
    m = ft.core.state.noise_dim(sde, states[0].theta, states[0].x)

    def noise(e: int) -> ft.BrownianNoise:
        return ft.noise.BrownianNoise((particles, m), dt, seed=e)

    single = ft.compile_steps(sde, dt, lr, "reverse", fuse, backend=backend)
    batched = ft.compile_steps(
        ensemble.Ensemble(sde, members), dt, ensemble.rates(lr, members), "reverse", fuse, backend=backend
    )
    _, single_compile = _timed(lambda: single(states[0], noise(0).draw(fuse)))
    _, batched_compile = _timed(
        lambda: batched(stacked, ensemble.EnsembleNoise([noise(e) for e in range(members)]).draw(fuse))
    )
    times: dict[str, list[float]] = {"single": [], "sequential": [], "ensemble": []}
    for _ in range(rounds):
        _, seconds = _timed(lambda: _advance(single, states[0], noise(0), steps, fuse))
        times["single"].append(seconds)
        _, seconds = _timed(lambda: [_advance(single, states[e], noise(e), steps, fuse) for e in range(members)])
        times["sequential"].append(seconds)
        final, seconds = _timed(
            lambda: _advance(batched, stacked, ensemble.EnsembleNoise([noise(e) for e in range(members)]), steps, fuse)
        )
        times["ensemble"].append(seconds)
    alone = _advance(single, states[-1], noise(members - 1), steps, fuse)
    agree = max(
        float((a - b).abs().max())
        for a, b in zip(ft.core._tree.leaves(ensemble.member(final, members - 1)), ft.core._tree.leaves(alone))
    )
    runs = {"single": 1, "sequential": members, "ensemble": members}
    median = {name: statistics.median(values) for name, values in times.items()}
    sequential_rate = members * steps / median["sequential"]
    rows = []
    for name, seconds in median.items():
        rate = runs[name] * steps / seconds
        rows.append(
            {
                "variant": name,
                "members": runs[name],
                "particles": particles,
                "steps": steps,
                "fuse": fuse,
                "seconds": seconds,
                "member_steps_per_s": rate,
                "vs_sequential": rate / sequential_rate,
                "compile_s": {"single": single_compile, "sequential": single_compile, "ensemble": batched_compile}[
                    name
                ],
                "max_member_difference": agree,
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        f"{'work':<16}{'variant':<12}{'members':>8}{'seconds':>10}{'member-steps/s':>16}{'vs sequential':>15}"
        f"{'compile s':>11}"
    ]
    for row in rows:
        lines.append(
            f"{'lqr-1d N=' + str(row['particles']):<16}{row['variant']:<12}{row['members']:>8}"
            f"{row['seconds']:>10.3f}{row['member_steps_per_s']:>16,.0f}{row['vs_sequential']:>14.2f}x"
            f"{row['compile_s']:>11.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes and backend 'eager' (seconds)")
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--particles", default="256,1", help="comma-separated N (default: the problem's 256, and 1)")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--fuse", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_ensemble.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    backend = "inductor"
    if args.quick:
        args.members, args.particles, args.steps, args.fuse, args.rounds, backend = 2, "4", 16, 4, 1, "eager"
    rows = []
    for particles in (int(n) for n in args.particles.split(",")):
        rows += measure(args.members, particles, args.steps, args.fuse, args.rounds, backend)
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "rows": rows,
                "backend": backend,
                "threads": torch.get_num_threads(),
                "machine": platform.processor() or platform.machine(),
                "cpus": os.cpu_count(),
                "torch": torch.__version__,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
