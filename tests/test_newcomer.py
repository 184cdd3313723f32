"""What a newcomer's trial of 0.2 found, each finding as a test: runs are never lost or misreported, and every
mistake gets a message that says what is wrong and how to fix it."""

import json

import pytest
import torch
from conftest import boom
from test_cli import tiny

import fwdtrain as ft
from fwdtrain import cli, examples, plotting

F64 = torch.float64


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setitem(examples.REGISTRY, "tiny", tiny)
    monkeypatch.setitem(examples.REGISTRY, "boom", boom)


def _log_control(dtype=F64):
    """u = k log(x): finite at x0 = 0.05, NaN as soon as a particle crosses 0."""
    return ft.ControlledSDE(
        control=lambda th, x: th["k"] * torch.log(x),
        drift=lambda x, u: -x + u,
        diffusion=lambda x, u: torch.ones_like(x),
        cost=lambda x, u: (x * x + u * u).sum(),
    )


# ---- runs lost or misreported ----
def test_a_plot_path_that_cannot_be_written_is_refused_before_training(registry, capsys):
    assert cli.main(["tiny", "--steps", "10", "--plot", "/nonexistent/dir/p.png"]) == 2
    err = capsys.readouterr().err
    assert "cannot write the plot '/nonexistent/dir/p.png'" in err and "does not exist" in err
    assert "Traceback" not in err


