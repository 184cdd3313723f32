"""What a jump costs: the 1-D controlled jump LQR stepped with and without its jump term, side by side.

    python -m benchmarks.bench_jumps            # ~3 min on a 2-core CPU
    python -m benchmarks.bench_jumps --quick    # tiny sizes, seconds (compiles through torch.compile's "eager")

The work: dX = (-X + u) dt + 0.5 dW [+ J dN], u = -k X, cost X^2 + u^2, dt = 0.01, float32
(``fwdtrain.examples.jump_lqr_sde``), four ways:

- "brownian":           no jump term (the same SDE with ``jumps=None``);
- "jumps additive":     J = z, z ~ N(0, 0.25), rate 2 (a compound Poisson process: no score);
- "jumps proportional": J = X(t-) z, same rate and marks;
- "jumps rate(x, u)":   J = z with the intensity 2 (1 + tanh(x u) / 2), which depends on theta through u, so
                        every step also updates the score S (the likelihood-ratio term).

Paths, each the one a user takes: ``ft.run`` compiled, called again on its last ``Run`` for a segment of
``--segment`` steps, at N = 1 and N = 256 particles; ``ft.run`` eager at N = 256; and the user's own Python
loop over the eager ``ft.step`` at N = 1 (dW of m + 1 + q columns drawn in the loop). Medians over
round-robin repeats; the ratio column is each row's steps/s over the brownian row of the same path. Writes
JSON to benchmarks/results/bench_jumps.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import fwdtrain as ft
from fwdtrain.examples import jump_lqr_sde

from . import machine

RESULTS = Path(__file__).resolve().parent / "results"
DT, LR = 0.01, 0.1


def problems() -> dict[str, ft.SDE]:
    """The four SDEs of the module docstring."""
    additive = jump_lqr_sde("additive")
    brownian = ft.ControlledSDE(
        additive.control,
        additive.controlled_drift,
        additive.controlled_diffusion,
        additive.controlled_cost,
        noise_type="additive",
    )
    assert additive.jumps is not None
    varying = ft.Jumps(
        additive.jumps.size,
        rate=lambda x, u: 2.0 * (1.0 + 0.5 * torch.tanh((x * u).sum())),
        marks=additive.jumps.marks,
    )
    return {
        "brownian": brownian,
        "jumps additive": additive,
        "jumps proportional": jump_lqr_sde("proportional"),
        "jumps rate(x, u)": ft.ControlledSDE(
            additive.control,
            additive.controlled_drift,
            additive.controlled_diffusion,
            additive.controlled_cost,
            noise_type="additive",
            jumps=varying,
        ),
    }


def start(sde: ft.SDE, particles: int) -> ft.State:
    return ft.init(sde, {"gain": torch.tensor(0.2)}, torch.zeros(1), particles)


def run_segment(sde: ft.SDE, particles: int, steps: int, compile: Any) -> Callable[[], None]:
    """``ft.run`` of ``steps`` steps, continued from its own last ``Run`` each time."""
    box: list[Any] = [start(sde, particles)]

    def segment() -> None:
        box[0] = ft.run(sde, box[0], steps, DT, LR, 0, compile=compile)

    return segment


def step_loop(sde: ft.SDE, steps: int) -> Callable[[], None]:
    """The user's loop over the eager ``ft.step`` at N = 1, dW of ``noise_dim`` columns drawn in the loop."""
    box = [start(sde, 1)]
    width = 1 if sde.jumps is None else 1 + sde.jumps.width
    generator = torch.Generator().manual_seed(0)

    def segment() -> None:
        state = box[0]
        for _ in range(steps):
            state = ft.step(sde, state, torch.randn((1, width), generator=generator) * DT**0.5, DT, LR)
        box[0] = state

    return segment


def measure(segments: dict[str, tuple[Callable[[], None], int]], repeats: int) -> dict[str, dict[str, float]]:
    """Median steps/s of each segment (after a warm one), round-robin so that load changes hit all alike."""
    first: dict[str, float] = {}
    for name, (segment, _) in segments.items():
        begin = time.perf_counter()
        segment()
        first[name] = time.perf_counter() - begin
    samples: dict[str, list[float]] = {name: [] for name in segments}
    for _ in range(repeats):
        for name, (segment, steps) in segments.items():
            begin = time.perf_counter()
            segment()
            samples[name].append(steps / (time.perf_counter() - begin))
    return {
        name: {"steps_per_s": statistics.median(values), "first_segment_s": first[name], "samples": values}
        for name, values in samples.items()
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, the 'eager' torch.compile backend")
    parser.add_argument("--segment", type=int, default=None, help="steps per compiled segment (2,048)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_jumps.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    segment = args.segment or (64 if args.quick else 2048)
    eager_steps = 16 if args.quick else 256
    repeats = args.repeats or (2 if args.quick else 5)
    compiled = ft.Compile(True, compiler="dynamo", backend="eager") if args.quick else True
    paths = {
        "ft.run compiled N=1": lambda sde: (run_segment(sde, 1, segment, compiled), segment),
        "ft.run compiled N=256": lambda sde: (run_segment(sde, 256, segment, compiled), segment),
        "ft.run eager N=256": lambda sde: (run_segment(sde, 256, eager_steps, False), eager_steps),
        "ft.step eager loop N=1": lambda sde: (step_loop(sde, eager_steps), eager_steps),
    }
    before = machine.describe()
    rows = []
    for path, build in paths.items():
        print(f"[{path}]", flush=True)
        segments = {name: build(sde) for name, sde in problems().items()}
        results = measure(segments, repeats)
        particles = 256 if "256" in path else 1
        for name, r in results.items():
            rows.append(
                {
                    "path": path,
                    "work": name,
                    "particles": particles,
                    **r,
                    "particle_steps_per_s": r["steps_per_s"] * particles,
                    "us_per_step": 1e6 / r["steps_per_s"],
                    "vs_brownian": r["steps_per_s"] / results["brownian"]["steps_per_s"],
                }
            )
    after = os.getloadavg()
    header = f"{'path':<24}{'work':<20}{'particle-steps/s':>18}{'us/step':>10}{'first s':>9}{'x brownian':>12}"
    print(machine.caption(before, after))
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['path']:<24}{r['work']:<20}{r['particle_steps_per_s']:>18,.0f}{r['us_per_step']:>10.1f}"
            f"{r['first_segment_s']:>9.1f}{r['vs_brownian']:>12.2f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": before, "load_after": after, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
