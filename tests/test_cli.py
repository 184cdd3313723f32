import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import boom

import fwdtrain as ft
from fwdtrain import cli, examples, plotting
from fwdtrain.cli import configure, parser
from fwdtrain.cli import train as cli_train
from fwdtrain.examples import linear_slope

ROOT = Path(__file__).resolve().parents[1]


def tiny(*, particles=3, dt=0.01, steps=40, lr=0.5, seed=0, dtype=torch.float64):
    """lqr-1d with a 4-unit network and a cheap evaluate, for fast in-process CLI tests."""
    ex = examples.lqr_1d(particles=particles, dt=dt, steps=steps, lr=lr, seed=seed, dtype=dtype, hidden=4)
    return ex._replace(
        name="tiny",
        lr=ft.schedules.constant(lr),
        evaluate=lambda theta: {"slope": linear_slope(ex.sde.control, theta), "cost": 0.5},
    )


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setitem(examples.REGISTRY, "tiny", tiny)
    monkeypatch.setitem(examples.REGISTRY, "boom", boom)


@pytest.mark.slow
def test_module_entry_point_end_to_end(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "fwdtrain", "--steps", "100", "--particles", "8"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    number = r"(-?[0-9.]+(?:e[-+]?\d+)?)"
    for metric, reference in (("slope", -(2**0.5 - 1)), ("cost", 2**0.5 - 1)):
        row = re.search(rf"^{metric}\s+{number}\s+{number}\s+{number}%", done.stdout, re.M)
        assert row, done.stdout
        assert abs(float(row.group(2)) - reference) < 1e-4 and float(row.group(1)) != float(row.group(2))
    assert re.search(r"steps 100 .* steps/s", done.stdout)
    assert done.stderr == ""  # no progress bar: stderr is not a terminal
    png = tmp_path / "fwdtrain-lqr-1d.png"
    if plotting.available():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert not png.exists() and "fwdtrain[plot]" in done.stdout


def test_json_checkpoint_and_resume_equal_one_run(registry, tmp_path, capsys):
    first, resumed, whole = tmp_path / "a.pt", tmp_path / "b.pt", tmp_path / "c.pt"
    assert cli.main(["tiny", "--steps", "30", "--checkpoint", str(first), "--json", "--no-plot"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 30 and set(out["metrics"]) == {"slope", "cost"}
    assert out["metrics"]["cost"]["relative_error"] == pytest.approx(abs(0.5 - (2**0.5 - 1)) / (2**0.5 - 1))
    assert (
        cli.main(["tiny", "--resume", str(first), "--steps", "70", "--checkpoint", str(resumed), "--json", "--no-plot"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["steps_this_run"] == 40
    assert cli.main(["tiny", "--steps", "70", "--checkpoint", str(whole), "--no-plot"]) == 0
    assert "slope" in capsys.readouterr().out
    a, b = ft.load(resumed).state, ft.load(whole).state
    assert all(torch.equal(x, y) for x, y in zip(ft.core._tree.leaves(a), ft.core._tree.leaves(b)))


@pytest.mark.parametrize(
    "argv",
    [
        ["tiny", "--dtype", "float16"],
        ["tiny", "--steps", "ten"],
        ["tiny", "--steps", "-3"],
        ["tiny", "--dt", "-0.1"],
        ["tiny", "--resume", "/nonexistent/run.pt"],
        ["no-such-problem"],
    ],
)
def test_bad_options_exit_nonzero_with_one_line(registry, argv, capsys):
    assert cli.main(argv + ["--no-plot"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fwdtrain: error:") and err.count("\n") == 1, err


def test_divergence_exits_3_and_keeps_the_last_finite_state(registry, tmp_path, capsys):
    path = tmp_path / "ck.pt"
    assert cli.main(["boom", "--no-plot", "--record-every", "2", "--checkpoint", str(path)]) == 3
    err = capsys.readouterr().err
    assert "diverged" in err and "last finite" in err and str(path) in err and err.count("\n") == 1
    saved = ft.load(path)
    assert 0 < saved.history.steps < 200 and bool(torch.isfinite(saved.state.x).all())


def test_interrupt_prints_results_and_saves(registry, tmp_path, capsys, monkeypatch):
    real_run = cli_train.run

    def interrupted_run(*args, hooks=(), **kwargs):
        def stop(n, state):
            if n == 20:
                raise KeyboardInterrupt

        return real_run(*args, hooks=(*hooks, ft.driver.Callback(stop, 10)), **kwargs)

    monkeypatch.setattr(cli_train, "run", interrupted_run)
    path = tmp_path / "ck.pt"
    assert cli.main(["tiny", "--checkpoint", str(path), "--no-plot"]) == 130
    out = capsys.readouterr().out
    assert "interrupted at step 20" in out and "slope" in out
    assert ft.load(path).history.steps == 20


def test_without_matplotlib_it_says_how_to_get_plots(registry, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(plotting, "available", lambda: False)
    assert cli.main(["tiny", "--steps", "10", "--plot", str(tmp_path / "p.png")]) == 0
    assert "pip install 'fwdtrain[plot]'" in capsys.readouterr().out
    assert not (tmp_path / "p.png").exists()


def test_learning_rate_options():
    ex = tiny(lr=0.5)
    t = torch.tensor(20.0, dtype=torch.float64)
    own, lr0 = configure.learning_rate(ex, None, None, 50.0)
    assert own is ex.lr and lr0 == 0.5
    scaled, lr0 = configure.learning_rate(ex._replace(lr=ft.schedules.inverse_time(10.0, 20.0)), 0.25, None, 50.0)
    assert lr0 == 0.25 and float(scaled(t)) == pytest.approx(0.125)  # the problem's shape, starting at 0.25
    inverse, lr0 = configure.learning_rate(ex, None, "inverse-time", 20.0)
    assert lr0 == 0.5 and float(inverse(t)) == pytest.approx(0.25)
    staged, _ = configure.learning_rate(ex, 0.4, "staged", 50.0)
    assert float(staged(torch.tensor(60.0))) == pytest.approx(0.2)


def test_default_problem_and_help(capsys):
    assert parser.with_problem([]) == [examples.DEFAULT]
    assert parser.with_problem(["--steps", "5"]) == [examples.DEFAULT, "--steps", "5"]
    assert cli.main(["--help"]) == 0
    assert "lqr-1d" in capsys.readouterr().out
    assert 'fwdtrain = "fwdtrain.cli:entry"' in (ROOT / "pyproject.toml").read_text()


def test_the_process_entry_exits_with_mains_status_and_leaves_a_broken_group_at_once(monkeypatch):
    """``entry`` (``python -m fwdtrain``, the ``fwdtrain`` script) exits with ``main``'s status; after a failed
    collective it skips the interpreter's teardown (os._exit), which can abort on a broken gloo context."""
    from fwdtrain.cli import app

    monkeypatch.setattr(app, "main", lambda: 3)
    with pytest.raises(SystemExit) as stop:
        cli.entry()
    assert stop.value.code == 3

    class Left(Exception):
        pass

    def leave(status):
        raise Left(status)

    monkeypatch.setattr(app.os, "_exit", leave)
    monkeypatch.setattr(app.distributed, "lost", lambda: True)
    with pytest.raises(Left) as left:
        cli.entry()
    assert left.value.args == (3,)


@pytest.mark.slow
def test_calibration_and_sgdct_compile_through_the_cli_and_equal_eager(capsys):
    """0.2: every problem trains through run, so --compile (and --fuse) apply to the calibrations and SGDCT."""
    results = {}
    for problem, steps in (("ou-calibration", "60"), ("sgdct-ou", "60")):
        for flags in ([], ["--compile"]):
            argv = [problem, "--steps", steps, "--particles", "4", "--dtype", "float64", "--no-plot", "--json"]
            assert cli.main(argv + flags) == 0
            results[problem, bool(flags)] = json.loads(capsys.readouterr().out)
        eager, compiled = results[problem, False], results[problem, True]
        assert compiled["steps"] == eager["steps"] == 60
        for name, metric in eager["metrics"].items():
            assert compiled["metrics"][name]["learned"] == pytest.approx(metric["learned"], rel=1e-9, abs=1e-12)


def test_each_problem_has_its_own_one_line_help(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, builder in examples.REGISTRY.items():
        assert builder.summary and "\n" not in builder.summary
        assert builder.summary[:40] in " ".join(out.split()), name


def test_ensemble_prints_each_member_and_the_spread(registry, tmp_path, capsys):
    """--ensemble 2: seeds 0 and 1 in one vmapped run; member 1 is the run with --seed 1."""
    assert cli.main(["tiny", "--steps", "30", "--ensemble", "2", "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert out.count("fwdtrain tiny:") == 2 and "seed 0" in out and "seed 1" in out
    assert re.search(r"ensemble of 2 members \(seeds 0\.\.1\).*\n.*mean\s+std\s+reference\n(slope|cost)", out)
    path = tmp_path / "e.pt"
    assert cli.main(["tiny", "--steps", "30", "--ensemble", "2", "--json", "--checkpoint", str(path)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [m["seed"] for m in result["members"]] == [0, 1] and result["diverged"] == []
    slopes = [m["metrics"]["slope"]["learned"] for m in result["members"]]
    assert result["summary"]["slope"]["mean"] == pytest.approx(sum(slopes) / 2)
    assert result["summary"]["slope"]["std"] == pytest.approx(abs(slopes[0] - slopes[1]) / 2**0.5)
    assert cli.main(["tiny", "--steps", "30", "--seed", "1", "--json", "--no-plot"]) == 0
    assert json.loads(capsys.readouterr().out)["metrics"]["slope"]["learned"] == slopes[1]
    assert cli.main(["tiny", "--resume", str(path), "--steps", "40", "--json", "--no-plot"]) == 0
    assert json.loads(capsys.readouterr().out)["ensemble"] == 2
    assert cli.main(["tiny", "--resume", str(path), "--ensemble", "3", "--no-plot"]) == 2
    assert "holds an ensemble of 2" in capsys.readouterr().err


def test_ensemble_with_an_optimizer_and_averaging(registry, capsys):
    """--ensemble with --optimizer adam --average-from: each member reports its averaged theta too."""
    assert (
        cli.main(
            [
                "tiny",
                "--steps",
                "30",
                "--ensemble",
                "2",
                "--optimizer",
                "adam",
                "--average-from",
                "0.1",
                "--json",
                "--no-plot",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    for m in result["members"]:
        assert m["optimizer"] == "adam" and m["average_from"] == 0.1 and m["averaged_iterates"] == 20
        assert "averaged" in m["metrics"]["slope"]


@pytest.mark.slow
def test_solver_heun_at_five_times_the_step_reaches_the_seed_problems_optimal_cost(capsys):
    """`--solver heun --dt 0.05` on the seed problem: the cost, measured with Heun at the same step, is within the
    Heun chain's closed-form bias (0.26% in the gain, second order in the cost) plus Monte Carlo error, where
    Euler's bias at dt 0.05 alone would be +3.5%."""
    code = cli.main(["--solver", "heun", "--dt", "0.05", "--total-steps", "3000", "--json", "--no-plot"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["solver"] == "heun" and result["dt"] == 0.05 and result["steps"] == 3000
    assert abs(result["metrics"]["cost"]["relative_error"]) < 0.01


@pytest.mark.parametrize(
    ("problem", "solver", "message"),
    [
        ("noisy-control", "heun", r"Heun\(\) needs a diffusion that does not depend on x"),
        ("sgdct-ou", "milstein", "DriftEstimation takes no solver"),
    ],
)
def test_a_solver_that_does_not_fit_the_problem_is_refused_before_the_first_step(problem, solver, message, capsys):
    assert cli.main([problem, "--solver", solver, "--no-plot", "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["exit_status"] == 2 and re.search(message, out["error"]["message"])


def test_resuming_from_a_file_that_is_not_a_checkpoint_says_so(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("not a checkpoint\n")
    assert cli.main(["--resume", str(path), "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert "is not a fwdtrain checkpoint" in err and "truncated" not in err and "KeyError" not in err


# ---- the figure: what each built-in problem learned against its reference, as its example page shows it ----


def _dashed_values(figure):
    """The constant values of the dashed (reference) lines of every panel: y of horizontal ones, x of vertical."""
    values = []
    for axis in figure.axes:
        for line in axis.get_lines():
            if line.get_linestyle() != "--":
                continue
            xs, ys = (list(map(float, data)) for data in line.get_data())
            values += [ys[0]] if len(set(ys)) == 1 else []
            values += [xs[0]] if len(set(xs)) == 1 else []
    return values


@pytest.mark.parametrize("problem", list(examples.REGISTRY))
def test_each_problems_figure_draws_its_reference(problem):
    """The command line's figure of every built-in problem has the example page's panels and draws a reference
    from the problem's own ``reference`` as a dashed line (a short run: the drawing is what is tested)."""
    from fwdtrain.cli import figures

    quick = ["--total-steps", "40", "--particles", "4", "--record-every", "10", "--no-plot", "--no-progress"]
    args, named = parser.parse([problem, *quick])
    job = configure.prepare(args, named)
    result = cli_train.train(job)
    figure = figures.figure(problem, figures.Trained(job.example, job.seed, result.state, result.history))
    assert len(figure.axes) == figures.FIGURES[problem][1]
    dashed = _dashed_values(figure)
    references = [float(value) for name, value in job.example.reference.items() if name != "gain_error"]
    assert any(abs(value - reference) < 1e-9 for value in dashed for reference in references), (dashed, references)


def test_the_command_line_writes_the_problems_figure(tmp_path, monkeypatch):
    """`python -m fwdtrain sgdct-ou` writes the parameters against the truth, not the generic cost panel alone."""
    from fwdtrain.cli import figures

    pytest.importorskip("matplotlib")
    drawn = []
    monkeypatch.setattr(figures, "save", lambda problem, run, path, title=None: drawn.append(problem) or path)
    argv = ["sgdct-ou", "--total-steps", "20", "--particles", "2", "--record-every", "10", "--no-progress"]
    assert cli.main([*argv, "--plot", str(tmp_path / "h.png")]) == 0
    assert drawn == ["sgdct-ou"]


def test_the_steps_rate_leaves_the_compile_out_and_the_line_shows_it():
    """The rate is the steps' from the first block boundary on; the wall time less those steps at that rate is the
    startup, said as compiling, loading or starting by the kernels the run built or loaded."""
    from fwdtrain.cli import report

    trained = cli_train.Trained(state=None, history=None, wall=13.0, unsaved=None, steady=(900, 3.0), compiled=1)
    rate, startup = report.rates(trained, 1000)
    assert rate == 300.0 and startup == pytest.approx(13.0 - 1000 / 300.0)
    assert report.rates(trained._replace(steady=None), 1000) == (1000 / 13.0, None)
    assert report.rates(trained._replace(wall=1.0), 1000)[1] == 0.0  # never below 0
    # a run of steps 500 to 1500 that compiled its kernel before its first step (compile=True)
    line = {"startup_s": startup, "kernels_compiled": 1, "kernels_loaded": 0, "steps": 1500, "steps_this_run": 1000}
    line = {**line, "compiled_from": 500, "route": "compiled"}
    assert (report._startup(line), report._how(line)) == (": compiling 9.7 s, then", "compiled")
    # its compile in the background (the time before the first boundary: the trace and the package's key), ready
    # at step 1200, or not before the run's end
    switched = {**line, "compiled_from": 1200}
    assert (report._startup(switched), report._how(switched)) == (
        ": tracing 9.7 s, then",
        "eager, then compiled from step 1200",
    )
    eager = {**line, "compiled_from": None, "route": "eager"}
    assert (report._startup(eager), report._how(eager)) == (": tracing 9.7 s, then", "eager")
    loaded = {**line, "kernels_compiled": 0, "kernels_loaded": 1}
    assert (report._startup(loaded), report._how(loaded)) == (": loading the kernel 9.7 s, then", "compiled")
    assert report._startup({**eager, "kernels_compiled": 0}) == ": starting 9.7 s, then"
    assert report._startup({**line, "startup_s": None}) == " ="


def test_a_run_that_switched_mid_way_says_so_in_its_line(registry, capsys):
    """The table of a run whose background compile was ready at step 30 (its result stubbed from a tiny run's)."""
    from fwdtrain.cli import report

    assert cli.main(["tiny", "--steps", "40", "--json", "--no-plot", "--no-compile"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["route"], result["compiled_from"]) == ("eager", None)
    result.update(kernels_compiled=1, kernels_loaded=1, compiled_from=30, route="compiled", startup_s=2.4)
    text = report.render(result)
    assert re.search(
        r"this run 40 in [0-9.]+ s: tracing 2.4 s, then [0-9]+ steps/s \(eager, then compiled from step 30\)", text
    )


def test_the_clock_times_the_steps_after_the_first_boundary_and_changes_no_result(registry, capsys):
    """The command line's clock cuts the run at 16 boundaries: the same state as a run without it, and its steady
    steps are those after the first boundary (40 steps: every 3, the first at step 3)."""
    ex = tiny()
    state = ft.init(ex.sde, ex.theta, ex.x0, ex.particles)
    clock = cli_train._Clock(40)
    with_clock = ft.run(ex.sde, state, 40, ex.dt, ex.lr, 0, hooks=(clock,), compile=False)
    without = ft.run(ex.sde, state, 40, ex.dt, ex.lr, 0, compile=False)
    assert clock.every == 3 and clock.steady() is not None and clock.steady()[0] == 40 - 3
    assert all(
        torch.equal(a, b)
        for a, b in zip(ft.core._tree.leaves(with_clock.state), ft.core._tree.leaves(without.state), strict=True)
    )
    assert cli.main(["tiny", "--steps", "40", "--json", "--no-plot", "--no-compile"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["startup_s"] is not None and result["steps_per_s"] > 0 and result["kernels_compiled"] == 0
    assert cli.main(["tiny", "--steps", "40", "--no-plot", "--no-compile"]) == 0
    line = r"this run 40 in [0-9.]+ s: starting [0-9.]+ s, then [0-9]+ steps/s \(eager\)"
    assert re.search(line, capsys.readouterr().out)


def test_no_compile_keeps_the_evaluation_eager_and_restores_the_default(monkeypatch):
    """With --no-compile the evaluation's own runs (a frozen-theta stationary cost) must not start a compile: their
    default Compile(after=...) is out of reach while they run, and the setting the process had is restored."""
    from fwdtrain.cli import report
    from fwdtrain.compile.options import AFTER_ENV

    monkeypatch.setenv(AFTER_ENV, "5")
    with report._eager_when(True):
        assert int(os.environ[AFTER_ENV]) >= 2**62
    assert os.environ[AFTER_ENV] == "5"
    with report._eager_when(False):
        assert os.environ[AFTER_ENV] == "5"
    monkeypatch.delenv(AFTER_ENV)
    with report._eager_when(True):
        pass
    assert AFTER_ENV not in os.environ