@pytest.mark.skipif(not plotting.available(), reason="needs matplotlib (the plot extra)")
def test_a_plot_that_fails_after_training_keeps_the_results_and_exits_5(registry, tmp_path, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(plotting, "plot_run", broken)
    checkpoint = tmp_path / "ck.pt"
    code = cli.main(["tiny", "--steps", "10", "--plot", str(tmp_path / "p.png"), "--checkpoint", str(checkpoint)])
    out = capsys.readouterr()
    assert code == 5
    assert "slope" in out.out and "steps 10 in total" in out.out  # the table is printed
    assert "could not be written (OSError: disk full)" in out.err + out.out
    assert ft.load(checkpoint).history.steps == 10  # and the run is kept


def test_init_names_the_coefficient_that_is_not_finite_at_x0():
    sde = ft.ControlledSDE(
        control=lambda th, x: th["k"] * x * float("nan"),
        drift=lambda x, u: -x + u,
        diffusion=lambda x, u: torch.ones_like(x),
        cost=lambda x, u: (x * x + u * u).sum(),
    )
    with pytest.raises(ValueError, match=r"the SDE's control is not finite at x0 = \[1\]: it returned \[nan\]"):
        ft.init(sde, {"k": torch.tensor(0.5, dtype=F64)}, torch.ones(1, dtype=F64), 4)
    plain = ft.SDE(lambda th, x: -x, lambda th, x: torch.sqrt(x - 2), lambda th, x: x.sum())
    with pytest.raises(ValueError, match="the SDE's diffusion is not finite at x0"):
        ft.init(plain, {"k": torch.tensor(0.5, dtype=F64)}, torch.ones(1, dtype=F64), 4)


def test_the_first_check_comes_after_the_first_step_and_names_the_coefficient():
    sde = _log_control()
    state = ft.init(sde, {"k": torch.tensor(0.5, dtype=F64)}, torch.full((1,), 0.05, dtype=F64), 64)
    with pytest.raises(ft.DivergenceError) as raised:
        ft.run(sde, state, 500, 0.01, 0.1, compile=False)  # checks every 100 steps, and after the first
    error = raised.value
    assert error.culprit == "control" and error.last_finite_step <= 1
    assert f"non-finite at step {error.step} " in str(error) and "the control returned NaN or inf" in str(error)
    assert torch.isfinite(error.state.x).all() and error.history.steps == error.last_finite_step


def test_steps_of_run_counts_this_call_and_the_cli_total_steps_counts_the_whole_run(registry, tmp_path, capsys):
    ex = tiny()
    first = ft.run(ex.sde, ex.initial_state(), 30, ex.dt, ex.lr, 0, compile=False)
    more = ft.run(ex.sde, first, 20, ex.dt, ex.lr, compile=False)
    assert more.history.steps == 50  # 20 more
    path = tmp_path / "ck.pt"
    assert cli.main(["tiny", "--total-steps", "30", "--checkpoint", str(path), "--no-plot"]) == 0
    assert cli.main(["tiny", "--resume", str(path), "--total-steps", "50", "--json", "--no-plot"]) == 0
    capsys.readouterr()
    assert cli.main(["tiny", "--resume", str(path), "--total-steps", "20", "--json", "--no-plot"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["steps"] == 30 and result["steps_this_run"] == 0
    assert any("nothing to train: the run is at step 30, at or past --total-steps 20" in n for n in result["notes"])


def test_a_resume_with_nothing_left_says_so_in_the_table(registry, tmp_path, capsys):
    path = tmp_path / "ck.pt"
    assert cli.main(["tiny", "--total-steps", "30", "--checkpoint", str(path), "--no-plot"]) == 0
    capsys.readouterr()
    assert cli.main(["tiny", "--resume", str(path), "--total-steps", "10", "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "nothing to train: the run is at step 30" in out and "steps 30 in total (t = 0.3), none this run" in out
    assert "steps/s" not in out


@pytest.mark.parametrize(
    ("argv", "status", "kind"),
    [
        (["lqr-2d"], 2, "UsageError"),
        (["tiny", "--dt", "-1"], 2, None),
        (["boom", "--no-plot"], 3, "DivergenceError"),
    ],
)
def test_json_prints_one_object_for_errors_and_divergence_too(registry, capsys, argv, status, kind):
    assert cli.main([*argv, "--json"]) == status
    out = capsys.readouterr().out
    result = json.loads(out)  # one object, nothing else on stdout
    assert result["exit_status"] == status and result["error"]["message"]
    if kind is not None:
        assert result["error"]["type"] == kind


# ---- messages that say what is wrong ----
@pytest.mark.parametrize(("name", "closest"), [("lqr-2d", "lqr-nd"), ("LQR-1D", "lqr-1d"), ("noisy", "noisy-control")])
def test_an_unknown_problem_lists_the_problems_and_suggests_the_closest(name, closest, capsys):
    assert cli.main([name]) == 2
    err = capsys.readouterr().err
    assert f"unknown problem {name!r}; did you mean {closest!r}?" in err
    assert all(problem in err for problem in examples.REGISTRY)


def test_a_divergence_tells_a_cli_user_what_to_do_not_a_python_attribute(registry, tmp_path, capsys):
    assert cli.main(["boom", "--no-plot"]) == 3
    err = capsys.readouterr().err
    assert "error.state" not in err and "--checkpoint" in err


def test_a_state_stepped_with_another_sde_gets_a_shape_message():
    one_d = ft.SDE(lambda th, x: -x, lambda th, x: torch.ones_like(x), lambda th, x: (x * x).sum())
    theta = {"k": torch.tensor(0.5, dtype=F64)}
    state = ft.init(one_d, theta, torch.ones(1, dtype=F64), 4)
    wide = ft.SDE(lambda th, x: -x, lambda th, x: torch.ones(1, 16, dtype=F64), lambda th, x: (x * x).sum())
    with pytest.raises(ValueError, match=r"diffusion"):
        ft.step(wide, state, torch.zeros(4, 3, dtype=F64), 0.01, 0.1)
    vector_cost = ft.SDE(lambda th, x: -x, lambda th, x: torch.ones_like(x), lambda th, x: x * x)
    with pytest.raises(ValueError, match=r"cost.*shape \(1,\)"):
        ft.step(vector_cost, state, torch.zeros(4, 1, dtype=F64), 0.01, 0.1)


def test_a_relative_error_against_zero_is_not_a_percentage_and_time_is_nominal(capsys):
    assert cli.main(["lqr-nd", "--total-steps", "50", "--no-plot", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["metrics"]["gain_error"]["relative_error"] is None
    assert cli.main(["sgdct-ou", "--total-steps", "500", "--no-plot", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["t"] == 5.0
    assert cli.main(["lqr-nd", "--total-steps", "50", "--no-plot"]) == 0
    line = next(row for row in capsys.readouterr().out.splitlines() if row.startswith("gain_error"))
    assert "%" not in line and "n/a" in line


def test_the_help_shows_problem_as_optional_with_each_problems_defaults(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: fwdtrain [-h] [PROBLEM]")
    assert "(defaults: steps 6000, dt 0.01, particles 256, lr 0.5)" in " ".join(out.split())
    assert "the user's" not in out and "the seed problem's 1-D LQR" in out


def test_the_repr_of_a_state_is_a_summary():
    ex = examples.lqr_1d()
    state = ft.init(ex.sde, ex.theta, ex.x0, 256)
    text = repr(state)
    assert len(text) < 600 and text.count("\n") < 8
    assert "(256, 1) float32" in text and "t = 0" in text and "..." in text
