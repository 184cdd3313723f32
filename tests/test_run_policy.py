"""What ``run`` decides and checks by itself: ``compile="auto"``, the schedule's values during the run,
and user noise of the wrong dtype, all before (or instead of) a silently wrong step."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

import fwdtrain as ft
from fwdtrain import cli
from fwdtrain.compile import kernels, policy

DT = 0.01
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def linear_problem(particles: int = 4, dtype: torch.dtype = torch.float64):
    sde = ft.ControlledSDE(
        control=lambda th, x: -th["k"] * x,
        drift=lambda x, u: -x + u,
        diffusion=lambda x, u: torch.ones_like(x),
        cost=lambda x, u: (x * x + u * u).sum(),
    )
    return sde, ft.init(sde, {"k": torch.tensor(0.2, dtype=dtype)}, torch.ones(1, dtype=dtype), particles)


def test_the_cost_model_compiles_when_the_projected_eager_time_exceeds_compiling(monkeypatch, tmp_path):
    monkeypatch.setenv("FWDTRAIN_CACHE_DIR", str(tmp_path))  # a machine that never compiled: the assumed costs
    per_node, speedup = policy.ASSUMED_SECONDS_PER_NODE, policy.ASSUMED_SPEEDUP
    nodes, eager_step = 370, 3e-3  # the seed step's graph; 3 ms per eager step at N = 256
    compile_s = per_node * nodes
    # a kernel not on disk pays back over this run and one later run of the same length, which loads it:
    # compile_s + T / s < T + (T - T / s - load - trace), T the eager seconds left
    extra = policy.LOAD_SECONDS + policy.TRACE_SECONDS
    break_even = (compile_s + extra) / (2 * eager_step * (1 - 1 / speedup))
    below = policy.decide(eager_step, int(break_even * 0.9), warm=False, nodes=nodes)
    above = policy.decide(eager_step, int(break_even * 1.1), warm=False, nodes=nodes)
    assert not below.compile and above.compile
    assert below.compiled_s > below.eager_s and above.compiled_s > above.eager_s  # this run alone: eager is faster
    assert above.reuse_s == pytest.approx(above.eager_s * (1 - 1 / speedup) - extra)
    warm = policy.decide(eager_step, 1000, warm=True, nodes=nodes)  # a package on disk: a load, no reuse credit
    assert warm.compile and warm.reuse_s == 0.0
    assert not policy.decide(1e-4, 100, warm=True, nodes=nodes).compile  # 10 ms of eager steps: not worth a load
    assert not policy.worth_tracing(1e-3, 100) and policy.worth_tracing(1e-3, 10_000)
    # the machine's own record replaces the assumed constants
    ft.compile.cache.record_compile(2 * compile_s, nodes)
    assert policy.seconds_per_node() == pytest.approx(2 * per_node)
    policy.record_speedup(3e-3, 3e-4)
    assert policy.speedup() == pytest.approx(10.0)


def test_eager_time_already_spent_counts_towards_compiling(monkeypatch, tmp_path):
    """The ski-rental rule: a run too short to pay for a compile alone compiles once earlier runs of the same
    problem have spent that price eagerly in this process."""
    monkeypatch.setenv("FWDTRAIN_CACHE_DIR", str(tmp_path))
    nodes, eager_step, steps = 370, 4e-4, 2048  # the seed step at N = 1, segments of 2,048 steps
    compile_s = policy.ASSUMED_SECONDS_PER_NODE * nodes
    assert not policy.decide(eager_step, steps, warm=False, nodes=nodes).compile
    assert not policy.decide(eager_step, steps, warm=False, nodes=nodes, spent_s=0.5 * compile_s).compile
    assert policy.decide(eager_step, steps, warm=False, nodes=nodes, spent_s=compile_s).compile
    assert not policy.worth_tracing(eager_step, steps) and policy.worth_tracing(eager_step, steps, spent_s=1.0)


def test_a_run_continued_in_short_segments_compiles_once_its_eager_time_pays_and_then_keeps_its_kernel(monkeypatch):
    """Continued runs under "auto": each kept eager adds its eager seconds to what the problem has spent; the
    policy sees that sum, and once one run compiles, later runs of the problem compile at once (no eager probe,
    no new decision)."""
    monkeypatch.setattr(policy, "_SPENT", {})
    monkeypatch.setattr(policy, "_COMPILED", {})
    seen: list[float] = []

    def decide(eager_step, remaining, *, warm, nodes, spent_s=0.0):
        seen.append(spent_s)
        return policy.Decision(len(seen) == 3, eager_step * remaining, 1.0)  # the third run compiles

    monkeypatch.setattr(policy, "worth_tracing", lambda *args: True)
    monkeypatch.setattr(policy, "decide", decide)
    sde, start = linear_problem()
    auto = ft.Compile("auto", route="dynamo", backend="eager")
    chosen = []
    for _ in range(5):
        loop = ft.driver.setup(sde, start, 30, DT, 0.5, 3, compile=auto)
        start = ft.driver.execute(loop)
        chosen.append(loop.stepper.chosen.route)
    assert chosen == ["eager", "eager", "dynamo", "dynamo", "dynamo"]
    assert len(seen) == 3 and seen[0] == 0.0 < seen[1] < seen[2]  # what the eager runs spent, summed
    assert loop.stepper.timed == [] and loop.stepper.decision is None  # the last run: no probe, no decision
    eager = ft.run(sde, linear_problem()[1], 150, DT, 0.5, 3, compile=False)
    assert start.history.step[-1] == 150
    torch.testing.assert_close(start.state.theta, eager.state.theta, rtol=1e-12, atol=1e-14)


def test_auto_stays_eager_for_a_short_run_without_tracing():
    sde, state = linear_problem()
    before = kernels.counts()
    ft.run(sde, state, 50, DT, 0.5, noise=3)
    assert kernels.counts() == before


def test_auto_compiles_when_the_policy_says_so(monkeypatch):
    """With a policy that always pays, "auto" takes the first few steps eagerly and the rest compiled (the quick
    torch.compile "eager" backend here); the result equals the eager run to rounding."""
    sde, state = linear_problem()
    monkeypatch.setattr(policy, "worth_tracing", lambda *args: True)
    monkeypatch.setattr(policy, "decide", lambda *args, **kwargs: policy.Decision(True, 1.0, 0.0))
    loop = ft.driver.setup(sde, state, 40, DT, 0.5, 3, compile=ft.Compile("auto", route="dynamo", backend="eager"))
    ft.driver.execute(loop)
    assert loop.stepper.chosen is not None and loop.stepper.route == "dynamo"
    eager, _ = ft.run(sde, state, 40, DT, 0.5, 3, compile=False)
    for a, b in zip(ft.core._tree.leaves(loop.carry.state), ft.core._tree.leaves(eager)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


_LAUNCH = (
    "import json, fwdtrain as ft\n"
    "from fwdtrain.compile import kernels\n"
    "ex = ft.examples.lqr_1d(particles=3)\n"
    "result = ft.run(ex.sde, ex.initial_state(), 20_000, ex.dt, ex.lr, 0)\n"  # compile="auto", the default
    "print(json.dumps(kernels.counts()))\n"
)


@pytest.mark.slow
def test_the_default_run_launched_twice_compiles_once_and_then_loads(tmp_path):
    """Issue 18's "a second launch takes the compiled path": two fresh processes on one (empty) cache folder,
    each a default ``run`` long enough to pay back a compile over two runs; the first compiles, the second
    loads the kernel the first left on disk and compiles nothing."""
    env = {**os.environ, "FWDTRAIN_CACHE_DIR": str(tmp_path), "PYTHONPATH": ROOT}
    counts = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _LAUNCH], capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        counts.append(json.loads(done.stdout.splitlines()[-1]))
    first, second = counts
    assert first["compiles"] >= 1 and first["fallbacks"] == 0, first
    assert second["compiles"] == 0 and second["loads"] >= 1 and second["fallbacks"] == 0, second


def test_default_run_equals_the_explicitly_eager_run():
    sde, state = linear_problem()
    default = ft.run(sde, state, 50, DT, 0.5, noise=3)
    eager = ft.run(sde, state, 50, DT, 0.5, compile=False, noise=3)
    assert all(torch.equal(a, b) for a, b in zip(ft.core._tree.leaves(default), ft.core._tree.leaves(eager)))


def test_a_schedule_that_turns_negative_stops_the_run_with_the_state_kept():
    sde, state = linear_problem()
    with pytest.raises(ValueError, match=r"returned -2.5 at t = 3"):  # negative at the end: refused up front
        ft.run(sde, state, 300, DT, lambda t: 0.5 - t)
    schedule = lambda t: torch.where((t > 0.5) & (t < 2.0), -0.5, 0.5)
    with pytest.raises(ft.DivergenceError, match=r"returned -0.5 at t = 1.*stopped at step 100") as info:
        ft.run(sde, state, 300, DT, schedule, compile=False, save=ft.SaveAt(100), checks=ft.Checks(100))
    error = info.value
    assert error.last_finite_step == 100 and math.isclose(float(error.state.t), 1.0)
    assert error.history.steps == 100 and torch.isfinite(error.state.x).all()


def test_a_schedule_bad_at_the_start_is_refused_before_any_step():
    sde, state = linear_problem()
    with pytest.raises(ValueError, match="returned nan at t = 0"):
        ft.run(sde, state, 10, DT, lambda t: math.nan)


def test_user_noise_of_another_dtype_is_refused_before_any_step():
    sde, state = linear_problem()
    noise = torch.zeros(10, 4, 1, dtype=torch.float32)
    with pytest.raises(TypeError, match="dtype torch.float32 but the run's dtype is torch.float64"):
        ft.run(sde, state, 10, DT, 0.5, noise=noise)
    with pytest.raises(ValueError, match=r"shape \(10, 3, 1\) but the run expects \(10, 4, 1\)"):
        ft.run(sde, state, 10, DT, 0.5, noise=torch.zeros(10, 3, 1, dtype=torch.float64))


def test_cli_compile_flags():
    parser = cli.build_parser()
    assert parser.parse_args(["lqr-1d"]).compile is None  # auto
    assert parser.parse_args(["lqr-1d", "--compile"]).compile is True
    assert parser.parse_args(["lqr-1d", "--no-compile"]).compile is False


def test_frozen_theta_evaluation_compiled_equals_eager():
    ex = ft.examples.lqr_1d(dtype=torch.float64, hidden=4)
    options = dict(particles=50, dt=0.01, steps=60, burn_in=10, seed=3)
    x0 = torch.zeros(1, dtype=torch.float64)
    eager = ft.stationary_cost(ex.sde, ex.theta, x0, compile=False, **options)
    traced = ft.stationary_cost(
        ex.sde, ex.theta, x0, compile=ft.Compile(True, route="dynamo", backend="eager"), **options
    )
    before = kernels.counts()
    auto = ft.stationary_cost(ex.sde, ex.theta, x0, **options)  # short: eager, nothing traced
    assert math.isclose(traced.mean, eager.mean, rel_tol=1e-12) and auto == eager and kernels.counts() == before


def test_ensemble_learning_rates_are_checked_per_member_at_both_ends():
    sde, _ = linear_problem()
    theta = {"k": torch.tensor(0.2, dtype=torch.float64)}
    states = ft.ensemble.init(sde, theta, torch.ones(1, dtype=torch.float64), 4, members=3)
    with pytest.raises(ValueError, match=r"returned -2.5 at t = 3"):
        ft.run(ft.ensemble.Ensemble(sde, 3), states, 300, DT, lambda t: 0.5 - t)
    final, history = ft.run(
        ft.ensemble.Ensemble(sde, 3), states, 20, DT, torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    )
    assert final.t.shape == (3,) and not bool(history.diverged.any())
