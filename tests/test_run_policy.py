"""What ``run`` decides and checks by itself: tiered compilation (``compile="auto"``), the schedule's values
during the run, and user noise of the wrong dtype, all before (or instead of) a silently wrong step."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest
import torch

import fwdtrain as ft
from fwdtrain import _compat, cli
from fwdtrain.compile import kernels
from fwdtrain.compile.options import AFTER_ENV, DEFAULT_AFTER, as_compile

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


class WaitForCompile(ft.driver.Hook):
    """At step ``every``: wait for the run's compile process to end (a test counts events, never seconds)."""

    def __init__(self, every: int) -> None:
        self.every = every

    def at(self, loop) -> None:
        package = loop.block.kernel.package if loop.block.kernel is not None else None
        if package is not None and package.child is not None:
            package.child.wait()


def fake_compiler(monkeypatch, tmp_path, fail: bool = False) -> None:
    """A compile process that only moves the job to the package (or fails, naming why), and a loader that runs the
    saved module eagerly: the tiers' plumbing, processes included, without a real compile (30 to 60 s)."""
    from fwdtrain.compile import worker

    monkeypatch.setenv("FWDTRAIN_CACHE_DIR", str(tmp_path))
    code = (
        "import os, sys; os.unlink(sys.argv[1]); sys.stderr.write('RuntimeError: refused by the test\\n'); sys.exit(1)"
        if fail
        else "import os, sys; os.replace(sys.argv[1], sys.argv[2])"
    )
    monkeypatch.setattr(kernels, "WORKER", ("-c", code))

    def load(path, device):
        module, _, _ = worker.load_job(path)
        return lambda flat: list(module(*flat))

    monkeypatch.setattr(_compat, "aot_load", load)


def seed_problem(target: float = 0.0):
    """The seed problem (a small network), its cost's target ``target`` a tensor the cost closes over."""
    control = ft.mlp([1, 4, 1], activation="relu", output_bias=False, dtype=torch.float32, output_scale=0.1)
    goal = torch.tensor(target, dtype=torch.float32)
    sde = ft.ControlledSDE(
        control=control.apply,
        drift=lambda x, u: -x + u,
        diffusion=lambda x, u: torch.ones_like(x),
        cost=lambda x, u: ((x - goal).square() + u.square()).sum(),
        noise_type="additive",
    )
    return sde, ft.init(sde, control.theta, torch.ones(1), 3)


TIERED = ft.Compile(after=200)


def numbers(result: ft.Run) -> list[torch.Tensor]:
    """The final state and the records of a run (not how its steps ran)."""
    history = result.history._replace(compiled=None, compiled_from=None, carry=None)
    return [leaf for leaf in ft.core._tree.leaves((result.state, history)) if leaf.is_floating_point()]


OPTIONS = {"save": ft.SaveAt(20), "checks": ft.Checks(50)}


def test_a_short_run_stays_eager_and_traces_nothing(monkeypatch):
    monkeypatch.delenv(AFTER_ENV)
    assert as_compile("auto").after == DEFAULT_AFTER == 1000
    sde, state = linear_problem()
    before = kernels.counts()
    result = ft.run(sde, state, 50, DT, 0.5, noise=3)
    assert kernels.counts() == before and result.history.route == "eager" and result.history.compiled_from is None


def test_the_default_step_to_compile_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(AFTER_ENV, "250")
    assert as_compile("auto").after == 250 and as_compile(ft.Compile(after=3)).after == 3
    monkeypatch.setenv(AFTER_ENV, "soon")
    with pytest.raises(ValueError, match="FWDTRAIN_COMPILE_AFTER='soon' must be a whole number of steps"):
        as_compile("auto")


def test_the_default_run_equals_the_explicitly_eager_run_bit_for_bit():
    sde, state = linear_problem()
    default = ft.run(sde, state, 50, DT, 0.5, noise=3)
    eager = ft.run(sde, state, 50, DT, 0.5, compile=False, noise=3)
    assert all(
        torch.equal(a, b) for a, b in zip(ft.core._tree.leaves(default), ft.core._tree.leaves(eager), strict=True)
    )


