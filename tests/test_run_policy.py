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
from fwdtrain.compile import kernels, route

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


def cost(ops=121, numbers=1_000) -> route.StepCost:
    return route.StepCost(ops, numbers, "0" * 32)


def test_the_rule_compiles_when_the_weighed_steps_take_longer_eagerly_than_compiling():
    """S (E - K) > C, with E, K and C the module's stated constants times the counted step."""
    step = cost()
    eager_step = route.OP_SECONDS * step.ops + route.NUMBER_SECONDS * step.numbers
    gain = eager_step - route.COMPILED_NUMBER_SECONDS * step.numbers
    price = route.TRACE_SECONDS + route.COMPILE_SECONDS + route.COMPILE_SECONDS_PER_OP * step.ops
    even = price / gain
    below, above = route.choose(step, int(even * 0.95), 0, False), route.choose(step, int(even * 1.05), 0, False)
    assert not below.compiled and above.compiled
    assert below.eager_s < below.compiled_s and above.eager_s > above.compiled_s
    assert "121 ATen calls a step" in above.reason and "no kernel on disk" in above.reason
    # a kernel on disk costs a trace and a load: the same steps compile
    warm = route.choose(step, int(even * 0.95), 0, True)
    assert warm.compiled and "kernel on disk" in warm.reason
    # a cache where inductor was never set up adds its set-up to the price
    fresh = route.choose(step, int(even * 1.05), 0, False, set_up=False)
    assert not fresh.compiled and "compiler not set up" in fresh.reason
    assert fresh.compiled_s == pytest.approx(above.compiled_s + route.SETUP_SECONDS)
    # the steps a continued run took count CONTINUED_WEIGHT times each
    taken = int(even / route.CONTINUED_WEIGHT)  # weighed: 0.5 + 1 times the break-even steps
    assert route.choose(step, int(even * 0.5), taken, False).compiled
    assert not route.choose(step, int(even * 0.5), 0, False).compiled


def test_counting_a_step_counts_its_aten_calls_and_the_numbers_they_write():
    x = torch.ones(10, 3)
    out, counted = route.count_step(lambda: (x * 2).sum(0), key="a")
    assert torch.equal(out, torch.full((3,), 20.0))
    assert counted.ops == 2 and counted.numbers == 30 + 3
    _, other_key = route.count_step(lambda: (x * 2).sum(0), key="b")
    _, other_shape = route.count_step(lambda: (torch.ones(11, 3) * 2).sum(0), key="a")
    _, same = route.count_step(lambda: (x * 2).sum(0), key="a")
    assert same.signature == counted.signature
    assert len({counted.signature, other_key.signature, other_shape.signature}) == 3


def test_the_same_call_takes_the_same_route_whatever_ran_before(monkeypatch):
    """No memory in the process: a short run stays eager after a long one of the same problem compiled, and a
    continued run's route depends only on its history's steps."""
    for constant in ("COMPILE_SECONDS", "COMPILE_SECONDS_PER_OP", "SETUP_SECONDS"):
        monkeypatch.setattr(route, constant, 0.0)
    monkeypatch.setattr(route, "TRACE_SECONDS", 0.05)
    sde, state = linear_problem()
    quick = ft.Compile("auto", route="dynamo", backend="eager")
    short = ft.driver.choose_route(sde, state, 5, DT, 0.5, 3, compile=quick)
    long = ft.driver.choose_route(sde, state, 100_000, DT, 0.5, 3, compile=quick)
    assert not short.compiled and long.compiled
    first = ft.run(sde, state, 400, DT, 0.5, 3, compile=quick)
    assert first.history.route == "compiled"
    assert ft.driver.choose_route(sde, state, 5, DT, 0.5, 3, compile=quick).compiled is False
    assert ft.run(sde, state, 5, DT, 0.5, 3, compile=quick).history.route == "eager"


