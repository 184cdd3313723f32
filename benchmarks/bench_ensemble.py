"""Ensemble throughput: E members of lqr-1d as one vmapped, compiled ``fwdtrain.run`` against E sequential runs.

    python -m benchmarks.bench_ensemble            # E = 16, the default lqr-1d (N = 256) and N = 1; minutes
    python -m benchmarks.bench_ensemble --quick    # E = 2, N = 4, few steps, torch.compile's "eager" (seconds)

Every variant is ``ft.run(..., compile=True)`` of ``--steps`` steps from the members' initial states
(theta0 from seed e, noise ``noise=e``, alpha = 10 / (20 + t), 2 / (20 + t) at N = 1 where 4 of 16 members
diverge with the larger rate, default records and checks):
"ensemble" is one run of ``ft.ensemble.Ensemble(sde, E)`` on the stacked state (``noise=0``: member
e draws seed e), "sequential" is E single runs one after the other (one compiled kernel, reused),
"single" is one of them. The table gives steps/s per member (member-steps/s: E x steps / seconds)
and the ratio to the sequential runs; the first call of each kind (compile or load) is reported
apart. Medians over rounds. Writes JSON to benchmarks/results/bench_ensemble.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import fwdtrain as ft
from fwdtrain import ensemble

from . import machine

RESULTS = Path(__file__).resolve().parent / "results"
LR_SCALE, LR_SCALE_ONE = 10.0, 2.0  # alpha = scale / (20 + t): the problem's default, and for N = 1


def _timed(fn) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def measure(members: int, particles: int, steps: int, rounds: int, compile: ft.Compile) -> list[dict]:
    scale = LR_SCALE if particles > 1 else LR_SCALE_ONE  # one particle: 4 of 16 members diverge with 10 / (20 + t)
    examples = [ft.examples.lqr_1d(particles=particles, seed=e, lr=scale) for e in range(members)]
    sde, dt, lr = examples[0].sde, examples[0].dt, examples[0].lr
    states = [ft.init(sde, ex.theta, ex.x0, particles) for ex in examples]
    stacked = ensemble.stack(states)
    problem = ensemble.Ensemble(sde, members)

    def single(e: int) -> ft.State:
        return ft.run(sde, states[e], steps, dt, lr, e, compile=compile).state

    def batched() -> ft.State:
        return ft.run(problem, stacked, steps, dt, lr, 0, compile=compile).state

    _, single_first = _timed(lambda: single(0))
    _, batched_first = _timed(batched)
    times: dict[str, list[float]] = {"single": [], "sequential": [], "ensemble": []}
    final = stacked
    for _ in range(rounds):
        _, seconds = _timed(lambda: single(0))
        times["single"].append(seconds)
        _, seconds = _timed(lambda: [single(e) for e in range(members)])
        times["sequential"].append(seconds)
        final, seconds = _timed(batched)
        times["ensemble"].append(seconds)
    alone = single(members - 1)
    agree = max(
        float((a - b).abs().max())
        for a, b in zip(ft.core._tree.leaves(ensemble.member(final, members - 1)), ft.core._tree.leaves(alone))
    )
    runs = {"single": 1, "sequential": members, "ensemble": members}
    first = {"single": single_first, "sequential": single_first, "ensemble": batched_first}
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
                "lr_scale": scale,
                "seconds": seconds,
                "samples_s": times[name],
                "member_steps_per_s": rate,
                "vs_sequential": rate / sequential_rate,
                "first_call_s": first[name],
                "max_member_difference": agree,
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        f"{'work':<16}{'variant':<12}{'members':>8}{'seconds':>10}{'member-steps/s':>16}{'vs sequential':>15}"
        f"{'first s':>9}"
    ]
    for row in rows:
        lines.append(
            f"{'lqr-1d N=' + str(row['particles']):<16}{row['variant']:<12}{row['members']:>8}"
            f"{row['seconds']:>10.3f}{row['member_steps_per_s']:>16,.0f}{row['vs_sequential']:>14.2f}x"
            f"{row['first_call_s']:>9.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, torch.compile's 'eager' backend (seconds)")
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--particles", default="256,1", help="comma-separated N (default: the problem's 256, and 1)")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_ensemble.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    compile = ft.Compile(True)
    if args.quick:
        args.members, args.particles, args.steps, args.rounds = 2, "4", 16, 1
        compile = ft.Compile(True, compiler="dynamo", backend="eager")
    before = machine.describe()
    rows = []
    for particles in (int(n) for n in args.particles.split(",")):
        rows += measure(args.members, particles, args.steps, args.rounds, compile)
    after = os.getloadavg()
    print(machine.caption(before, after))
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "rows": rows,
                "compile": compile._asdict(),
                "machine": {**before, "load_average_after": after},
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
