"""Particle-steps per second in the steady state, through the user's own loop over ``fwdtrain.step`` and through
``fwdtrain.run`` called again and again as a user continues a run, against the seed's stateful loop and JAX
programs, side by side in one process.

    python -m benchmarks.bench_step --only "user loop"   # the user's loop over the step alone (~2 min)

    python -m benchmarks.bench_step            # full run (~25 min on a 2-core CPU)
    python -m benchmarks.bench_step --quick    # tiny sizes, seconds (compiles through torch.compile's "eager")

Each variant takes segments of ``--segment`` steps (2,048 by default): fwdtrain calls
``ft.run(problem, run, segment, dt, lr)`` with the previous ``Run`` (default options: a record and a check
every 100 steps), eager, compiled, with ``run``'s default ``compile="auto"`` (after the compiled variant, so
with its kernel on disk, as on a user's second run), or compiled with ``Compile(unroll=4)`` (four steps per
iteration of the compiled loop); JAX runs a jitted ``lax.scan`` of the same length (``jax_impl``:
fwdtrain's generic work; ``jax_hand``: the 1-D problem specialised by hand, only u differentiated). Noise
generation is part of the timed work everywhere. The seed loop (one particle, autograd, in place) runs beside
every lqr-1d size: its particle-steps/s is what N of its loops would give. Medians over round-robin repeats;
the compile (or trace and load) of each variant's first segment is reported apart, and issue 18's
steady-state targets (compiled against the hand JAX program) are printed. Writes JSON to
benchmarks/results/bench_step.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import optree
import torch

import fwdtrain as ft
from fwdtrain.compile import kernels

from . import machine, problems, roofline, seed_loop

RESULTS = Path(__file__).resolve().parent / "results"


class Variant(NamedTuple):
    name: str
    segment: Callable[[], None]  # advances its own state by `steps` steps
    steps: int
    particles: int
    first_s: float | None  # the first segment (compile, or trace and load)
    ops: tuple[int, int] | None = None  # the traced step's ATen calls, as traced and after graphs.simplify


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def fwdtrain_variant(problem: problems.Problem, particles: int, steps: int, compile: Any, name: str) -> Variant:
    """``ft.run`` of ``steps`` steps, continued from its own last ``Run`` each time."""
    box: list[Any] = [ft.init(problem.sde, problem.theta, problem.x0, particles)]
    seed = [0]

    def segment() -> None:
        start = box[0]
        box[0] = ft.run(problem.sde, start, steps, problem.dt, problem.lr, seed[0], compile=compile)

    before = kernels.counts()
    _, first = _timed(segment)
    built = {k: v - before.get(k, 0) for k, v in kernels.counts().items() if v != before.get(k, 0)}
    print(f"  {name}: first segment {first:.1f} s {built or ''}", flush=True)
    ops = (built["traced_ops"], built["simplified_ops"]) if built.get("traced_ops") else None
    return Variant(name, segment, steps, particles, first, ops)


def seed_variant(steps: int) -> Variant:
    propagator = seed_loop.OneDimensionalLQR(hidden_units=16, learning_rate=0.5)

    def segment() -> None:
        for _ in range(steps):
            propagator.step(0.01)

    return Variant("seed loop", segment, steps, 1, None)


def _jax_segment(compiled: Any, state: Any) -> Callable[[], None]:
    import jax

    box = [state, jax.random.PRNGKey(0)]

    def segment() -> None:
        box[1], sub = jax.random.split(box[1])
        box[0], cost = compiled(box[0], sub)
        jax.block_until_ready(cost)

    return segment


def jax_variants(problem: problems.Problem, particles: int, steps: int) -> list[Variant]:
    """``jax scan`` (fwdtrain's generic work) and, for the 1-D problem, ``jax hand``; none without jax."""
    try:
        import jax

        from . import jax_hand, jax_impl
    except ImportError:
        return []
    key = jax.random.PRNGKey(0)
    theta = {k: v.numpy() for k, v in problem.theta.items()}
    state = jax_impl.init_state(theta, problem.x0.numpy(), particles)
    chunk = jax_impl.make_chunk(
        problems.jax_coefficients(problem), problem.dt, problem.lr, steps, particles, problem.x0.shape[0]
    )
    compiled, seconds = _timed(lambda: chunk.lower(state, key).compile())
    out = [Variant("jax scan", _jax_segment(compiled, state), steps, particles, seconds)]
    if problem.name == "lqr-1d":
        hand_state = jax_hand.init(theta, float(problem.x0[0]), particles)
        hand = jax_hand.make_run(problem.dt, lambda t: problem.lr, steps, particles)
        compiled, seconds = _timed(lambda: hand.lower(hand_state, key).compile())
        out.append(Variant("jax hand", _jax_segment(compiled, hand_state), steps, particles, seconds))
    return out


def measure(variants: list[Variant], repeats: int) -> dict[str, dict[str, Any]]:
    """Median particle-steps/s per variant, round-robin over repeats so that load changes hit all alike."""
    for v in variants:
        v.segment()  # one more warm segment each
    samples: dict[str, list[float]] = {v.name: [] for v in variants}
    for _ in range(repeats):
        for v in variants:
            _, seconds = _timed(v.segment)
            samples[v.name].append(v.steps / seconds)
    return {
        v.name: {
            "steps_per_s": statistics.median(samples[v.name]),
            "particle_steps_per_s": statistics.median(samples[v.name]) * v.particles,
            "us_per_step": 1e6 / statistics.median(samples[v.name]),
            "samples_steps_per_s": samples[v.name],
            "first_segment_s": v.first_s,
            "particles": v.particles,
            "aten_ops": v.ops,
        }
        for v in variants
    }


DRIFT_FLAG = 1.3  # a variant whose last timed segment took this much longer than its first is flagged


def print_drift(rows: list[dict[str, Any]]) -> None:
    """Flag the variants whose segments slowed down over the continued run (the median hides it): a run that
    slows as it goes on (subnormal sensitivities once did, 14 -> 88 us a step at N = 100 over 40 segments)."""
    for row in rows:
        samples = row.get("samples_steps_per_s") or []
        if len(samples) > 1 and samples[0] / samples[-1] > DRIFT_FLAG:
            print(
                f"drift {row['work']}, {row['variant']}: its last segment took {samples[0] / samples[-1]:.2f}x "
                f"its first; the median understates what a longer run costs"
            )


def work_sizes(quick: bool) -> list[tuple[str, int]]:
    if quick:
        return [("lqr-1d", 1), ("lqr-3d", 4)]
    return [("lqr-1d", 1), ("lqr-1d", 100), ("lqr-1d", 10_000), ("lqr-10d", 256)]


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'work':<16}{'variant':<20}{'particle-steps/s':>18}{'us/step':>10}{'first s':>9}"
        f"{'x seed':>9}{'x jax':>8}{'x hand':>8}{'ATen ops':>12}"
    )
    print(header)
    print("-" * len(header))

    def ratio(value: float | None, digits: int) -> str:
        return f"{value:.{digits}f}" if value is not None else "-"

    for r in rows:
        first = f"{r['first_segment_s']:.1f}" if r["first_segment_s"] is not None else "-"
        ops = "{} -> {}".format(*r["aten_ops"]) if r.get("aten_ops") else "-"
        print(
            f"{r['work']:<16}{r['variant']:<20}{r['particle_steps_per_s']:>18,.0f}{r['us_per_step']:>10.1f}"
            f"{first:>9}{ratio(r.get('vs_seed'), 1):>9}{ratio(r.get('vs_jax'), 2):>8}"
            f"{ratio(r.get('vs_jax_hand'), 2):>8}{ops:>12}"
        )


