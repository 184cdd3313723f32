"""The default route against the two fixed ones: ``compile="auto"`` next to ``True`` and ``False``, each case in
fresh processes, on three machines: ``fresh`` (empty kernel and compiler caches), ``warm`` (a cache where
another problem was compiled before: inductor set up, this case's kernel not there) and ``again`` (the cache
the same route's fresh launch left: a second launch of the same command).

    python -m benchmarks.bench_route                  # every case (about 20 minutes on a 2-core CPU)
    python -m benchmarks.bench_route --case readme    # one case
    python -m benchmarks.bench_route --quick          # tiny sizes, torch.compile's "eager" backend (seconds)

Cases (``CASES``):

- ``readme``: the README's job, ``python -m fwdtrain``'s lqr-1d at N = 256, 6,000 steps in one call;
- ``mlp-2d``: a 2-D LQR with a 2-32-32-2 tanh control (``examples.lqr_nd(dim=2, control="mlp")``), N = 256,
  20,000 steps in one call; its eager time is the eager rate of its first ``--eager-steps`` steps times the
  steps (a full eager run takes about half an hour);
- ``segments``: the same 2-D problem continued in segments of 250 steps to 10,000 steps, as research code does
  (``run(problem, previous_run, 250, ...)`` in a loop);
- ``mlp-3d``: a 3-D LQR with a 3-32-32-3 tanh control, N = 128, 4,000 steps in one call;
- ``seed-N1``, ``seed-N100``: the seed problem continued in segments of 2,048 steps (``bench_step``'s work), 20
  segments;
- ``new-target``: one 250-step run of ``examples.ou_calibration`` whose target mean (a constant the cost closes
  over) is new at every launch (1.0 fresh, 1.5 again, 2.0 warm): no launch finds its own kernel on disk.

Each timing is the wall-clock of a fresh ``python`` process from its first ``run`` call to its last (imports
and interpreter start left out; the same for every route); a background compile that outlives its launch is
waited for before the next launch (``compile_after_s``), and ``routes`` says where each call switched.
For ``warm``, the process runs on the cache folder
its fresh launch of the same route left. ``x best`` is the route's time over the better fixed route's in the same
column. Writes benchmarks/results/bench_route.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import machine

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
ROUTES = ("auto", "True", "False")

CASES: dict[str, dict[str, Any]] = {
    "readme": {"problem": "lqr-1d", "particles": 256, "segment": 6_000, "segments": 1},
    "mlp-2d": {"problem": "mlp-2d", "particles": 256, "segment": 20_000, "segments": 1},
    "segments": {"problem": "mlp-2d", "particles": 256, "segment": 250, "segments": 40},
    "seed-N1": {"problem": "lqr-1d", "particles": 1, "segment": 2_048, "segments": 20},
    "seed-N100": {"problem": "lqr-1d", "particles": 100, "segment": 2_048, "segments": 20},
    "mlp-3d": {"problem": "mlp-3d", "particles": 128, "segment": 4_000, "segments": 1},
    "new-target": {"problem": "new-target", "particles": 64, "segment": 250, "segments": 1},
}
NEW_TARGETS = {"fresh": 1.0, "again": 1.5, "warm": 2.0}  # the new-target case's target mean per machine
QUICK = {"problem": "lqr-1d", "particles": 4, "segment": 50, "segments": 3}
PRIME = {"problem": "lqr-1d", "particles": 2, "segment": 20, "segments": 1}  # the warm machine's other compile
MACHINES = ("fresh", "warm", "again")


def example_of(problem: str, particles: int, target: float = 1.0) -> Any:
    import fwdtrain as ft

    if problem in ("mlp-2d", "mlp-3d"):
        return ft.examples.lqr_nd(dim=int(problem[-2]), control="mlp", hidden=32, particles=particles)
    if problem == "new-target":
        return ft.examples.ou_calibration(target_mean=target, particles=particles)
    return ft.examples.lqr_1d(particles=particles)


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One process's run of a case: its segments, timed from the first call to the last."""
    import torch

    import fwdtrain as ft

    torch.set_num_threads(spec["threads"])
    ex = example_of(spec["problem"], spec["particles"], spec.get("target", 1.0))
    compile_: Any = {"auto": "auto", "True": True, "False": False}[spec["route"]]
    if spec["quick"] and compile_ is True:
        compile_ = ft.Compile(True, compiler="dynamo", backend="eager")
    segment, segments = spec["segment"], spec["segments"]
    eager_cap = spec.get("eager_steps")
    extrapolated = compile_ is False and eager_cap is not None and eager_cap < segment * segments
    if extrapolated:  # an eager rate measured on the first steps, times the steps
        segment, segments = eager_cap, 1
    start: Any = ex.initial_state()
    routes = []
    clock = time.perf_counter()
    for _ in range(segments):
        start = ft.run(ex.trainable, start, segment, ex.dt, ex.lr, ex.noise(0), compile=compile_)
        switched = start.history.compiled_from
        routes.append(start.history.route if switched is None else f"compiled from {int(switched)}")
    seconds = time.perf_counter() - clock
    if extrapolated:
        seconds *= spec["segment"] * spec["segments"] / eager_cap
    return {"seconds": seconds, "routes": routes, "extrapolated": extrapolated}


