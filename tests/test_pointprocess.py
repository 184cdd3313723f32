"""One point-process implementation: ``fwdtrain.pointprocess`` is ``fwdtrain.events`` at its public path; the
step-grid fit of 0.4 is a one-release alias whose every name warns with its replacement, nothing in the package
imports it, and what it was for (a Hawkes process fitted to its events within its standard errors, on the
command line too) is done by ``fwdtrain.events``."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import warnings

import pytest
import torch

import fwdtrain as ft
from fwdtrain.cli import app

pp = ft.pointprocess
D64 = torch.float64
GRID = ("IntensityFit", "bin_events", "check_events", "hawkes_theta", "standard_errors")
RENAMED = ("grid_hawkes", "grid_intensity_model", "grid_simulate")


def test_pointprocess_is_fwdtrain_events_at_its_public_path():
    assert pp.__all__ == ft.events.__all__
    assert all(getattr(pp, name) is getattr(ft.events, name) for name in ft.events.__all__)
    assert not set(GRID + RENAMED) & set(pp.__all__)


@pytest.mark.parametrize("name", GRID + RENAMED)
def test_each_step_grid_name_warns_and_names_its_replacement(name):
    with pytest.warns(DeprecationWarning, match=rf"fwdtrain.pointprocess.{name} is the step-grid fit .* 0.6; use "):
        old = getattr(pp, name)
    module = sys.modules["fwdtrain.problems.pointprocess"]
    assert old is getattr(module, name.removeprefix("grid_"))
    named = re.findall(r"fwdtrain\.events\.(\w+)", pp.GRID[name][1])
    assert named and all(hasattr(ft.events, n) for n in named), named
    with pytest.raises(AttributeError, match="has no attribute 'grid_fit'"):
        pp.grid_fit  # noqa: B018


def test_the_step_grid_module_warns_on_import_and_nothing_imports_it():
    sys.modules.pop("fwdtrain.problems.pointprocess", None)
    with pytest.warns(
        DeprecationWarning, match=r"fwdtrain.problems.pointprocess .* goes in fwdtrain 0.6; use fwdtrain.events"
    ):
        importlib.import_module("fwdtrain.problems.pointprocess")
    code = (
        "import sys, fwdtrain\nfrom fwdtrain.pointprocess import *\n"
        "import fwdtrain.cli.app, fwdtrain.cli.events, fwdtrain.examples\n"
        "print(sorted(m for m in sys.modules if 'pointprocess' in m))"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["['fwdtrain.pointprocess']"]


def test_the_alias_still_works_for_one_release():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model, theta = pp.grid_hawkes(), pp.hawkes_theta(0.6, 0.7, 1.3)
        data = pp.grid_simulate(model, theta, torch.zeros(1, dtype=D64), 50, 0.05, paths=2, seed=2)
        fit = pp.IntensityFit(model, events=data)
    run = ft.run(fit, fit.start(theta, torch.zeros(1, dtype=D64), 2), 50, 0.05, 0.01)
    assert run.history.steps == 50


def test_a_hawkes_process_is_recovered_within_its_standard_errors():
    example = ft.examples.EVENT_REGISTRY["hawkes"]()
    assert example.events.events > 1_500
    for method in ("batch", "online"):
        result = example.fit(method)
        for label, estimate, error, truth in example.compare(result):
            assert abs(estimate - truth) < 3 * error, (method, label, estimate, error, truth)
            assert error < 0.25 * truth  # the data pin the parameters down (the test can fail)


def test_hawkes_on_the_command_line_is_the_event_stream_fit(capsys):
    assert app.main(["hawkes", "--end-time", "500", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["problem"] == "hawkes" and result["method"] == "batch" and result["events"] > 300
    assert [row["name"] for row in result["parameters"]] == ["baseline", "adjacency", "decay"]
    assert "hawkes" not in ft.examples.REGISTRY
