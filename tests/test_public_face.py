"""The public face: the short public paths are real modules (a type checker sees them), ``import fwdtrain``
installs no import hook, and 0.2's names, module paths and keywords (aliases in 0.3, removed in 0.4) are
plain errors."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

import fwdtrain as ft

SHORT = {
    "fwdtrain.schedules": "fwdtrain.core.schedules",
    "fwdtrain.noise": "fwdtrain.core.noise",
    "fwdtrain.errors": "fwdtrain.core.errors",
    "fwdtrain.calibration": "fwdtrain.problems.calibration",
    "fwdtrain.sgdct": "fwdtrain.problems.sgdct",
    "fwdtrain.ensemble": "fwdtrain.problems.ensemble",
}
# 0.2's module paths and top-level names, aliases in 0.3 (CHANGELOG.md, 0.4.0: Removed)
MOVED = (
    "fwdtrain.euler",
    "fwdtrain.stepping",
    "fwdtrain.trainable",
    "fwdtrain.compiled",
    "fwdtrain.checkpointing",
    "fwdtrain.checkpoint",
    "fwdtrain.progress",
    "fwdtrain.history",
    "fwdtrain.state",
    "fwdtrain.problem",
    "fwdtrain.model",
    "fwdtrain.sensitivity",
    "fwdtrain.evaluate",
    "fwdtrain._tree",
    "fwdtrain._checks",
)
NAMES = (
    "Coefficients",
    "StepInfo",
    "Model",
    "CostEstimate",
    "Linearisation",
    "linearise",
    "noise_dim",
    "with_optimizer",
    "BrownianNoise",
    "TensorNoise",
    "FunctionNoise",
    "Checkpoint",
    "check_compatible",
    "CheckpointWriteError",
    "Trainable",
    "CostForm",
    "cache_dir",
    "average_cost",
    "Ensemble",
    "PerMember",
    "step_function",
    "compile_advance",
    "compile_steps",
    "choose_compilation",
    "run_ensemble",
)
KEYWORDS = (
    "seed",
    "history",
    "record_every",
    "record",
    "check_every",
    "bound",
    "callback",
    "callback_every",
    "progress",
    "progress_every",
    "checkpoint",
    "reduce",
    "mode",
    "chunk",
    "fuse",
)


@pytest.mark.parametrize(("short", "home"), SHORT.items())
def test_a_short_path_is_a_real_module_with_its_layers_names(short, home):
    module, layer = importlib.import_module(short), importlib.import_module(home)
    assert Path(module.__file__).with_suffix("").parts[-2:] == tuple(short.split("."))
    assert sorted(module.__all__) == sorted(layer.__all__)
    assert all(getattr(module, name) is getattr(layer, name) for name in layer.__all__)
    assert getattr(ft, short.rpartition(".")[2]) is module


def test_import_fwdtrain_installs_no_import_hook():
    code = (
        "import sys; before = list(sys.meta_path)\n"
        "import fwdtrain, fwdtrain.schedules, fwdtrain.noise\n"
        "from fwdtrain import calibration\n"
        "assert sys.meta_path == before, sys.meta_path\n"
        "print(fwdtrain.calibration.Calibration.__name__, float(fwdtrain.schedules.constant(0.5)(1.0)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["Calibration", "0.5"]


@pytest.mark.parametrize("old", MOVED)
def test_0_2_module_paths_are_gone(old):
    sys.modules.pop(old, None)
    with pytest.raises(ModuleNotFoundError, match=f"No module named '{old}'"):
        importlib.import_module(old)


@pytest.mark.parametrize("old", NAMES)
def test_0_2_top_level_names_are_gone(old):
    with pytest.raises(AttributeError, match=f"module 'fwdtrain' has no attribute '{old}'"):
        getattr(ft, old)


def test_removed_entry_points_of_problems_are_plain_attribute_errors():
    for module, old in ((ft.calibration, "run"), (ft.ensemble, "run"), (ft.sgdct, "fit")):
        with pytest.raises(AttributeError, match=f"has no attribute '{old}'"):
            getattr(module, old)
    assert not hasattr(ft.problems.calibration, "run") and not hasattr(ft.problems.sgdct, "fit")
    assert not hasattr(ft.examples.ou_calibration(particles=4), "train")


@pytest.mark.parametrize("keyword", KEYWORDS)
def test_0_2_keywords_of_run_are_type_errors(keyword):
    ex = ft.examples.lqr_1d(particles=2)
    start = ft.init(ex.sde, ex.theta, ex.x0, 2)
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'"):
        ft.run(ex.sde, start, 1, ex.dt, ex.lr, **{keyword: None})


def test_the_optimizer_names_are_the_literals():
    """``optim.optimizer(name)`` takes the names its Literal lists (the other enums derive their tuples from theirs)."""
    assert tuple(ft.optim.OPTIMIZERS) == get_args(ft.optim.Optimizer)


@pytest.mark.slow
def test_a_type_checker_sees_the_short_paths(tmp_path):
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent))
    if mypy is None:
        pytest.skip("mypy not installed next to the interpreter")
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        "import fwdtrain.schedules\n"
        "from fwdtrain import calibration, noise\n"
        "from fwdtrain.errors import CheckpointWriteError\n\n"
        "rate: fwdtrain.schedules.Schedule = fwdtrain.schedules.constant(0.5)\n"
        "source: type[noise.BrownianNoise] = noise.BrownianNoise\n"
        "problem: type[calibration.Calibration] = calibration.Calibration\n"
        "error: type[Exception] = CheckpointWriteError\n"
        "fwdtrain.schedules.no_such_name  # a name the module does not have is an error\n"
    )
    done = subprocess.run(
        [mypy, "--cache-dir", str(tmp_path / "cache"), "--follow-imports=silent", str(snippet)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parent.parent,
        check=False,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and 'Module has no attribute "no_such_name"' in errors[0], done.stdout
