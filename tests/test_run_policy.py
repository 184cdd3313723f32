"""What ``run`` decides and checks by itself: ``compile="auto"``, the schedule's values during the run,
and user noise of the wrong dtype, all before (or instead of) a silently wrong step."""

from __future__ import annotations

import math

import pytest
import torch

import fwdtrain as ft
from fwdtrain import cli, driver
from fwdtrain.compiled import choose_compilation

DT = 0.01


def linear_problem(particles: int = 4, dtype: torch.dtype = torch.float64):
    sde = ft.ControlledSDE(control=lambda th, x: -th["k"] * x, drift=lambda x, u: -x + u,
                           diffusion=lambda x, u: torch.ones_like(x), cost=lambda x, u: (x * x + u * u).sum())
    return sde, ft.init(sde, {"k": torch.tensor(0.2, dtype=dtype)}, torch.ones(1, dtype=dtype), particles)


@pytest.mark.parametrize("warm", [False, True])
def test_auto_follows_the_measured_policy(warm, monkeypatch):
    monkeypatch.setattr("fwdtrain.compiled.warm_cache_exists", lambda: warm)
    _, state = linear_problem()
    for steps in (10, 3_000, 100_000):
        chosen = choose_compilation(steps, state.particles, warm_cache=warm)
        assert driver._compilation("auto", 1, steps, state) == (chosen.compile, chosen.fuse)
    assert driver._compilation("auto", 1, 10, state) == (False, 1)  # short runs stay eager
    assert driver._compilation("auto", 1, 100_000, state)[0] is True
    assert driver._compilation("auto", 4, 10, state) == (True, 4)  # an explicit fuse compiles as asked
    assert driver._compilation(False, 1, 100_000, state) == (False, 1)


def test_default_run_equals_the_explicitly_eager_run():
    sde, state = linear_problem()
    default = ft.run(sde, state, 50, DT, 0.5, seed=3, progress=False)
    eager = ft.run(sde, state, 50, DT, 0.5, seed=3, progress=False, compile=False)
    assert all(torch.equal(a, b) for a, b in zip(ft._tree.leaves(default), ft._tree.leaves(eager)))


def test_a_schedule_that_turns_negative_stops_the_run_with_the_state_kept():
    sde, state = linear_problem()
    with pytest.raises(ValueError, match=r"returned -2.5 at t = 3"):  # negative at the end: refused up front
        ft.run(sde, state, 300, DT, lambda t: 0.5 - t, progress=False)
    schedule = lambda t: torch.where((t > 0.5) & (t < 2.0), -0.5, 0.5)  # noqa: E731 - bad in the middle only
    with pytest.raises(ft.DivergenceError, match=r"returned -0.5 at t = 1.*stopped at step 100") as info:
        ft.run(sde, state, 300, DT, schedule, check_every=100, record_every=100, progress=False, compile=False)
    error = info.value
    assert error.last_finite_step == 100 and math.isclose(float(error.state.t), 1.0)
    assert error.history.steps == 100 and torch.isfinite(error.state.x).all()


def test_a_schedule_bad_at_the_start_is_refused_before_any_step():
    sde, state = linear_problem()
    with pytest.raises(ValueError, match="returned nan at t = 0"):
        ft.run(sde, state, 10, DT, lambda t: math.nan, progress=False)


def test_user_noise_of_another_dtype_is_refused_before_any_step():
    sde, state = linear_problem()
    noise = torch.zeros(10, 4, 1, dtype=torch.float32)
    with pytest.raises(TypeError, match="dtype torch.float32 but the run's dtype is torch.float64"):
        ft.run(sde, state, 10, DT, 0.5, noise=noise, progress=False)
    with pytest.raises(ValueError, match=r"shape \(10, 3, 1\) but the run expects \(10, 4, 1\)"):
        ft.run(sde, state, 10, DT, 0.5, noise=torch.zeros(10, 3, 1, dtype=torch.float64), progress=False)


def test_cli_compile_flags():
    parser = cli.build_parser()
    assert parser.parse_args(["lqr-1d"]).compile is None  # auto
    assert parser.parse_args(["lqr-1d", "--compile"]).compile is True
    assert parser.parse_args(["lqr-1d", "--no-compile"]).compile is False


def test_frozen_theta_evaluation_compiled_equals_eager():
    ex = ft.examples.lqr_1d(dtype=torch.float64, hidden=4)
    options = dict(particles=50, dt=0.01, steps=60, burn_in=10, seed=3)
    eager = ft.stationary_cost(ex.sde, ex.theta, torch.zeros(1, dtype=torch.float64), compile=False, **options)
    traced = ft.stationary_cost(ex.sde, ex.theta, torch.zeros(1, dtype=torch.float64), compile="eager", **options)
    auto = ft.stationary_cost(ex.sde, ex.theta, torch.zeros(1, dtype=torch.float64), **options)  # short: eager
    assert math.isclose(traced.mean, eager.mean, rel_tol=1e-12) and auto == eager


def test_frozen_theta_evaluation_compiles_only_when_it_pays():
    from fwdtrain.evaluate import compiles_faster

    assert not compiles_faster(6000, 1000, warm_cache=False)  # the examples' evaluations: eager
    assert compiles_faster(100_000, 1000, warm_cache=False)
    assert compiles_faster(40_000, 1000, warm_cache=True) and not compiles_faster(40_000, 1000, warm_cache=False)


def test_ensemble_learning_rates_are_checked_per_member_at_both_ends():
    sde, _ = linear_problem()
    theta = {"k": torch.tensor(0.2, dtype=torch.float64)}
    states = ft.ensemble.init(sde, theta, torch.ones(1, dtype=torch.float64), 4, members=3)
    with pytest.raises(ValueError, match=r"returned -2.5 at t = 3"):
        ft.run_ensemble(sde, states, 300, DT, lambda t: 0.5 - t, progress=False)
    final, history = ft.run_ensemble(sde, states, 20, DT, torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64),
                                     progress=False)
    assert final.t.shape == (3,) and not bool(history.diverged.any())


def test_cli_refuses_no_compile_with_fuse(capsys):
    assert cli.main(["lqr-1d", "--no-compile", "--fuse", "4", "--steps", "8", "--no-plot"]) == 2
    assert "--fuse 4 runs compiled chunks of steps but --no-compile" in capsys.readouterr().err
