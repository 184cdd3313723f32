"""Eager ``step_with_info`` in the user's own loop against the seed's stateful loop (1-D LQR, 1 -> 16 -> 1).

    python -m benchmarks.bench_eager            # N = 1 and N = 100, a few seconds per variant
    python -m benchmarks.bench_eager --quick    # smoke test

Variants, all measured side by side in one process, round-robin over repeats (medians):

- seed loop: ``benchmarks/seed_loop.py`` (one particle, autograd, in place);
- fwdtrain eager, route x noise type: the same problem as a generic ``SDE`` (the composed
  (theta, x) functions, mu, sigma, c differentiated together) or as a ``ControlledSDE``
  (structure-aware: the control differentiated once, b, s, r in (x, u)), with the noise
  type inferred ("diagonal") or declared "additive" (no D sigma);
- ``check_step_inputs`` alone (the public step's input checks, per call).

Each fwdtrain step is the user's loop: draw dW with torch.randn, call
``fwdtrain.step_with_info`` (checked, mode "auto"). The ratio column is steps/s over the
seed loop's steps/s (the seed loop runs one particle). Writes JSON to
benchmarks/results/bench_eager.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

import fwdtrain as ft
from fwdtrain.problems.cost import check_step_inputs

from . import machine, seed_loop

RESULTS = Path(__file__).resolve().parent / "results"
DT = 0.01


def problems(hidden: int = 16) -> dict[str, ft.SDE]:
    """The 1-D LQR four ways: generic / structure-aware route, inferred / additive noise."""
    controlled = ft.examples.lqr_1d(hidden=hidden).sde
    b, s, r, f = (
        controlled.controlled_drift,
        controlled.controlled_diffusion,
        controlled.controlled_cost,
        controlled.control,
    )
    return {
        "generic SDE, inferred noise": ft.SDE(controlled.drift, controlled.diffusion, controlled.cost),
        "generic SDE, additive": ft.SDE(controlled.drift, controlled.diffusion, controlled.cost, noise_type="additive"),
        "ControlledSDE, inferred noise": ft.ControlledSDE(f, b, s, r),
        "ControlledSDE, additive": ft.ControlledSDE(f, b, s, r, noise_type="additive"),
    }


def fwdtrain_loop(sde: ft.SDE, theta, particles: int, lr: float = 0.1) -> Callable[[int], None]:
    """The user's loop: ``steps`` calls of step_with_info from a state kept between calls."""
    box = [ft.init(sde, theta, torch.ones(1), particles)]
    generator = torch.Generator().manual_seed(0)
    scale = math.sqrt(DT)

    def run(steps: int) -> None:
        state = box[0]
        for _ in range(steps):
            dw = torch.randn((particles, 1), generator=generator) * scale
            state, _ = ft.step_with_info(sde, state, dw, DT, lr)
        box[0] = state

    return run


def seed_run() -> Callable[[int], None]:
    propagator = seed_loop.OneDimensionalLQR()

    def run(steps: int) -> None:
        for _ in range(steps):
            propagator.step(DT)

    return run


def checks_run(sde: ft.SDE, theta, particles: int) -> Callable[[int], None]:
    state = ft.init(sde, theta, torch.ones(1), particles)
    dw = torch.zeros(particles, 1)

    def run(steps: int) -> None:
        for _ in range(steps):
            check_step_inputs(sde, state, dw, DT, 0.1)

    return run


def measure(variants: dict[str, Callable[[int], None]], steps: int, repeats: int) -> dict[str, float]:
    """Median steps/s of each variant, round-robin so that load changes hit all alike."""
    for run in variants.values():
        run(max(steps // 10, 2))  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, run in variants.items():
            start = time.perf_counter()
            run(steps)
            seconds[name].append(time.perf_counter() - start)
    return {name: steps / statistics.median(times) for name, times in seconds.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few steps per variant (smoke test)")
    parser.add_argument("--steps", type=int, default=None, help="steps per timed chunk")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_eager.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    steps = args.steps or (5 if args.quick else 200)
    repeats = args.repeats or (1 if args.quick else 5)
    theta = ft.examples.lqr_1d(hidden=16).theta
    before = machine.describe()
    rows = []
    print(f"{'N':>4} {'variant':34s} {'steps/s':>9} {'particle-steps/s':>17} {'vs seed':>8}")
    for particles in (1, 100):
        variants = {"seed loop": seed_run()}
        variants.update({name: fwdtrain_loop(sde, theta, particles) for name, sde in problems().items()})
        variants["check_step_inputs only"] = checks_run(problems()["ControlledSDE, additive"], theta, particles)
        rates = measure(variants, steps, repeats)
        for name, rate in rates.items():
            n = 1 if name == "seed loop" else particles
            row = {
                "particles": particles,
                "variant": name,
                "steps_per_s": rate,
                "particle_steps_per_s": rate * n,
                "ratio_to_seed": rate / rates["seed loop"],
            }
            rows.append(row)
            print(f"{particles:>4} {name:34s} {rate:9.0f} {rate * n:17.0f} {row['ratio_to_seed']:8.2f}")
    after = os.getloadavg()
    print(machine.caption(before, after))
    payload = {"steps": steps, "repeats": repeats, "machine": {**before, "load_average_after": after}, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2))
    return payload


if __name__ == "__main__":
    main()
