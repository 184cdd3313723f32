"""Where a compile's time goes: each stage of the README job's AOTInductor compile, in a fresh process, on a fresh
machine (empty ``FWDTRAIN_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR``) and a set-up one, for each candidate cut.

    python -m benchmarks.bench_compile_stages                 # lqr-1d N = 256, 6,000 steps; every variant, 2 rounds
    python -m benchmarks.bench_compile_stages --variant default --variant fwdtrain --machine fresh
    python -m benchmarks.bench_compile_stages --quick         # N = 4, 50 steps, the default variant, fresh, 1 round

Each child runs ``ft.run(ex.sde, state, steps, ex.dt, ex.lr, 0, compile=True)`` on ``examples.lqr_1d`` (the
README job), then the same call again from where the first ended (the kernel built: the steps alone), and times
the stages of the first call by wrapping the functions that do them (a stage's time leaves out the stages it
calls, so the rows add up to the call):

- ``import``: importing inductor and ``torch.export`` (done before the call, timed on its own);
- ``trace``: fwdtrain's ``make_fx`` traces and their simplification (``fwdtrain.compile.graphs``);
- ``export``: ``torch.export.export`` of the traced block;
- ``isa probe``: inductor's instruction-set probe (``VecISA.check_build``: a test program compiled and loaded in a
  child ``python`` per instruction set);
- ``headers``: inductor's precompiled headers (``codecache._precompile_header``: the preprocessor, then the
  header compiled; kept on disk for the next compile);
- ``codegen``: the rest of ``aoti_compile_and_package``: lowering, scheduling, writing the C++;
- ``c++``: the C++ compiler and linker (``CppBuilder.build``, wherever it is not inside the two stages above);
- ``package``: writing the package's zip (``package_aoti``);
- ``load``: loading the package (fwdtrain's ``_compat.aot_load``);
- ``steps``: the second call's time (the 6,000 steps alone);
- ``rest``: the first call less all the above, its steps counted as long as the second call's (fwdtrain's own
  work: keys, checks, the records).

Variants (``VARIANTS``), each in fresh processes, the rounds interleaved, on two machine states (``MACHINES``):
``fresh``, empty caches (a machine's first compile), and ``set-up``, where another kernel (the seed problem at
N = 2) was compiled first with the same settings (inductor's probe record and, where made, its headers there):

- ``default``: as the engine compiles today;
- ``no-pch``: ``aot_inductor.precompile_headers`` off;
- ``fwdtrain``: the options ``_compat.shorter_first_compile()`` gives (the cut kept: no headers on a fresh machine,
  headers from its second compile on);
- ``threads-1``: inductor's ``compile_threads`` at 1 (no pool of compile workers);
- ``known-isa`` (fresh only): the probe's record of an earlier compile given (``_compat.skip_known_probe``);
- ``no-line-tables``: ``aot_inductor.enable_line_tables`` and ``enable_frame_pointer`` off;
- ``O2``: the kernel at ``-O2`` instead of ``-O3``.

``same`` says whether the trained theta equals the default's bit for bit; ``steps`` compares the kernels' speed.
The CPU seconds (this process's and its finished children's: the compilers, the probe's loaders) move less with
the machine's load than the wall-clock ones.
Writes benchmarks/results/bench_compile_stages.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import machine

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
STAGES = ("import", "trace", "export", "isa probe", "headers", "codegen", "c++", "package", "load", "steps", "rest")
VARIANTS = ("default", "no-pch", "fwdtrain", "threads-1", "known-isa", "no-line-tables", "O2")
MACHINES = ("fresh", "set-up")


# ---------------------------------------------------------------- the child: one first compile, timed by stage


def cpu_seconds() -> float:
    """CPU seconds of this process and of its finished children (the compilers, the probe's loaders)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


class Clock:
    """Exclusive times by stage, wall-clock and CPU: a wrapped call's time goes to its stage, less the wrapped calls
    inside it; a call made inside a ``leaf`` stage (the probe's or the headers' own compiles) stays in that stage."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.stack: list[list[Any]] = []  # [stage, nested seconds, nested cpu seconds, leaf]

    def add(self, stage: str, seconds: float, cpu: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds
        self.cpu[stage] = self.cpu.get(stage, 0.0) + cpu

    def wrap(self, owner: Any, name: str, stage: str, leaf: bool = False) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if any(frame[3] for frame in self.stack):
                return original(*args, **kwargs)
            self.stack.append([stage, 0.0, 0.0, leaf])
            start, cpu = time.perf_counter(), cpu_seconds()
            try:
                return original(*args, **kwargs)
            finally:
                total, total_cpu = time.perf_counter() - start, cpu_seconds() - cpu
                _, nested, nested_cpu, _ = self.stack.pop()
                self.add(stage, total - nested, total_cpu - nested_cpu)
                self.calls[stage] = self.calls.get(stage, 0) + 1
                if self.stack:
                    self.stack[-1][1] += total
                    self.stack[-1][2] += total_cpu

        setattr(owner, name, timed)


def apply_variant(variant: str) -> None:
    """The variant's settings, before the first compile."""
    import torch._inductor.config as config

    from fwdtrain import _compat
    from fwdtrain.compile import cache

    _compat.use_cache_folders(cache.cache_dir())
    if variant == "no-pch":
        config.aot_inductor.precompile_headers = False
    elif variant == "no-line-tables":
        config.aot_inductor.enable_line_tables = False
        config.aot_inductor.enable_frame_pointer = False
    elif variant == "O2":
        from torch._inductor import cpp_builder

        original = cpp_builder._get_optimization_cflags

        def o2(cpp_compiler: str, min_optimize: bool = False) -> tuple[list[str], list[str]]:
            cflags, ldflags = original(cpp_compiler, min_optimize)
            return ["O2" if flag == "O3" else flag for flag in cflags], ldflags

        cpp_builder._get_optimization_cflags = o2
    elif variant == "threads-1":
        config.compile_threads = 1
    elif variant == "fwdtrain":  # as the engine merges them into the compile's options
        for name, value in _compat.shorter_first_compile().items():
            owner, _, leaf = name.rpartition(".")
            setattr(functools.reduce(getattr, owner.split(".") if owner else [], config), leaf, value)


def _known_isa(cache: Path) -> None:
    """The instruction-set probe's record an earlier compile on this machine would have left (in a child, so that
    this process's inductor stays unprobed)."""
    code = (
        "import fwdtrain._compat as c, fwdtrain.compile.cache as k; "
        "c.use_cache_folders(k.cache_dir()); c.record_probe(k.machine())"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=os.environ.copy(), timeout=600)
    import shutil

    for name in os.listdir(cache / "inductor"):  # the probe's test programs go: only its record stays
        if name != "isa.json":
            path = cache / "inductor" / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def prime(variant: str) -> None:
    """A set-up machine: another kernel (the seed problem at N = 2) compiled first with the variant's settings."""
    import fwdtrain as ft

    apply_variant(variant)
    _compile_here(variant)
    ex = ft.examples.lqr_1d(particles=2)
    ft.run(ex.sde, ft.init(ex.sde, ex.theta, ex.x0, 2), 20, ex.dt, ex.lr, 0, compile=True)


class _InProcess:
    """The engine's compile process (``python -m fwdtrain.compile.worker``) run in this process instead, so that the
    clock's wrappers see its stages: the same ``worker.main`` on the same job file, only not in a child."""

    def __init__(self, argv: list[str], **_: Any) -> None:
        from fwdtrain.compile import worker

        self.returncode = worker.main(argv[-2:])

    def poll(self) -> int:
        return self.returncode

    def wait(self) -> int:
        return self.returncode


def _compile_here(variant: str) -> None:
    """The compile in this process; every variant but ``fwdtrain`` without the engine's own cut."""
    import types

    from fwdtrain import _compat
    from fwdtrain.compile import kernels

    kernels.subprocess = types.SimpleNamespace(Popen=_InProcess, DEVNULL=subprocess.DEVNULL)  # type: ignore[assignment]
    if variant != "fwdtrain":
        _compat.shorter_first_compile = dict  # type: ignore[assignment]


def child(variant: str, particles: int, steps: int, threads: int) -> dict[str, Any]:
    import torch

    import fwdtrain as ft
    from fwdtrain import _compat
    from fwdtrain.compile import kernels

    if threads:
        torch.set_num_threads(threads)
    clock = Clock()
    start, cpu = time.perf_counter(), cpu_seconds()
    import torch._inductor
    import torch._inductor.codecache as codecache
    import torch._inductor.cpp_builder as cpp_builder
    import torch._inductor.cpu_vec_isa as cpu_vec_isa
    import torch._inductor.package as package
    import torch.export

    clock.add("import", time.perf_counter() - start, cpu_seconds() - cpu)
    if variant == "known-isa":
        _known_isa(Path(os.environ["FWDTRAIN_CACHE_DIR"]))
    apply_variant(variant)
    from fwdtrain.compile import graphs

    for name in ("trace", "simplify", "unfold_small_matmuls"):
        clock.wrap(graphs, name, "trace")
    clock.wrap(torch.export, "export", "export")
    clock.wrap(torch._inductor, "aoti_compile_and_package", "codegen")
    clock.wrap(cpu_vec_isa.VecISA, "check_build", "isa probe", leaf=True)
    clock.wrap(codecache, "_precompile_header", "headers", leaf=True)
    clock.wrap(cpp_builder.CppBuilder, "build", "c++", leaf=True)
    clock.wrap(package, "package_aoti", "package", leaf=True)
    clock.wrap(_compat, "aot_load", "load", leaf=True)

    _compile_here(variant)
    ex = ft.examples.lqr_1d(particles=particles)
    state = ft.init(ex.sde, ex.theta, ex.x0, particles)
    start, cpu = time.perf_counter(), cpu_seconds()
    first = ft.run(ex.sde, state, steps, ex.dt, ex.lr, 0, compile=True)
    call, call_cpu = time.perf_counter() - start, cpu_seconds() - cpu
    if "codegen" not in clock.calls:
        raise RuntimeError("no AOTInductor compile in this process: the engine's compile was not run here")
    start, cpu = time.perf_counter(), cpu_seconds()
    second = ft.run(ex.sde, first, steps, ex.dt, ex.lr, 0, compile=True)
    clock.add("steps", time.perf_counter() - start, cpu_seconds() - cpu)
    inside = [stage for stage in clock.seconds if stage not in ("import", "steps")]
    clock.add(
        "rest",
        call - sum(clock.seconds[stage] for stage in inside) - clock.seconds["steps"],
        call_cpu - sum(clock.cpu[stage] for stage in inside) - clock.cpu["steps"],
    )
    theta = {name: value.tolist() for name, value in second.state.theta.items()}
    from torch._dynamo.utils import compilation_time_metrics

    return {
        "variant": variant,
        "call_s": call,
        "stages": clock.seconds,
        "stages_cpu": clock.cpu,
        "calls": clock.calls,
        "inductor_timers": {key: sum(values) for key, values in compilation_time_metrics.items()},
        "theta": theta,
        "kernels": kernels.counts(),
        "threads": torch.get_num_threads(),
    }


# ---------------------------------------------------------------- the parent


def launch(variant: str, machine_state: str, particles: int, steps: int, threads: int) -> dict[str, Any]:
    """One child on caches of its own: empty (``fresh``), or where another kernel was compiled first (``set-up``)."""
    with tempfile.TemporaryDirectory(prefix="fwdtrain-stages-") as root:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "FWDTRAIN_CACHE_DIR": root}
        env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # inductor's caches go inside the fresh folder
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        argvs = [["--prime", variant]] if machine_state == "set-up" else []
        argvs.append(["--child", variant, str(particles), str(steps), str(threads)])
        for argv in argvs:
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.bench_compile_stages", *argv],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=1800,
            )
            if done.returncode != 0:
                return {"variant": variant, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _row(
    variant: str, machine_state: str, samples: list[dict[str, Any]], reference: dict[str, Any] | None
) -> dict[str, Any]:
    good = [s for s in samples if "error" not in s]
    if not good:
        return {"variant": variant, "machine": machine_state, "error": samples[-1]["error"], "samples": samples}
    stages = {stage: statistics.median(s["stages"].get(stage, 0.0) for s in good) for stage in STAGES}
    cpu = {stage: statistics.median(s["stages_cpu"].get(stage, 0.0) for s in good) for stage in STAGES}
    return {
        "variant": variant,
        "machine": machine_state,
        "call_s": statistics.median(s["call_s"] for s in good),
        "stages": stages,
        "stages_cpu": cpu,
        "compile_s": sum(stages[stage] for stage in STAGES if stage not in ("import", "steps")),
        "compile_cpu_s": sum(cpu[stage] for stage in STAGES if stage not in ("import", "steps")),
        "same": reference is not None and all(s["theta"] == reference["theta"] for s in good),
        "compiles": [s["kernels"]["compiles"] for s in good],
        "samples": samples,
    }


def print_table(rows: list[dict[str, Any]], cpu: bool = False) -> None:
    """Seconds by stage (wall-clock; CPU seconds with ``cpu``); ``compile``: every stage but import and steps."""
    stages, total = ("stages_cpu", "compile_cpu_s") if cpu else ("stages", "compile_s")
    header = (
        f"{'variant':<16}{'machine':<8}" + "".join(f"{stage:>10}" for stage in STAGES) + f"{'compile':>9}{'same':>6}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        if "error" in row:
            print(f"{row['variant']:<16}{row['machine']:<8}  failed: {row['error']}")
            continue
        cells = "".join(f"{row[stages][stage]:>10.2f}" for stage in STAGES)
        same = "yes" if row["same"] else "NO"
        print(f"{row['variant']:<16}{row['machine']:<8}{cells}{row[total]:>9.2f}{same:>6}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 4, 50 steps, the default variant, 1 round")
    parser.add_argument("--variant", action="append", choices=VARIANTS, help="variants (default: all)")
    parser.add_argument("--machine", action="append", choices=MACHINES, help="machine states (default: both)")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default 2; quick 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch's threads in every child")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--prime", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_compile_stages.json")
    args = parser.parse_args(argv)
    if args.prime:
        prime(args.prime)
        return {}
    if args.child:
        variant, particles, steps, threads = args.child
        result = child(variant, int(particles), int(steps), int(threads))
        print(json.dumps(result))
        return result

    particles, steps = (4, 50) if args.quick else (256, 6_000)
    variants = args.variant or (["default"] if args.quick else list(VARIANTS))
    if "default" not in variants:
        variants.insert(0, "default")
    machines = args.machine or (["fresh"] if args.quick else list(MACHINES))
    cases = [(v, m) for m in machines for v in variants if not (v == "known-isa" and m == "set-up")]
    repeats = args.repeats or (1 if args.quick else 2)
    before = {**machine.describe(), "threads": args.threads}
    samples: dict[tuple[str, str], list[dict[str, Any]]] = {case: [] for case in cases}
    for r in range(repeats):
        for variant, machine_state in cases:
            result = launch(variant, machine_state, particles, steps, args.threads)
            samples[(variant, machine_state)].append(result)
            brief = result.get("error") or f"call {result['call_s']:.2f} s, load {os.getloadavg()[0]:.2f}"
            print(f"  round {r + 1}: {variant} {machine_state}: {brief}", flush=True)
    after = os.getloadavg()
    reference = next((s for case in cases if case[0] == "default" for s in samples[case] if "error" not in s), None)
    rows = [
        _row(variant, machine_state, samples[(variant, machine_state)], reference) for variant, machine_state in cases
    ]
    print(f"\nlqr-1d N = {particles}, {steps} steps, compile=True; seconds, medians of {repeats}")
    print(machine.caption(before, after) + "\n")
    print("wall-clock seconds")
    print_table(rows)
    print("\nCPU seconds (this process and its children: less sensitive to the load)")
    print_table(rows, cpu=True)
    payload = {
        "quick": args.quick,
        "particles": particles,
        "steps": steps,
        "repeats": repeats,
        "machine": {**before, "load_average_after": after},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1))
    print(f"\nwrote {args.out}")
    return payload


if __name__ == "__main__":
    main()