def test_a_run_continued_in_short_segments_compiles_once_its_steps_weigh_enough(monkeypatch):
    """Segments of 30 steps: the rule weighs each call's steps plus CONTINUED_WEIGHT times the steps before it,
    so the route turns compiled once the run is long enough, and stays so; the result equals the eager run."""
    sde, start = linear_problem()
    quick = ft.Compile("auto", route="dynamo", backend="eager")
    _, counted = route.count_step(lambda: None)
    step = route.StepCost(100, 100, counted.signature)
    gain = route.OP_SECONDS * step.ops + (route.NUMBER_SECONDS - route.COMPILED_NUMBER_SECONDS) * step.numbers
    monkeypatch.setattr(route, "COMPILE_SECONDS", gain * 100 * route.CONTINUED_WEIGHT)  # 300 steps' gain
    for constant in ("COMPILE_SECONDS_PER_OP", "TRACE_SECONDS", "LOAD_SECONDS", "SETUP_SECONDS"):
        monkeypatch.setattr(route, constant, 0.0)
    real = route.count_step
    monkeypatch.setattr(route, "count_step", lambda fn, key="": (real(fn, key)[0], step))
    routes = []
    for _ in range(6):
        start = ft.run(sde, start, 30, DT, 0.5, 3, compile=quick)
        routes.append(start.history.route)
    assert routes == ["eager"] * 4 + ["compiled"] * 2  # compiled once 30 + 3 x 120 > 300 weighed steps
    eager = ft.run(sde, linear_problem()[1], 180, DT, 0.5, 3, compile=False)
    assert start.history.step[-1] == 180
    torch.testing.assert_close(start.state.theta, eager.state.theta, rtol=1e-12, atol=1e-14)


def test_auto_stays_eager_for_a_short_run_without_tracing():
    sde, state = linear_problem()
    before = kernels.counts()
    result = ft.run(sde, state, 50, DT, 0.5, noise=3)
    assert kernels.counts() == before and result.history.route == "eager"


