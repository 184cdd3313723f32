"""Smoke test of benchmarks/validate.py: the quick mode runs and prints every requested row."""

import importlib.util
from pathlib import Path

import pytest


def test_validate_quick(capsys):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "validate.py"
    spec = importlib.util.spec_from_file_location("validate", path)
    validate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(validate)
    cases = ["lqr-d2-linear", "ou-calibration", "sgdct-ou"]
    assert validate.main(["--quick", "--only", *cases]) == 0
    out = capsys.readouterr().out
    for case in cases:
        assert case in out
    assert "reference" in out.splitlines()[0]


def test_validate_studies_quick(capsys):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "validate.py"
    spec = importlib.util.spec_from_file_location("validate", path)
    validate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(validate)
    assert validate.main(["--quick", "--study", "optimisers"]) == 0
    assert "steps to 2%" in capsys.readouterr().out
    assert validate.main(["--quick", "--study", "averaging"]) == 0
    out = capsys.readouterr().out
    assert "slope err avg" in out and "mean|.|" in out


@pytest.mark.slow
def test_validate_solver_study_quick(capsys, tmp_path):
    """--study solvers --quick: every table printed, the exact weak orders fitted, and the JSON written."""
    import json

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "validate.py"
    spec = importlib.util.spec_from_file_location("validate", path)
    validate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(validate)
    out = tmp_path / "solvers.json"
    assert validate.main(["--quick", "--study", "solvers", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for title in ("weak order", "strong order", "accuracy per second", "compiled equals eager"):
        assert title in printed
    result = json.loads(out.read_text())
    orders = result["weak"]["orders"]  # exact (read off the step), so even the quick run fits them
    assert abs(orders["euler"] - 1) < 0.15 and abs(orders["milstein"] - 1) < 0.15 and abs(orders["heun"] - 2) < 0.15
    assert "heun" in result["strong"]["refused"]  # x-dependent noise
    assert all(row["max_relative_difference"] < 1e-10 for row in result["compiled"]["rows"])
    optimum = {(r["solver"], r["h"]): r for r in result["accuracy"]["optima"]}
    assert abs(optimum["euler", 0.01]["k_chain"] / result["accuracy"]["k_star"] - 1 + 0.0071) < 2e-4  # issue 19
    assert abs(optimum["heun", 0.05]["k_chain"] - optimum["heun", 0.05]["k_closed_form"]) < 1e-6  # a flat minimum
