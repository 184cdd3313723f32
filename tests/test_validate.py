"""Smoke test of benchmarks/validate.py: the quick mode runs and prints every requested row."""

import importlib.util
from pathlib import Path


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