def test_a_run_switches_to_its_kernel_at_the_first_block_after_the_background_compile(monkeypatch, tmp_path):
    """A run that reaches ``after`` starts the compile (in another process) at its first step and steps eagerly;
    the compile is ready at step 100 here, and the run goes on compiled from there, to rounding the eager run."""
    fake_compiler(monkeypatch, tmp_path)
    sde, state = seed_problem()
    before = kernels.counts()
    result = ft.run(sde, state, 300, DT, 0.3, 0, compile=TIERED, hooks=WaitForCompile(100), **OPTIONS)
    counts = kernels.counts()
    assert (counts["compiles"] - before["compiles"], counts["loads"] - before["loads"]) == (1, 1)
    assert int(result.history.compiled_from) == 100 and result.history.route == "compiled"
    eager = ft.run(sde, state, 300, DT, 0.3, 0, compile=False, **OPTIONS)
    assert torch.equal(result.history.step, eager.history.step)
    for a, b in zip(numbers(result), numbers(eager), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_failed_background_compile_leaves_the_run_eager_with_one_warning(monkeypatch, tmp_path):
    fake_compiler(monkeypatch, tmp_path, fail=True)
    sde, state = seed_problem()
    with pytest.warns(RuntimeWarning) as caught:
        result = ft.run(sde, state, 300, DT, 0.3, 0, compile=TIERED, hooks=WaitForCompile(100), **OPTIONS)
    lines = [str(w.message) for w in caught if "fwdtrain" in str(w.message)]
    assert len(lines) == 1 and "refused by the test" in lines[0] and "eagerly" in lines[0], lines
    assert result.history.route == "eager" and result.history.compiled_from is None
    eager = ft.run(sde, state, 300, DT, 0.3, 0, compile=False, **OPTIONS)
    assert all(torch.equal(a, b) for a, b in zip(numbers(result), numbers(eager), strict=True))


def test_switch_false_keeps_a_run_on_one_route_and_the_next_launch_loads_the_kernel(monkeypatch, tmp_path):
    """``Compile(switch=False)``: the run stays eager to its end, bitwise the eager run, its compile left on disk;
    the next run (a launch) finds it by its key and runs compiled from its first step: a load, no compile."""
    fake_compiler(monkeypatch, tmp_path)
    sde, state = seed_problem()
    steady = TIERED._replace(switch=False)
    first = ft.run(sde, state, 300, DT, 0.3, 0, compile=steady, hooks=WaitForCompile(100), **OPTIONS)
    eager = ft.run(sde, state, 300, DT, 0.3, 0, compile=False, **OPTIONS)
    assert first.history.compiled_from is None
    assert all(torch.equal(a, b) for a, b in zip(numbers(first), numbers(eager), strict=True))
    assert len(list((tmp_path / "kernels").glob("*.pt2"))) == 1
    ft.compile.forget_kernels()  # as a new launch
    before = kernels.counts()
    second = ft.run(sde, state, 300, DT, 0.3, 0, compile=steady, **OPTIONS)
    counts = kernels.counts()
    assert (counts["compiles"] - before["compiles"], counts["loads"] - before["loads"]) == (0, 1)
    assert int(second.history.compiled_from) == 0 and second.history.route == "compiled"


def test_a_new_closed_over_constant_is_another_kernel_and_a_cleared_cache_has_none(monkeypatch, tmp_path):
    """The decision reads the package by its own key: a kernel built for one target is not claimed for another
    (whose run starts eagerly and compiles in the background, never in the foreground), and after the cache is
    cleared (or pruned to nothing) no run claims one."""
    fake_compiler(monkeypatch, tmp_path)
    (sde, state), (moved, _) = seed_problem(), seed_problem(target=0.5)
    ft.run(sde, state, 300, DT, 0.3, 0, compile=TIERED, hooks=WaitForCompile(100))
    ft.compile.forget_kernels()
    choose = lambda problem: ft.driver.choose_route(problem, state, 300, DT, 0.3, 0, compile=TIERED)
    assert choose(sde).startswith("compiled") and choose(moved).startswith("eager")
    result = ft.run(moved, state, 300, DT, 0.3, 0, compile=TIERED, hooks=WaitForCompile(100))
    assert int(result.history.compiled_from) == 100  # eager first: no foreground compile
    ft.compile.forget_kernels()
    ft.compile.cache.prune_to(0)
    assert choose(sde).startswith("eager") and choose(moved).startswith("eager")
    ft.run(sde, state, 300, DT, 0.3, 0, compile=TIERED, hooks=WaitForCompile(100))
    ft.compile.forget_kernels()
    ft.compile.cache.clear()
    assert choose(sde).startswith("eager")


def test_one_line_says_a_compile_starts_with_or_without_progress_and_can_be_silenced(monkeypatch, tmp_path, capsys):
    fake_compiler(monkeypatch, tmp_path)
    sde, state = seed_problem()
    ft.run(sde, state, 300, DT, 0.3, 0, compile=TIERED, hooks=WaitForCompile(100), **OPTIONS)
    lines = [line for line in capsys.readouterr().err.splitlines() if "fwdtrain: compiling" in line]
    assert len(lines) == 1 and "in the background" in lines[0], lines
    ft.compile.forget_kernels()
    ft.compile.cache.clear()
    monkeypatch.setenv(kernels.QUIET_ENV, "1")
    ft.run(sde, state, 300, DT, 0.3, 0, compile=TIERED, hooks=(WaitForCompile(100), ft.Progress(every=100)), **OPTIONS)
    assert "fwdtrain: compiling" not in capsys.readouterr().err


_LAUNCH = (
    "import json, fwdtrain as ft\n"
    "from fwdtrain.compile import kernels\n"
    "ex = ft.examples.lqr_1d(particles=3)\n"
    "result = ft.run(ex.sde, ex.initial_state(), 2_000, ex.dt, ex.lr, 0)\n"  # compile="auto", the default
    "from_ = result.history.compiled_from\n"
    "print(json.dumps({**kernels.counts(), 'from': None if from_ is None else int(from_)}))\n"
)


@pytest.mark.slow
def test_the_default_run_compiles_in_the_background_and_the_next_launch_loads_it(tmp_path):
    """Two fresh processes on one empty cache, each a default ``run`` past ``after``: the first starts the compile
    in another process, which outlives it (detached) and writes the package; the second loads it before its
    first step and compiles nothing."""
    env = {**os.environ, "FWDTRAIN_CACHE_DIR": str(tmp_path), "PYTHONPATH": ROOT}
    env.pop(AFTER_ENV)  # the default's own
    launch = lambda: subprocess.run(
        [sys.executable, "-c", _LAUNCH], capture_output=True, text=True, env=env, timeout=600
    )
    done = launch()
    assert done.returncode == 0, done.stderr[-3000:]
    first = json.loads(done.stdout.splitlines()[-1])
    assert first["compiles"] == 1 and first["fallbacks"] == 0, first
    for _ in range(600):  # the detached compile finishes after the launch, for the next
        if not list((tmp_path / "kernels").glob("*.job")):
            break
        time.sleep(1)
    done = launch()
    assert done.returncode == 0, done.stderr[-3000:]
    second = json.loads(done.stdout.splitlines()[-1])
    assert second["compiles"] == 0 and second["loads"] == 1 and second["from"] == 0, second


@pytest.mark.parametrize("compile", [False, ft.Compile(True, compiler="dynamo", backend="eager")])
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


def test_compile_route_is_compiler_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match=r"Compile\(route=...\) is Compile\(compiler=...\)"):
        options = ft.Compile(True, route="dynamo", chunk=8)
    assert options == ft.Compile(True, compiler="dynamo", chunk=8) and type(options) is ft.Compile
    with pytest.warns(DeprecationWarning, match=r"Compile.route is Compile.compiler"):
        assert options.route == "dynamo"
    assert options._replace(chunk=4).compiler == "dynamo" and ft.Compile().compiler == "aot"


def test_frozen_theta_evaluation_compiled_equals_eager():
    ex = ft.examples.lqr_1d(dtype=torch.float64, hidden=4)
    options = dict(particles=50, dt=0.01, steps=60, burn_in=10, seed=3)
    x0 = torch.zeros(1, dtype=torch.float64)
    eager = ft.stationary_cost(ex.sde, ex.theta, x0, compile=False, **options)
    traced = ft.stationary_cost(
        ex.sde, ex.theta, x0, compile=ft.Compile(True, compiler="dynamo", backend="eager"), **options
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
