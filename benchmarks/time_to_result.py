"""Time to result: the seed problem trained in a fresh process, from the call to the trained theta and for the
whole process: fwdtrain eager, compiled and the default "auto" with an empty, a used and a warm cache, next to
the hand-written JAX program (its compile included).

    python -m benchmarks.time_to_result --threads 1     # N = 256, 6,000 steps of dt 0.01, 3 rounds (~6 min)
    python -m benchmarks.time_to_result --quick         # N = 4, 50 steps, torch.compile's "eager" (seconds)

Every measurement is a fresh ``python`` process. fwdtrain's processes run
``ft.run(ex.sde, ft.init(...), steps, ex.dt, ex.lr, 0, compile=...)`` on ``examples.lqr_1d`` (1 -> 16 -> 1
ReLU control, alpha = 10 / (20 + t)); the JAX process runs ``jax_hand.time_to_result`` on the same initial
theta (read from a file, so that it imports neither torch nor fwdtrain) and schedule. Each round gives the
compiled processes a new cache folder (``FWDTRAIN_CACHE_DIR``; inductor's caches and headers live inside it):

- cold: the folder is empty (a first compile on this machine: the instruction-set probe and the precompiled
  headers are built too);
- warm: a second fresh process on the same folder (the kernel's package is on disk; for "auto", the folder
  its own cold launch left: the default run launched twice);
- new: a folder where another kernel (the same problem at N = 8) was compiled first, untimed: the
  instruction-set probe's result and the precompiled headers are there, this kernel is not (a new problem
  or size on a machine that has compiled before).

``call s`` is from the call of ``ft.run`` (or of ``jax_hand.time_to_result``) to the result; ``process s``
is the parent's clock around the whole child (interpreter start, imports, setup, the run, exit). Rounds are
interleaved and the table shows medians, with ratios to the JAX program of the same run; the load average
before and after goes into the JSON. Writes benchmarks/results/time_to_result.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import machine

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
COMPILE = {  # the child's kind -> ft.run's compile=
    "eager": "False",
    "compiled": "True",
    "auto": '"auto"',
    "compiled-quick": 'ft.Compile(True, compiler="dynamo", backend="eager")',
}


def linear_slope(theta: dict[str, np.ndarray]) -> float:
    """Least-squares slope on [-1, 1] of u(x) = W1 relu(W0 x + b0) (the trained gain is minus this)."""
    xs = np.linspace(-1.0, 1.0, 201)
    hidden = np.maximum(np.outer(xs, theta["weight0"][:, 0]) + theta["bias0"], 0.0)
    us = hidden @ theta["weight1"][0]
    centred = xs - xs.mean()
    return float((centred * (us - us.mean())).sum() / (centred**2).sum())


# ---------------------------------------------------------------- children (one measurement each)


def _fwdtrain_child(kind: str, particles: int, steps: int, threads: int) -> dict[str, Any]:
    clock = time.perf_counter()
    import torch

    import fwdtrain as ft
    from fwdtrain.compile import kernels

    if threads:
        torch.set_num_threads(threads)
    imported = time.perf_counter() - clock
    clock = time.perf_counter()
    ex = ft.examples.lqr_1d(particles=particles)
    state = ft.init(ex.sde, ex.theta, ex.x0, particles)
    compile = eval(COMPILE[kind], {"ft": ft})
    setup = time.perf_counter() - clock
    clock = time.perf_counter()
    result = ft.run(ex.sde, state, steps, ex.dt, ex.lr, 0, compile=compile)
    seconds = time.perf_counter() - clock
    theta = {k: v.numpy() for k, v in result.state.theta.items()}
    return {
        "call_s": seconds,
        "import_s": imported,
        "setup_s": setup,
        "slope": linear_slope(theta),
        "average_cost": float(result.history.average_cost[-1]),
        "kernels": kernels.counts(),
        "threads": torch.get_num_threads(),
    }


def _jax_child(particles: int, steps: int, theta_file: str) -> dict[str, Any]:
    clock = time.perf_counter()
    import jax

    from . import jax_hand

    imported = time.perf_counter() - clock
    with np.load(theta_file) as data:
        theta = {k: data[k] for k in data.files}
    seconds, state = jax_hand.time_to_result(theta, particles, steps, 0.01)
    trained = {k: np.asarray(v) for k, v in state.theta.items()}
    return {
        "call_s": seconds,
        "import_s": imported,
        "setup_s": 0.0,
        "slope": linear_slope(trained),
        "jax": jax.__version__,
    }


def _launch(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """One fresh child process; its JSON line, with ``process_s`` the parent's clock around it."""
    clock = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.time_to_result", "--child", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    process = time.perf_counter() - clock
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process_s": process}


# ---------------------------------------------------------------- the parent


