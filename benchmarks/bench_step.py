"""Steps per second: the seed's loop, JAX (jit + vmap + lax.scan) and fwdtrain eager / compiled / fused.

    python -m benchmarks.bench_step            # full run (~10 min on a 2-core CPU)
    python -m benchmarks.bench_step --quick    # tiny sizes, seconds (compiles with backend "eager")

Every variant runs the same work (problem, N, dt, network), side by side in one
process, round-robin over repeats; the table shows medians. Noise generation is
part of the timed work in every variant (torch.randn in blocks for fwdtrain, the
seed's own per-step draw, jax.random inside the jitted chunk). Compile time is
reported apart from the steady state. Also prints the roofline: flops and
compulsory bytes per particle-step and the fraction of this machine's measured
matmul and copy peaks that the best variant reaches. Writes JSON to
benchmarks/results/bench_step.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

import fwdtrain as ft
from fwdtrain.compiled import compile_advance, compile_steps
from fwdtrain.core.kernel import advance, resolve_step_mode

from . import problems, roofline, seed_loop
from .torch_scan import compile_scan

RESULTS = Path(__file__).resolve().parent / "results"


class Variant(NamedTuple):
    name: str
    chunk: Callable[[], None]  # advances its own state by `steps_per_chunk` steps
    steps_per_chunk: int
    particles: int
    compile_s: float | None


def peak_rss_mb() -> float:
    """The process's peak resident set so far (ru_maxrss, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed(fn: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def torch_variants(
    problem: problems.Problem, particles: int, chunk_steps: int, backend: str, fused: bool, scan: bool
) -> list[Variant]:
    """fwdtrain eager, compiled (one step per call), fused (K steps per call) and, optionally, scan."""
    sde, dt = problem.sde, problem.dt
    lr = ft.schedules.constant(problem.lr)
    state0 = ft.init(sde, problem.theta, problem.x0, particles)
    m = ft.core.state.noise_dim(sde, state0.theta, state0.x)
    mode = resolve_step_mode("auto", state0, m)
    generator = torch.Generator().manual_seed(0)

    def noise() -> torch.Tensor:
        return torch.randn((chunk_steps, particles, m), generator=generator, dtype=state0.x.dtype) * math.sqrt(dt)

    def per_step(one_step) -> Callable[[], None]:
        box = [state0]

        def chunk() -> None:
            state = box[0]
            for dw in noise():
                state, _ = one_step(state, dw, lr(state.t))
            box[0] = state

        return chunk

    variants = [
        Variant(
            "fwdtrain eager", per_step(lambda s, dw, a: advance(sde, s, dw, dt, a, mode)), chunk_steps, particles, None
        )
    ]
    one = compile_advance(sde, dt, mode, backend=backend)
    _, seconds = _timed(lambda: one(state0, noise()[0], lr(state0.t)))
    variants.append(Variant("fwdtrain compiled", per_step(one), chunk_steps, particles, seconds))

    def whole_chunk(fn) -> Callable[[], None]:
        box = [state0]

        def chunk() -> None:
            box[0], _ = fn(box[0], noise())

        return chunk

    if fused:
        many = compile_steps(sde, dt, lr, mode, chunk_steps, backend=backend)
        _, seconds = _timed(lambda: many(state0, noise()))
        variants.append(Variant(f"fwdtrain fused K={chunk_steps}", whole_chunk(many), chunk_steps, particles, seconds))
    if scan:
        scanned = compile_scan(sde, dt, lr, mode, backend=backend)
        try:
            _, seconds = _timed(lambda: scanned(state0, noise()))
        except Exception as error:
            reason = " ".join(line.strip() for line in str(error).splitlines()[:3])[:300]
            print(f"  torch scan failed: {type(error).__name__}: {reason}")
        else:
            variants.append(
                Variant(f"fwdtrain scan K={chunk_steps}", whole_chunk(scanned), chunk_steps, particles, seconds)
            )
    return variants


