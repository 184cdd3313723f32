"""Every benchmark script runs end to end at tiny sizes (--quick), so that none of them rots.

These are not timed tests: they check that each script finishes, prints its table and
writes JSON with the expected rows. The JAX rows appear only when jax is installed.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # minutes in all; .ci/run runs them (pytest -m slow)
ROOT = Path(__file__).resolve().parent.parent
HAS_JAX = importlib.util.find_spec("jax") is not None


def run_module(module: str, tmp_path: Path, *args: str, timeout: int = 300) -> dict:
    out = tmp_path / f"{module}.json"
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(out.read_text())


def test_bench_step_quick(tmp_path):
    payload = run_module("bench_step", tmp_path, "--quick")
    variants = {(row["work"], row["variant"]) for row in payload["rows"]}
    for variant in ("seed loop", "fwdtrain eager", "fwdtrain compiled"):
        assert ("lqr-1d N=1", variant) in variants
    assert (("lqr-1d N=1", "jax scan") in variants) == HAS_JAX
    assert (("lqr-1d N=1", "jax hand") in variants) == HAS_JAX
    assert all(row["particle_steps_per_s"] > 0 for row in payload["rows"])
    kernel_works = {row["work"] for row in payload["rows"] if not row["work"].startswith("user loop")}
    assert {entry["work"] for entry in payload["roofline"]} == kernel_works


def test_bench_step_flags_segments_that_slow_down(capsys):
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_step import print_drift

    print_drift(
        [
            {"work": "lqr-1d N=100", "variant": "slowing", "samples_steps_per_s": [100.0, 80.0, 50.0]},
            {"work": "lqr-1d N=100", "variant": "steady", "samples_steps_per_s": [100.0, 90.0, 98.0]},
        ]
    )
    out = capsys.readouterr().out
    assert "slowing: its last segment took 2.00x its first" in out and "steady" not in out


def test_time_to_result_quick(tmp_path):
    rows = run_module("time_to_result", tmp_path, "--quick")["rows"]
    found = {(row["variant"], row["cache"]) for row in rows}
    expected = {("fwdtrain eager", "-"), ("fwdtrain compiled", "cold"), ("fwdtrain compiled", "warm")}
    assert found == expected | ({("jax hand", "-")} if HAS_JAX else set())
    assert all(row["call_s"] > 0 and row["process_s"] > row["call_s"] for row in rows)
    warm = next(row for row in rows if row["cache"] == "warm")["samples"][0]
    assert warm["kernels"]["fallbacks"] == 0


def test_bench_compile_stages_quick(tmp_path):
    """One real compile on empty caches, timed by stage: every stage inductor runs on a fresh machine took time (the
    instruction-set probe, the precompiled headers, export, code generation, the C++ compiler, the load), the
    stages account for the call (what is left, fwdtrain's own work, is a small part), and the run trained what the
    default did."""
    payload = run_module("bench_compile_stages", tmp_path, "--quick", timeout=1200)  # a compile: minutes at load 8
    (row,) = payload["rows"]
    assert (row["variant"], row["machine"], row["same"]) == ("default", "fresh", True)
    (sample,) = row["samples"]
    assert sample["kernels"]["compiles"] == 1 and sample["kernels"]["fallbacks"] == 0
    for stage in ("isa probe", "headers", "export", "codegen", "c++", "load"):
        assert sample["calls"][stage] >= 1 and row["stages"][stage] > 0, stage
    assert abs(sample["stages"]["rest"]) < 0.2 * sample["call_s"]


def test_bench_memory_quick(tmp_path):
    result = run_module("bench_memory", tmp_path, "--quick")
    assert result["steps"] >= 500 and result["rss_final_mib"] > 0


def test_bench_strategies_quick(tmp_path):
    rows = run_module("bench_strategies", tmp_path, "--quick")["rows"]
    assert {row["strategy"] for row in rows} >= {"partial-jacrev", "composed-jacrev", "composed-jacfwd"}


def test_seed_loop_trains_without_graph_errors():
    """The repaired seed loop runs (the original fails on the second backward pass)."""
    from benchmarks import seed_loop

    propagator = seed_loop.train(steps=50)
    assert propagator.X.grad_fn is None and propagator.Xtilde_w.grad_fn is None
    assert all(p.grad is not None for p in propagator.model.parameters())


@pytest.mark.skipif(not HAS_JAX, reason="jax is an optional extra: pip install fwdtrain[jax]")
@pytest.mark.parametrize("name", ["lqr-1d", "lqr-3d"])
def test_jax_impl_computes_what_fwdtrain_computes(name):
    """Same theta, same noise: the JAX step and fwdtrain's advance agree (float32)."""
    import jax
    import numpy as np
    import torch

    import fwdtrain as ft
    from benchmarks import jax_impl, problems
    from fwdtrain.core.sensitivity import Plan
    from fwdtrain.problems.cost import CostForm

    problem = problems.lqr(name)
    particles, d = 3, problem.x0.shape[0]
    state = ft.init(problem.sde, problem.theta, problem.x0, particles)
    jax_state = jax_impl.init_state({k: v.numpy() for k, v in problem.theta.items()}, problem.x0.numpy(), particles)
    step = jax.jit(jax_impl.make_step(problems.jax_coefficients(problem), problem.dt, problem.lr))
    noise = torch.randn(30, particles, d, generator=torch.Generator().manual_seed(2)) * problem.dt**0.5
    for dw in noise:
        state, _ = CostForm(problem.sde).advance(state, dw, problem.dt, problem.lr, Plan("reverse", "generic"))
        jax_state, _ = step(jax_state, jax.numpy.asarray(dw.numpy()))
    np.testing.assert_allclose(np.asarray(jax_state.x), state.x.numpy(), rtol=1e-4, atol=1e-5)
    for key, leaf in state.x_tilde.items():
        np.testing.assert_allclose(np.asarray(jax_state.x_tilde[key]), leaf.numpy(), rtol=1e-4, atol=1e-5)
    for key, leaf in state.theta.items():
        np.testing.assert_allclose(np.asarray(jax_state.theta[key]), leaf.numpy(), rtol=1e-4, atol=1e-6)


def test_bench_eager_quick(tmp_path):
    rows = run_module("bench_eager", tmp_path, "--quick")["rows"]
    variants = {(row["particles"], row["variant"]) for row in rows}
    for particles in (1, 100):
        for variant in (
            "seed loop",
            "generic SDE, inferred noise",
            "ControlledSDE, additive",
            "check_step_inputs only",
        ):
            assert (particles, variant) in variants
    assert all(row["steps_per_s"] > 0 for row in rows)


@pytest.mark.skipif(not HAS_JAX, reason="jax is an optional extra: pip install fwdtrain[jax]")
def test_jax_hand_computes_what_fwdtrain_computes():
    """The hand-specialised program (only u differentiated, chain rule by hand) and fwdtrain's
    generic advance agree on the seed problem: same theta, same noise (float32)."""
    import jax
    import numpy as np
    import torch

    import fwdtrain as ft
    from benchmarks import jax_hand, problems
    from fwdtrain.core.sensitivity import Plan
    from fwdtrain.problems.cost import CostForm

    problem = problems.lqr("lqr-1d")
    particles = 3
    state = ft.init(problem.sde, problem.theta, problem.x0, particles)
    hand = jax_hand.init({k: v.numpy() for k, v in problem.theta.items()}, 1.0, particles)
    step = jax.jit(jax_hand.make_step(problem.dt, lambda t: problem.lr))
    noise = torch.randn(30, particles, 1, generator=torch.Generator().manual_seed(2)) * problem.dt**0.5
    for dw in noise:
        state, info = CostForm(problem.sde).advance(state, dw, problem.dt, problem.lr, Plan("reverse", "generic"))
        hand, cost = step(hand, jax.numpy.asarray(dw[:, 0].numpy()))
        np.testing.assert_allclose(float(cost), float(info.cost), rtol=1e-4)
    np.testing.assert_allclose(np.asarray(hand.x), state.x[:, 0].numpy(), rtol=1e-4, atol=1e-5)
    for key, leaf in state.x_tilde.items():
        np.testing.assert_allclose(np.asarray(hand.x_tilde[key]), leaf[:, 0].numpy(), rtol=1e-4, atol=1e-5)
    for key, leaf in state.theta.items():
        np.testing.assert_allclose(np.asarray(hand.theta[key]), leaf.numpy(), rtol=1e-4, atol=1e-6)


def test_bench_ensemble_quick(tmp_path):
    rows = run_module("bench_ensemble", tmp_path, "--quick")["rows"]
    assert [row["variant"] for row in rows] == ["single", "sequential", "ensemble"]
    assert all(row["member_steps_per_s"] > 0 for row in rows)
    assert rows[-1]["max_member_difference"] < 1e-4  # the ensemble's last member is the run alone, to rounding


def test_bench_jumps_quick(tmp_path):
    rows = run_module("bench_jumps", tmp_path, "--quick")["rows"]
    paths = {row["path"] for row in rows}
    assert paths == {"ft.run compiled N=1", "ft.run compiled N=256", "ft.run eager N=256", "ft.step eager loop N=1"}
    assert {row["work"] for row in rows} == {"brownian", "jumps additive", "jumps proportional", "jumps rate(x, u)"}
    assert all(row["steps_per_s"] > 0 for row in rows)
    assert all(row["vs_brownian"] == 1 for row in rows if row["work"] == "brownian")


def test_bench_events_quick(tmp_path):
    payload = run_module("bench_events", tmp_path, "--quick")
    variants = {row["variant"] for row in payload["rows"]}
    expected = {
        "fwdtrain batch (warm)",
        "fwdtrain online",
        "numpy/scipy exact MLE (profile over decay)",
        "fwdtrain batch, 4 decays fitted",
        "fwdtrain batch (general engine)",
    }
    assert expected <= variants
    assert payload["summary"]["max_relative_difference_batch_scipy"] < 1e-4
    assert payload["summary"]["state_dependent_max_relative_difference"] < 1e-3
