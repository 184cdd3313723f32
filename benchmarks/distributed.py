"""Particle-steps per second of fwdtrain.distributed.distributed_run on 1 and 2 local processes (gloo).

Weak scaling: every process simulates ``--particles`` particles of the 1-D LQR problem (a 1 -> 16 -> 1
ReLU control, float32), and the gradient is all-reduced every step. Each process uses ``--threads``
intra-op threads. The time is the slowest rank's, from a barrier after a warm-up to the end; with ``--repeat``
the process counts are interleaved and each keeps its best time (the machine may be shared).

    python benchmarks/distributed.py            # a line per process count
    python benchmarks/distributed.py --quick    # a smoke test (seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist

import fwdtrain as ft
from benchmarks import machine
from fwdtrain import distributed as D

RESULTS = Path(__file__).resolve().parent / "results"


def _all_reduce_seconds(numbers: int, repeats: int = 200) -> float:
    """Mean time of one all_reduce of ``numbers`` float32s (the gradient and its weight)."""
    if not D.is_initialized():
        return 0.0
    buffer = torch.zeros(numbers)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(buffer)
    return (time.perf_counter() - started) / repeats


def _rank_job(particles: int, steps: int, every: int, threads: int, compile: str) -> tuple[float, float]:
    """This rank's seconds for ``steps`` steps continued from a warm-up run, and one all_reduce's seconds."""
    torch.set_num_threads(threads)
    ex = ft.examples.lqr_1d(particles=particles)
    state = ft.init(ex.sde, ex.theta, ex.x0, particles=particles)
    options = {"compile": {"eager": False, "compiled": True, "auto": "auto"}[compile]}
    warm = D.distributed_run(ex.sde, state, 10, ex.dt, ex.lr, seed=1, every=every, **options)
    if D.is_initialized():
        dist.barrier()
    started = time.perf_counter()
    D.distributed_run(  # continues the warm-up run: its noise stream, step count and history
        ex.sde,
        warm,
        steps,
        ex.dt,
        ex.lr,
        seed=1,
        every=every,
        checks=ft.Checks(every=max(1, steps // 10)),
        save=ft.SaveAt(every=max(1, steps // 10)),
        **options,
    )
    seconds = time.perf_counter() - started
    return seconds, _all_reduce_seconds(sum(leaf.numel() for leaf in ft.core._tree.leaves(ex.theta)) + 1)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--particles", type=int, default=256, help="particles per process")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--every", type=int, default=1, help="all-reduce the gradient every k steps")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="interleave the process counts this many times and keep each one's best time",
    )
    parser.add_argument(
        "--compile",
        choices=("eager", "compiled", "auto"),
        default="eager",
        help="eager steps (default), compiled halves around the all-reduce, or run's automatic choice",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke test: 16 particles, 20 steps")
    parser.add_argument("--out", type=Path, default=RESULTS / "distributed.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.particles, args.steps, args.repeat = 16, 20, 1
    print(
        f"torch {torch.__version__}, lqr-1d float32, {args.particles} particles per process, "
        f"{args.steps} steps, gradient all-reduce every {args.every} step(s), {args.threads} thread(s) each, "
        f"{args.compile} steps"
    )
    before = {**machine.describe(), "threads": args.threads}
    best: dict[int, tuple[float, float]] = {}
    for _ in range(args.repeat):
        for size in args.processes:
            per_rank = D.launch(
                _rank_job, size, (args.particles, args.steps, args.every, args.threads, args.compile), timeout=600.0
            )
            seconds, reduce_seconds = max(t for t, _ in per_rank), max(r for _, r in per_rank)
            if size not in best or seconds < best[size][0]:
                best[size] = (seconds, reduce_seconds)
    base = None
    rows = []
    for size in args.processes:
        seconds, reduce_seconds = best[size]
        rate = size * args.particles * args.steps / seconds
        base = base or rate / size
        rows.append(
            {
                "processes": size,
                "particles": size * args.particles,
                "seconds": seconds,
                "particle_steps_per_s": rate,
                "speedup": rate / base,
                "efficiency": rate / base / size,
                "all_reduce_s": reduce_seconds,
            }
        )
        print(
            f"processes {size}  particles {size * args.particles:>6d}  time {seconds:7.2f} s  "
            f"particle-steps/s {rate:12,.0f}  speed-up {rate / base:5.2f}  efficiency {rate / base / size:5.2f}  "
            f"all_reduce {reduce_seconds * 1e6:6.0f} us ({1e3 * seconds / args.steps:5.2f} ms/step)",
            flush=True,
        )
    print(machine.caption(before, os.getloadavg()))
    payload = {
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": {**before, "load_average_after": os.getloadavg()},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1))
    return payload


if __name__ == "__main__":
    main()