def test_auto_compiles_when_the_rule_says_so_and_leaves_its_marker(monkeypatch):
    """With a rule that always pays, "auto" takes its counted first step eagerly and the rest compiled (the quick
    torch.compile "eager" backend here); the result equals the eager run to rounding; the run leaves the
    marker that tells the next run its kernel is on disk."""
    sde, state = linear_problem()
    monkeypatch.setattr(route, "choose", lambda cost, steps, taken, warm, *_: route.Route(True, f"warm={warm}"))
    options = ft.Compile("auto", route="dynamo", backend="eager")
    loop = ft.driver.setup(sde, state, 40, DT, 0.5, 3, compile=options)
    result = ft.driver.execute(loop)
    assert loop.block is not None and loop.block.route == "dynamo"
    assert result.history.route == "compiled" and loop.route.reason == "warm=False"
    eager, _ = ft.run(sde, state, 40, DT, 0.5, 3, compile=False)
    for a, b in zip(ft.core._tree.leaves(loop.carry.state), ft.core._tree.leaves(eager)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    assert route.on_disk(loop.cost)
    assert ft.driver.choose_route(sde, state, 40, DT, 0.5, 3, compile=options).reason == "warm=True"


def test_progress_shows_the_route_in_one_line(capsys):
    sde, state = linear_problem()
    ft.run(sde, state, 30, DT, 0.5, 3, hooks=ft.Progress(every=10))
    lines = [line for line in capsys.readouterr().err.splitlines() if "fwdtrain: steps" in line]
    assert len(lines) == 1 and "eager (" in lines[0] and "ATen calls a step" in lines[0]
    assert str(ft.driver.choose_route(sde, state, 30, DT, 0.5, 3, compile=False)) == "eager (compile=False)"


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
    # the same numbers; the default's history also carries its counted step, for a continued run's rule
    counted = {name: default.history.carry.pop(name) for name in ("route_ops", "route_numbers", "route_signature")}
    assert route.from_carry(counted) is not None and route.from_carry(eager.history.carry) is None
    assert all(
        torch.equal(a, b) for a, b in zip(ft.core._tree.leaves(default), ft.core._tree.leaves(eager), strict=True)
    )


def test_a_continued_auto_run_takes_its_counted_step_from_the_history_and_counts_nothing(monkeypatch):
    sde, state = linear_problem()
    first = ft.run(sde, state, 20, DT, 0.5, noise=3)
    carried = route.from_carry(first.history.carry)
    assert carried is not None and carried.ops > 0
    counted = []
    real = route.count_step
    monkeypatch.setattr(route, "count_step", lambda fn, key="": counted.append(key) or real(fn, key))
    loop = ft.driver.setup(sde, first, 20, DT, 0.5, noise=3)
    second = ft.driver.execute(loop)
    assert counted == [] and loop.cost == carried and second.history.route == "eager"
    whole = ft.run(sde, state, 40, DT, 0.5, noise=3, compile=False)
    torch.testing.assert_close(second.state.theta, whole.state.theta, rtol=0, atol=0)


@pytest.mark.parametrize("compile", [False, ft.Compile(True, route="dynamo", backend="eager")])
def test_a_cosine_schedule_stops_at_the_step_whose_rate_is_negative_with_the_state_before_it(compile):
    """alpha(t) = 0.1 cos(t) is negative from t_158 = 1.58 on: the run fails at step 158 and keeps step 157."""
    ex = ft.examples.lqr_1d(particles=4, hidden=4)
    with pytest.raises(ft.DivergenceError, match=r"returned -0.00092.* at t = 1.58.*stopped at step 158") as info:
        ft.run(ex.sde, ex.initial_state(), 700, 0.01, lambda t: 0.1 * torch.cos(t), compile=compile)
    error = info.value
    assert (error.step, error.last_finite_step, error.history.steps) == (158, 157, 157)
    assert math.isclose(float(error.state.t), 1.57) and torch.isfinite(error.state.theta["weight0"]).all()
    ok = ft.run(ex.sde, ex.initial_state(), 157, 0.01, lambda t: 0.1 * torch.cos(t), compile=False)
    torch.testing.assert_close(error.state.theta, ok.state.theta, rtol=1e-5, atol=1e-6)


def test_a_schedule_that_turns_negative_stops_the_run_with_the_state_kept():
    sde, state = linear_problem()
    with pytest.raises(ValueError, match=r"returned -2.5 at t = 3"):  # negative at the end: refused up front
        ft.run(sde, state, 300, DT, lambda t: 0.5 - t)
    schedule = lambda t: torch.where((t > 0.5) & (t < 2.0), -0.5, 0.5)
    # t_50 = 0.5000000000000002 > 0.5 as the clock adds up: step 50 is the first whose rate is negative
    with pytest.raises(ft.DivergenceError, match=r"returned -0.5 at t = 0.5;.*stopped at step 50") as info:
        ft.run(sde, state, 300, DT, schedule, compile=False, save=ft.SaveAt(100), checks=ft.Checks(100))
    error = info.value
    assert error.last_finite_step == 49 and math.isclose(float(error.state.t), 0.49)
    assert error.history.steps == 49 and torch.isfinite(error.state.x).all()


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


def test_a_compiled_run_leaves_the_marker_that_auto_reads_as_its_kernel_on_disk():
    """compile=True builds the kernel; the next "auto" run of the same step weighs a load, not a compile."""
    sde, state = linear_problem()
    quick = ft.Compile(True, route="dynamo", backend="eager")
    auto = quick._replace(enabled="auto")
    before = ft.driver.choose_route(sde, state, 40, DT, 0.5, 3, compile=auto)
    assert "no kernel on disk" in before.reason
    eager = ft.run(sde, state, 40, DT, 0.5, 3, compile=False)
    assert "no kernel on disk" in ft.driver.choose_route(sde, state, 40, DT, 0.5, 3, compile=auto).reason
    ft.run(sde, state, 40, DT, 0.5, 3, compile=quick)
    after = ft.driver.choose_route(sde, state, 40, DT, 0.5, 3, compile=auto)
    assert "kernel on disk" in after.reason and "no kernel" not in after.reason
    assert after.compiled_s < before.compiled_s
    assert eager.history.route == "eager"


def test_a_short_job_launched_again_and_again_compiles_once_its_eager_launches_pay(monkeypatch):
    """Each "auto" launch kept eager adds its steps to the cache's count for the step (route.eager_spent); the
    rule weighs them, so a job too short to pay for a compile alone compiles on the launch where the earlier
    ones would have paid for it, and the next launch finds its kernel on disk."""
    sde, state = linear_problem()
    quick = ft.Compile("auto", route="dynamo", backend="eager")
    _, counted = route.count_step(lambda: None)
    step = route.StepCost(100, 100, counted.signature)
    gain = route.OP_SECONDS * step.ops + (route.NUMBER_SECONDS - route.COMPILED_NUMBER_SECONDS) * step.numbers
    monkeypatch.setattr(route, "COMPILE_SECONDS", gain * 100)  # 100 steps' gain
    for constant in ("COMPILE_SECONDS_PER_OP", "TRACE_SECONDS", "LOAD_SECONDS", "SETUP_SECONDS"):
        monkeypatch.setattr(route, constant, 0.0)
    real = route.count_step
    monkeypatch.setattr(route, "count_step", lambda fn, key="": (real(fn, key)[0], step))
    launches = [ft.run(sde, state, 40, DT, 0.5, 3, compile=quick).history.route for _ in range(4)]
    assert launches == ["eager", "eager", "compiled", "compiled"]  # 40 + 80 > 100 weighed steps on the third
    assert route.eager_spent(step) == 80 and route.on_disk(step)