def launch(spec: dict[str, Any], cache: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "FWDTRAIN_CACHE_DIR": str(cache),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_route", "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=7200,
    )
    if done.returncode != 0:
        raise RuntimeError(f"worker {spec} failed:\n{done.stderr[-3000:]}")
    clock = time.perf_counter()
    while list((cache / "kernels").glob("*.job")) and time.perf_counter() - clock < 900:
        time.sleep(1)  # a background compile the launch left finishes before the next launch starts
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "compile_after_s": time.perf_counter() - clock}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="cases to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and torch.compile's eager backend")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eager-steps", type=int, default=300, help="steps timed for an extrapolated eager row")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    cases = {"quick": QUICK} if args.quick else {name: CASES[name] for name in (args.case or CASES)}
    load_before = os.getloadavg()
    rows = []
    for name, case in cases.items():
        times: dict[tuple[str, str], dict[str, Any]] = {}
        with tempfile.TemporaryDirectory(prefix="fwdtrain-route-") as root:
            primed = Path(root) / "primed"  # another problem compiled: inductor set up, this kernel absent
            launch({**PRIME, "route": "True", "threads": args.threads, "quick": args.quick}, primed)
            for route in ROUTES:
                shutil.copytree(primed, Path(root) / f"warm-{route}")
            # machine by machine, the three routes one after the other: a load that drifts shifts them alike
            for machine_state in ("fresh", "again", "warm"):
                for route in ROUTES:
                    spec = {**case, "route": route, "threads": args.threads, "quick": args.quick}
                    if name in ("mlp-2d", "segments"):
                        spec["eager_steps"] = args.eager_steps
                    if name == "new-target":
                        spec["target"] = NEW_TARGETS[machine_state]
                    folder = Path(root) / (f"warm-{route}" if machine_state == "warm" else f"own-{route}")
                    times[(route, machine_state)] = launch(spec, folder)
                    print(f"{name:10s} {route:6s} {machine_state:5s} {times[(route, machine_state)]}", flush=True)
        for machine_state in MACHINES:
            best = min(times[(route, machine_state)]["seconds"] for route in ("True", "False"))
            for route in ROUTES:
                got = times[(route, machine_state)]
                rows.append(
                    {
                        "case": name,
                        "machine": machine_state,
                        "route": route,
                        "seconds": got["seconds"],
                        "x_best": got["seconds"] / best,
                        "routes": got["routes"],
                        "extrapolated": got["extrapolated"],
                    }
                )
    load_after = os.getloadavg()
    print(f"\nload {load_before[0]:.2f} before, {load_after[0]:.2f} after; {machine.describe()}")
    print("| case | machine | compile= | s | x best fixed | route of each call |")
    print("|---|---|---|---:|---:|---|")
    for row in rows:
        calls = row["routes"]
        shown = (
            calls[0]
            if len(set(calls)) == 1
            else f"{calls.count('eager')} eager, {sum(c.startswith('compiled') for c in calls)} compiled"
        )
        mark = " (extrapolated)" if row["extrapolated"] else ""
        print(
            f"| {row['case']} | {row['machine']} | {row['route']} | {row['seconds']:.1f}{mark} | {row['x_best']:.2f} | "
            f"{shown} |"
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("bench_route_quick.json" if args.quick else "bench_route.json")
    out.write_text(json.dumps({"rows": rows, "load": [load_before, load_after], "machine": machine.describe()}))


if __name__ == "__main__":
    main()
