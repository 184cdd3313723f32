"""Time to result: the seed problem trained from call to trained theta, compilation included.

    python -m benchmarks.time_to_result            # 256 particles, 6,000 steps, dt 0.01 (a few minutes)
    python -m benchmarks.time_to_result --quick    # 4 particles, 50 steps, eager and JAX only (seconds)

Each measurement is a fresh process (a real launch): ``fwdtrain.run`` on
``examples.lqr_1d`` eager, compiled (one step per call) and fused, each twice against the
same new cache folder (``FWDTRAIN_CACHE_DIR``): first cold, then warm. Next to it the
hand-specialised JAX program (``jax_hand``: one jitted ``lax.scan`` over all steps),
compilation included. The clock starts after imports (reported apart) and stops when
the trained theta is ready. Writes JSON to benchmarks/results/time_to_result.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent


def _fwdtrain_child(particles: int, steps: int, compile: bool, fuse: int) -> dict:
    start = time.perf_counter()
    import fwdtrain as ft

    imported = time.perf_counter() - start
    ex = ft.examples.lqr_1d(particles=particles)
    state = ft.init(ex.sde, ex.theta, ex.x0, particles=particles)
    start = time.perf_counter()
    state, history = ft.run(ex.sde, state, steps, ex.dt, ex.lr, compile=compile, noise=0)
    seconds = time.perf_counter() - start
    cache = {}
    if "torch._dynamo" in sys.modules:  # did the kernels come from the on-disk cache?
        from torch._dynamo.utils import counters

        cache = {key: counters["inductor"][key] for key in ("fxgraph_cache_hit", "fxgraph_cache_miss")}
    return {"seconds": seconds, "import_s": imported, "average_cost": float(history.average_cost[-1]), **cache}


def _jax_child(particles: int, steps: int) -> dict:
    start = time.perf_counter()
    import fwdtrain as ft

    from . import jax_hand

    imported = time.perf_counter() - start
    ex = ft.examples.lqr_1d(particles=particles)
    seconds, _state = jax_hand.time_to_result({k: v.numpy() for k, v in ex.theta.items()}, particles, steps, ex.dt)
    return {"seconds": seconds, "import_s": imported}


def _launch(args: list[str], env: dict) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.time_to_result", "--child", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 particles, 50 steps, eager and JAX only")
    parser.add_argument("--fuse", type=int, default=8, help="K for the fused rows (default 8)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS / "time_to_result.json")
    args = parser.parse_args(argv)
    if args.child:
        kind, particles, steps, fuse = args.child[0], *map(int, args.child[1:])
        result = (
            _jax_child(particles, steps) if kind == "jax" else _fwdtrain_child(particles, steps, kind != "eager", fuse)
        )
        print(json.dumps(result))
        return result

    particles, steps = (4, 50) if args.quick else (256, 6_000)
    kinds = [("fwdtrain eager", "eager", 1)]
    if not args.quick:
        kinds += [("fwdtrain compiled", "compiled", 1), (f"fwdtrain fused K={args.fuse}", "fused", args.fuse)]
    rows = []
    for label, kind, fuse in kinds:
        with tempfile.TemporaryDirectory(prefix="fwdtrain-cache-") as folder:
            env = {**os.environ, "FWDTRAIN_CACHE_DIR": folder, "PYTHONPATH": str(ROOT)}
            env.pop("TORCHINDUCTOR_CACHE_DIR", None)
            for cache in ("cold", "warm") if kind != "eager" else ("-",):
                result = _launch([kind, str(particles), str(steps), str(fuse)], env)
                rows.append({"variant": label, "cache": cache, **result})
                print(rows[-1], flush=True)
    try:
        import jax  # noqa: F401
    except ImportError:
        pass
    else:
        result = _launch(["jax", str(particles), str(steps), "1"], {**os.environ, "PYTHONPATH": str(ROOT)})
        rows.append({"variant": "jax hand", "cache": "-", **result})
        print(rows[-1], flush=True)
    jax_s = next((r.get("seconds") for r in rows if r["variant"] == "jax hand"), None)
    print(f"\n{'variant':<22}{'cache':>6}{'seconds':>10}{'import s':>10}{'x jax hand':>12}")
    for r in rows:
        if "seconds" not in r:
            print(f"{r['variant']:<22}{r['cache']:>6}  failed: {r.get('error')}")
            continue
        r["vs_jax_hand"] = r["seconds"] / jax_s if jax_s else None
        ratio = f"{r['vs_jax_hand']:.1f}" if r["vs_jax_hand"] else "-"
        print(f"{r['variant']:<22}{r['cache']:>6}{r['seconds']:>10.2f}{r['import_s']:>10.2f}{ratio:>12}")
    payload = {"quick": args.quick, "particles": particles, "steps": steps, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {args.out}")
    return payload


if __name__ == "__main__":
    main()