def seed_variant(chunk_steps: int) -> Variant:
    propagator = seed_loop.OneDimensionalLQR(hidden_units=16, learning_rate=0.5)

    def chunk() -> None:
        for _ in range(chunk_steps):
            propagator.step(0.01)

    return Variant("seed loop", chunk, chunk_steps, 1, None)


def jax_variant(problem: problems.Problem, particles: int, chunk_steps: int) -> Variant | None:
    try:
        import jax

        from . import jax_impl
    except ImportError:
        return None
    coefficients = problems.jax_coefficients(problem)
    theta = {k: v.numpy() for k, v in problem.theta.items()}
    state = jax_impl.init_state(theta, problem.x0.numpy(), particles)
    chunk_fn = jax_impl.make_chunk(coefficients, problem.dt, problem.lr, chunk_steps, particles, problem.x0.shape[0])
    key = jax.random.PRNGKey(0)
    compiled, seconds = _timed(lambda: chunk_fn.lower(state, key).compile())
    box = [state, key]

    def chunk() -> None:
        box[1], sub = jax.random.split(box[1])
        box[0], cost = compiled(box[0], sub)
        jax.block_until_ready(cost)

    return Variant("jax scan", chunk, chunk_steps, particles, seconds)


def jax_hand_variant(problem: problems.Problem, particles: int, chunk_steps: int) -> Variant | None:
    """benchmarks/jax_hand.py: the seed's 1-D problem specialised by hand (only u differentiated)."""
    if problem.name != "lqr-1d":
        return None
    try:
        import jax

        from . import jax_hand
    except ImportError:
        return None
    state = jax_hand.init({k: v.numpy() for k, v in problem.theta.items()}, float(problem.x0[0]), particles)
    run = jax_hand.make_run(problem.dt, lambda t: problem.lr, chunk_steps, particles)
    key = jax.random.PRNGKey(0)
    compiled, seconds = _timed(lambda: run.lower(state, key).compile())
    box = [state, key]

    def chunk() -> None:
        box[1], sub = jax.random.split(box[1])
        box[0], cost = compiled(box[0], sub)
        jax.block_until_ready(cost)

    return Variant("jax hand", chunk, chunk_steps, particles, seconds)


def measure(variants: list[Variant], repeats: int, seconds_per_repeat: float) -> dict[str, dict]:
    """Median particle-steps/s per variant, round-robin over repeats so load changes hit all alike."""
    chunks = {}
    rss = {}
    for v in variants:
        v.chunk()  # warm-up (after compilation)
        _, once = _timed(v.chunk)
        chunks[v.name] = max(1, round(seconds_per_repeat / max(once, 1e-9)))
        rss[v.name] = peak_rss_mb()
    samples: dict[str, list[float]] = {v.name: [] for v in variants}
    for _ in range(repeats):
        for v in variants:
            _, seconds = _timed(lambda: [v.chunk() for _ in range(chunks[v.name])])
            samples[v.name].append(chunks[v.name] * v.steps_per_chunk / seconds)
    return {
        v.name: {
            "steps_per_s": statistics.median(samples[v.name]),
            "particle_steps_per_s": statistics.median(samples[v.name]) * v.particles,
            "us_per_step": 1e6 / statistics.median(samples[v.name]),
            "samples_steps_per_s": samples[v.name],
            "compile_s": v.compile_s,
            "peak_rss_mb_after_warmup": rss[v.name],
            "particles": v.particles,
        }
        for v in variants
    }


def work_sizes(quick: bool) -> list[tuple[str, int, int]]:
    """(problem, N, fused chunk K)."""
    if quick:
        return [("lqr-1d", 1, 2), ("lqr-3d", 4, 2)]
    return [("lqr-1d", 1, 16), ("lqr-1d", 100, 8), ("lqr-1d", 10_000, 4), ("lqr-10d", 256, 4)]