def _environment(threads: int | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("TORCHINDUCTOR_CACHE_DIR", "FWDTRAIN_CACHE_DIR"):
        env.pop(name, None)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
        if threads == 1:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
    return env


def _has_jax() -> bool:
    try:
        import jax  # noqa: F401
    except ImportError:
        return False
    return True


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (variant, cache) in every round, interleaved; the samples of each."""
    samples: dict[tuple[str, str], list[dict[str, Any]]] = {}
    env = _environment(args.threads)
    size = [str(args.particles), str(args.steps), str(args.threads or 0)]

    def launch(label: str, cache: str, kind: str, folder: str | None, r: int, *extra: str) -> None:
        child_env = {**env, "FWDTRAIN_CACHE_DIR": folder} if folder else env
        result = _launch([kind, *size, *extra], child_env)
        samples.setdefault((label, cache), []).append(result)
        print(f"  round {r + 1}: {label} {cache}: {_brief(result)}", flush=True)

    with tempfile.TemporaryDirectory(prefix="fwdtrain-ttr-") as root:
        import fwdtrain as ft  # the initial theta for the JAX child, written once

        theta_file = os.path.join(root, "theta.npz")
        np.savez(theta_file, **{k: v.numpy() for k, v in ft.examples.lqr_1d(particles=args.particles).theta.items()})
        for r in range(args.repeats):
            launch("fwdtrain eager", "-", "eager", os.path.join(root, f"eager-{r}"), r)
            if args.quick:
                for cache in ("cold", "warm"):
                    launch("fwdtrain compiled", cache, "compiled-quick", os.path.join(root, f"quick-{r}"), r)
            else:
                folder = os.path.join(root, f"compiled-{r}")
                for cache in ("cold", "warm"):
                    launch("fwdtrain compiled", cache, "compiled", folder, r)
                for kind, label in (("compiled", "fwdtrain compiled"), ("auto", "fwdtrain auto (default)")):
                    used = os.path.join(root, f"used-{kind}-{r}")  # another kernel (N = 8) compiled first, untimed
                    _launch(["compiled", "8", "10", str(args.threads or 0)], {**env, "FWDTRAIN_CACHE_DIR": used})
                    launch(label, "new", kind, used, r)
                auto = os.path.join(root, f"auto-{r}")  # the default run launched twice: what a user sees
                for cache in ("cold", "warm"):
                    launch("fwdtrain auto (default)", cache, "auto", auto, r)
            if _has_jax():
                launch("jax hand", "-", "jax", None, r, theta_file)
    labels = ["fwdtrain eager", "fwdtrain compiled", "fwdtrain auto (default)", "jax hand"]
    caches = ["-", "cold", "new", "warm"]
    ordered = sorted(samples.items(), key=lambda item: (labels.index(item[0][0]), caches.index(item[0][1])))
    return [_row(label, cache, results) for (label, cache), results in ordered]


def _brief(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"failed: {result['error']}"
    kernels = f" kernels {result['kernels']}" if "kernels" in result else ""
    return f"call {result['call_s']:.2f} s, process {result['process_s']:.2f} s, slope {result['slope']:+.4f}{kernels}"


def _row(label: str, temperature: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in results if "error" not in r]
    row: dict[str, Any] = {"variant": label, "cache": temperature, "samples": results}
    if good:
        for key in ("call_s", "process_s", "import_s", "setup_s", "slope"):
            row[key] = statistics.median(r[key] for r in good)
    else:
        row["error"] = results[-1].get("error")
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    jax = next((r for r in rows if r["variant"] == "jax hand" and "call_s" in r), None)
    header = (
        f"{'variant':<26}{'cache':>6}{'call s':>9}{'x jax':>8}{'process s':>11}{'x jax':>8}{'import s':>10}{'slope':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        if "call_s" not in r:
            print(f"{r['variant']:<26}{r['cache']:>6}  failed: {r.get('error')}")
            continue
        r["call_vs_jax"] = r["call_s"] / jax["call_s"] if jax else None
        r["process_vs_jax"] = r["process_s"] / jax["process_s"] if jax else None
        ratios = [f"{v:.2f}" if v is not None else "-" for v in (r["call_vs_jax"], r["process_vs_jax"])]
        print(
            f"{r['variant']:<26}{r['cache']:>6}{r['call_s']:>9.2f}{ratios[0]:>8}{r['process_s']:>11.2f}"
            f"{ratios[1]:>8}{r['import_s']:>10.2f}{r['slope']:>+9.4f}"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 4, 50 steps, torch.compile's 'eager', 1 round")
    parser.add_argument("--particles", type=int, default=None, help="N (default 256)")
    parser.add_argument("--steps", type=int, default=None, help="steps (default 6,000)")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default 3; quick 1)")
    parser.add_argument("--threads", type=int, default=None, help="threads of torch and XLA in every child")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS / "time_to_result.json")
    args = parser.parse_args(argv)
    if args.child:
        kind, particles, steps, threads, *rest = args.child
        if kind == "jax":
            result = _jax_child(int(particles), int(steps), rest[0])
        else:
            result = _fwdtrain_child(kind, int(particles), int(steps), int(threads))
        print(json.dumps(result))
        return result

    args.particles = args.particles or (4 if args.quick else 256)
    args.steps = args.steps or (50 if args.quick else 6_000)
    args.repeats = args.repeats or (1 if args.quick else 3)
    before = {**machine.describe(), "threads": args.threads or "torch's default"}
    rows = measure(args)
    after = os.getloadavg()
    print(f"\nlqr-1d N = {args.particles}, {args.steps} steps; medians of {args.repeats} round(s)")
    print(machine.caption(before, after) + "\n")
    print_table(rows)
    payload = {
        "quick": args.quick,
        "particles": args.particles,
        "steps": args.steps,
        "repeats": args.repeats,
        "threads": args.threads,
        "machine": {**before, "load_average_after": after},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1))
    print(f"\nwrote {args.out}")
    return payload


if __name__ == "__main__":
    main()