def _set_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)
        flag = "true" if threads > 1 else "false"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_cpu_multi_thread_eigen={flag}").strip()


def run_size(name: str, particles: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every variant of one work size, measured side by side; the rows with their ratios."""
    problem, work = problems.lqr(name), f"{name} N={particles}"
    quick = ft.Compile(True, compiler="dynamo", backend="eager")
    compiled = quick if args.quick else ft.Compile(True)
    print(f"[{work}]", flush=True)
    variants = [
        fwdtrain_variant(problem, particles, args.segment, False, "fwdtrain eager"),
        fwdtrain_variant(problem, particles, args.segment, compiled, "fwdtrain compiled"),
        # ``run``'s default, compile="auto", after the compiled variant: its kernel on disk, as on a user's second run
        fwdtrain_variant(problem, particles, args.segment, "auto", "fwdtrain default"),
        *(
            [fwdtrain_variant(problem, particles, args.segment, compiled._replace(unroll=k), f"fwdtrain unroll={k}")]
            if (k := args.unroll) > 1 and not args.quick
            else []
        ),
        *jax_variants(problem, particles, args.segment),
    ]
    if name == "lqr-1d":  # one particle per loop: its particle-steps/s is the reference at every N
        variants.insert(0, seed_variant(min(args.segment, 512)))
    results = measure(variants, args.repeats or (3 if args.quick else 5))
    rates = {
        key: results.get(variant, {}).get("particle_steps_per_s")
        for key, variant in (("seed", "seed loop"), ("jax", "jax scan"), ("hand", "jax hand"))
    }
    flops, bytes_ = roofline.per_particle_step(problem, particles)
    rows = []
    for variant, r in results.items():
        rate = r["particle_steps_per_s"]
        rows.append(
            {
                "work": work,
                "problem": name,
                "particles": particles,
                "variant": variant,
                **r,
                "vs_seed": rate / rates["seed"] if rates["seed"] and variant != "seed loop" else None,
                "vs_jax": rate / rates["jax"] if rates["jax"] else None,
                "vs_jax_hand": rate / rates["hand"] if rates["hand"] else None,
                "flops_per_particle_step": flops,
                "bytes_per_particle_step": bytes_,
            }
        )
    return rows


def user_loop_variants(steps: int, quick: bool) -> list[Variant]:
    """The research-code path on the seed problem (N = 1, float32, constant lr 0.5): a Python loop over
    ``ft.step`` eager, ``ft.step(compile=True)``, the prepared ``ft.jit_step``, the user's ``vmap`` over 8 runs
    of the compiled step, and a JAX ``jit(step)`` loop; the noise of each step drawn in the loop."""
    problem = problems.lqr("lqr-1d")
    sde, dt, lr = problem.sde, problem.dt, problem.lr
    compile_option = ft.Compile(True, compiler="dynamo", backend="eager") if quick else True
    generator = torch.Generator().manual_seed(0)
    scale = dt**0.5

    def loop(one_step: Callable[[Any, torch.Tensor], Any], start: Any, shape: tuple[int, ...]) -> Callable[[], None]:
        box = [start]

        def segment() -> None:
            state = box[0]
            for _ in range(steps):
                state = one_step(state, torch.randn(shape, generator=generator) * scale)
            box[0] = state

        return segment

    start = ft.init(sde, problem.theta, problem.x0, 1)
    fast = ft.jit_step(sde, compile=compile_option)
    runs = 8
    stacked = optree.tree_map(lambda leaf: torch.stack([leaf] * runs), start)
    compiled_step = functools.partial(ft.step, compile=compile_option)
    vmapped = torch.func.vmap(lambda s, w: compiled_step(sde, s, w, dt, lr))
    variants = [
        ("seed loop", seed_variant(steps).segment, 1),
        ("ft.step eager", loop(lambda s, w: ft.step(sde, s, w, dt, lr), start, (1, 1)), 1),
        (
            "ft.step compile=True",
            loop(lambda s, w: ft.step(sde, s, w, dt, lr, compile=compile_option), start, (1, 1)),
            1,
        ),
        ("ft.jit_step", loop(lambda s, w: fast(s, w, dt, lr), start, (1, 1)), 1),
        ("vmap(ft.step) 8 runs", loop(vmapped, stacked, (runs, 1, 1)), runs),
    ]
    out = []
    for name, segment, count in variants:
        before = kernels.counts()
        _, first = _timed(segment)
        built = {k: v - before.get(k, 0) for k, v in kernels.counts().items() if v != before.get(k, 0)}
        print(f"  {name}: first segment {first:.1f} s {built or ''}", flush=True)
        out.append(Variant(name, segment, steps, count, first))
    return out + jax_step_variant(problem, steps)


def jax_step_variant(problem: problems.Problem, steps: int) -> list[Variant]:
    """A JAX user's loop: ``jax.jit`` of one hand-written step (``jax_hand.make_step``), called per step."""
    try:
        import jax

        from . import jax_hand
    except ImportError:
        return []
    theta = {k: v.numpy() for k, v in problem.theta.items()}
    jitted = jax.jit(jax_hand.make_step(problem.dt, lambda t: problem.lr))
    box = [jax_hand.init(theta, float(problem.x0[0]), 1), jax.random.PRNGKey(0)]
    scale = problem.dt**0.5

    def segment() -> None:
        state, key = box
        key, sub = jax.random.split(key)
        noise = (
            jax.random.normal(sub, (steps, 1)) * scale
        )  # drawn per segment: a per-step draw costs more than the step
        for i in range(steps):
            state, cost = jitted(state, noise[i])
        jax.block_until_ready(cost)
        box[:] = [state, key]

    _, first = _timed(segment)
    return [Variant("jax jit(step) loop", segment, steps, 1, first)]


def run_user_loop(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Issue 25's rows: the user's own loop over the step, side by side; ratios to the seed loop and to JAX."""
    print("[user loop: lqr-1d N=1]", flush=True)
    steps = 32 if args.quick else 1_000
    results = measure(user_loop_variants(steps, args.quick), args.repeats or (3 if args.quick else 5))
    seed = results["seed loop"]["particle_steps_per_s"]
    jax_rate = results.get("jax jit(step) loop", {}).get("particle_steps_per_s")
    rows = []
    for variant, r in results.items():
        rate = r["particle_steps_per_s"]
        rows.append(
            {
                "work": "user loop N=1",
                "problem": "lqr-1d",
                "particles": 1,
                "variant": variant,
                **r,
                "vs_seed": rate / seed if variant != "seed loop" else None,
                "vs_jax": rate / jax_rate if jax_rate else None,
            }
        )
    return rows


USER_TARGETS = {"ft.step compile=True": 3.0, "ft.jit_step": 3.0, "ft.step eager": 0.5, "vmap(ft.step) 8 runs": 1.0}


def print_user_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 25's targets for the user's loop, in run-steps/s against the seed loop."""
    out = []
    for row in rows:
        target = USER_TARGETS.get(row["variant"])
        if row["work"] != "user loop N=1" or target is None:
            continue
        met = row["vs_seed"] >= target
        out.append({"variant": row["variant"], "vs_seed": row["vs_seed"], "target": target, "met": met})
        verdict = "met" if met else "MISSED"
        print(f"target user loop, {row['variant']}: {row['vs_seed']:.2f}x the seed loop, >= {target:g}x: {verdict}")
    return out


TARGETS = {1: 1.0, 100: 1.0, 10_000: 5.0}  # issue 18: compiled particle-steps/s over the hand JAX program's


def print_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 18's steady-state targets for the compiled rows of lqr-1d against the hand JAX program."""
    out = []
    for row in rows:
        target = TARGETS.get(row["particles"])
        compiled = row["variant"].startswith(("fwdtrain compiled", "fwdtrain unroll"))
        if row["problem"] != "lqr-1d" or not compiled or target is None:
            continue
        ratio = row.get("vs_jax_hand")
        if ratio is None:
            continue
        met = ratio >= target
        out.append({"work": row["work"], "variant": row["variant"], "vs_jax_hand": ratio, "target": target, "met": met})
        verdict = "met" if met else "MISSED"
        print(f"target {row['work']}, {row['variant']}: {ratio:.2f}x hand JAX, target >= {target:g}x: {verdict}")
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, torch.compile's 'eager' backend (seconds)")
    parser.add_argument("--segment", type=int, default=None, help="steps per ft.run call (default 2048; 64 quick)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="threads for torch and XLA (1 on a busy machine)")
    parser.add_argument("--unroll", type=int, default=4, help="K of the 'fwdtrain unroll=K' rows (1: none)")
    parser.add_argument(
        "--only", default=None, help="run only work sizes whose label contains this, e.g. 'N=100 ', or 'user loop'"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_step.json")
    args = parser.parse_args(argv)
    args.segment = args.segment or (64 if args.quick else 2048)
    _set_threads(args.threads)
    before = machine.describe()
    rows: list[dict[str, Any]] = []
    if not args.only or args.only in "user loop":
        rows += run_user_loop(args)
    for name, particles in work_sizes(args.quick):
        if args.only and args.only not in f"{name} N={particles} ":
            continue
        rows += run_size(name, particles, args)
    after = os.getloadavg()
    print()
    print(machine.caption(before, after))
    print_table(rows)
    print()
    targets = [] if args.quick else print_user_targets(rows) + print_targets(rows)
    print_drift(rows)
    print()
    peaks = roofline.machine_peaks(quick=args.quick)
    out = {
        "machine": {**before, "load_average_after": after, **peaks._asdict()},
        "segment_steps": args.segment,
        "repeats": args.repeats or (3 if args.quick else 5),
        "rows": rows,
        "targets": targets,
        "roofline": roofline.report(rows, peaks),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