def print_table(rows: list[dict]) -> None:
    header = (
        f"{'work':<16}{'variant':<26}{'particle-steps/s':>18}{'us/step':>11}{'compile s':>11}"
        f"{'x seed':>9}{'x jax':>8}{'x hand':>8}{'peak RSS MB':>13}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        compile_s = f"{r['compile_s']:.1f}" if r["compile_s"] is not None else "-"
        vs_seed = f"{r['vs_seed']:.1f}" if r.get("vs_seed") is not None else "-"
        vs_jax = f"{r['vs_jax']:.2f}" if r.get("vs_jax") is not None else "-"
        vs_hand = f"{r['vs_jax_hand']:.2f}" if r.get("vs_jax_hand") is not None else "-"
        print(
            f"{r['work']:<16}{r['variant']:<26}{r['particle_steps_per_s']:>18,.0f}{r['us_per_step']:>11.1f}"
            f"{compile_s:>11}{vs_seed:>9}{vs_jax:>8}{vs_hand:>8}{r['peak_rss_mb_after_warmup']:>13.0f}"
        )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes and the 'eager' compile backend (seconds)")
    parser.add_argument("--backend", default=None, help="torch.compile backend (default: inductor; eager if --quick)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads for torch and XLA (default: the libraries' defaults); 1 on a busy machine",
    )
    parser.add_argument("--only", default=None, help="run only work sizes whose label contains this, e.g. 'N=100 '")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_step.json")
    args = parser.parse_args(argv)
    backend = args.backend or ("eager" if args.quick else "inductor")
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + " --xla_cpu_multi_thread_eigen="
            + ("true" if args.threads > 1 else "false")
        ).strip()
    repeats = args.repeats or (3 if args.quick else 7)
    seconds_per_repeat = 0.02 if args.quick else 0.3

    rows: list[dict] = []
    seed_rate = None
    for name, particles, k in work_sizes(args.quick):
        problem = problems.lqr(name)
        work = f"{name} N={particles}"
        if args.only and args.only not in work + " ":
            continue
        print(f"[{work}] compiling ...", flush=True)
        variants = torch_variants(
            problem,
            particles,
            k,
            backend,
            fused=not args.quick or particles == 1,
            scan=particles == 1 and not args.quick,
        )
        if name == "lqr-1d" and particles == 1:
            variants.insert(0, seed_variant(k))
        jax_v = jax_variant(problem, particles, k)
        if jax_v is not None:
            variants.append(jax_v)
        hand_v = jax_hand_variant(problem, particles, k)
        if hand_v is not None:
            variants.append(hand_v)
        results = measure(variants, repeats, seconds_per_repeat)
        if "seed loop" in results:
            seed_rate = results["seed loop"]["particle_steps_per_s"]
        jax_rate = results.get("jax scan", {}).get("particle_steps_per_s")
        hand_rate = results.get("jax hand", {}).get("particle_steps_per_s")
        flops, bytes_ = roofline.per_particle_step(problem, particles)
        for variant, r in results.items():
            rows.append(
                {
                    "work": work,
                    "problem": name,
                    "variant": variant,
                    **r,
                    "vs_seed": r["particle_steps_per_s"] / seed_rate if seed_rate else None,
                    "vs_jax": r["particle_steps_per_s"] / jax_rate if jax_rate else None,
                    "vs_jax_hand": r["particle_steps_per_s"] / hand_rate if hand_rate else None,
                    "flops_per_particle_step": flops,
                    "bytes_per_particle_step": bytes_,
                }
            )
    print()
    print_table(rows)
    peaks = roofline.machine_peaks(quick=args.quick)
    print()
    roof = roofline.report(rows, peaks)
    payload = {
        "quick": args.quick,
        "backend": backend,
        "repeats": repeats,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.platform(),
        "rows": rows,
        "machine_peaks": peaks._asdict(),
        "roofline": roof,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {args.out}")
    return payload


if __name__ == "__main__":
    main()
