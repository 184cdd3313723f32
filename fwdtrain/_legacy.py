"""Where 0.2's names went: the public submodule paths, and one-release aliases for the moved ones.

- ``PUBLIC``: short import paths that are part of the public face (``import fwdtrain.schedules``,
  ``from fwdtrain import calibration``) for modules that live in a layer (``fwdtrain.core.schedules``).
- ``MOVED``: 0.2's module paths, importable in 0.3 with a ``DeprecationWarning`` naming the new home.
- ``NAMES``: 0.2's top-level names that left ``fwdtrain.__all__``: an alias with a warning where the
  object lives on, a clear error where it was replaced.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

PUBLIC = {
    "fwdtrain.schedules": "fwdtrain.core.schedules",
    "fwdtrain.noise": "fwdtrain.core.noise",
    "fwdtrain.errors": "fwdtrain.core.errors",
    "fwdtrain.calibration": "fwdtrain.problems.calibration",
    "fwdtrain.sgdct": "fwdtrain.problems.sgdct",
    "fwdtrain.ensemble": "fwdtrain.problems.ensemble",
}
MOVED = {
    "fwdtrain.euler": "fwdtrain.core.kernel",
    "fwdtrain.stepping": "fwdtrain.problems.cost",
    "fwdtrain.trainable": "fwdtrain.problems.trainable",
    "fwdtrain.compiled": "fwdtrain.compile.kernels",
    "fwdtrain.checkpointing": "fwdtrain.driver.hooks",
    "fwdtrain.checkpoint": "fwdtrain.driver.checkpoint",
    "fwdtrain.progress": "fwdtrain.driver.hooks",
    "fwdtrain.history": "fwdtrain.core.history",
    "fwdtrain.state": "fwdtrain.core.state",
    "fwdtrain.problem": "fwdtrain.core.problem",
    "fwdtrain.model": "fwdtrain.core.model",
    "fwdtrain.sensitivity": "fwdtrain.core.sensitivity",
    "fwdtrain.evaluate": "fwdtrain.driver.evaluate",
    "fwdtrain._tree": "fwdtrain.core._tree",
    "fwdtrain._checks": "fwdtrain.core._checks",
}
# 0.2's top-level name -> (module, name) of its 0.3 home, or a sentence saying what replaced it
NAMES: dict[str, tuple[str, str] | str] = {
    "Coefficients": ("fwdtrain.core.sensitivity", "Coefficients"),
    "StepInfo": ("fwdtrain.core.kernel", "StepInfo"),
    "Model": ("fwdtrain.core.model", "Model"),
    "CostEstimate": ("fwdtrain.driver.evaluate", "CostEstimate"),
    "Linearisation": ("fwdtrain.core.sensitivity", "Linearisation"),
    "linearise": ("fwdtrain.core.sensitivity", "linearise"),
    "noise_dim": ("fwdtrain.core.state", "noise_dim"),
    "with_optimizer": ("fwdtrain.core.state", "with_optimizer"),
    "BrownianNoise": ("fwdtrain.core.noise", "BrownianNoise"),
    "TensorNoise": ("fwdtrain.core.noise", "TensorNoise"),
    "FunctionNoise": ("fwdtrain.core.noise", "FunctionNoise"),
    "Checkpoint": ("fwdtrain.driver.checkpoint", "Checkpoint"),
    "check_compatible": ("fwdtrain.driver.checkpoint", "check_compatible"),
    "CheckpointWriteError": ("fwdtrain.core.errors", "CheckpointWriteError"),
    "Trainable": ("fwdtrain.problems.trainable", "Trainable"),
    "CostForm": ("fwdtrain.problems.cost", "CostForm"),
    "cache_dir": ("fwdtrain.compile.cache", "cache_dir"),
    "average_cost": ("fwdtrain.core.evaluate", "average_cost"),
    "Ensemble": ("fwdtrain.problems.ensemble", "Ensemble"),
    "PerMember": ("fwdtrain.problems.ensemble", "PerMember"),
    "step_function": "fwdtrain.step_function was removed in 0.3: bind the step yourself, "
    "lambda state, dw, alpha: problem.advance(state, dw, dt, alpha, problem.plan(state))",
    "compile_advance": "fwdtrain.compile_advance was removed in 0.3: use fwdtrain.step(..., compile=True), or "
    "fwdtrain.compile.function_kernel(fn, args, key=..., options=fwdtrain.Compile(True))",
    "compile_steps": "fwdtrain.compile_steps was removed in 0.3: run(..., compile=True) takes every run of steps "
    "between two events in one compiled call; fwdtrain.compile.loop_kernel builds such a loop",
    "choose_compilation": 'fwdtrain.choose_compilation was removed in 0.3: compile="auto" now decides from '
    "measurements on the machine that runs (fwdtrain.compile.policy.decide)",
    "run_ensemble": "fwdtrain.run_ensemble was removed in 0.3: use "
    "fwdtrain.run(fwdtrain.ensemble.Ensemble(problem, E), state, steps, dt, lr, noise=seed)",
}


def name(attribute: str) -> Any:
    """0.2's top-level ``attribute``: its 0.3 object (with a DeprecationWarning), or a clear AttributeError."""
    target = NAMES.get(attribute)
    if target is None:
        raise AttributeError(f"module 'fwdtrain' has no attribute {attribute!r}")
    if isinstance(target, str):
        raise AttributeError(target)
    module, new = target
    warnings.warn(
        f"fwdtrain.{attribute} moved to {module}.{new} in 0.3; the alias will be removed in 0.4",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(importlib.import_module(module), new)


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str, warn: bool) -> None:
        self.target, self.warn = target, warn

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        if self.warn:
            warnings.warn(
                f"the module {spec.name} moved to {self.target} in fwdtrain 0.3; the old path will be removed in 0.4",
                DeprecationWarning,
                stacklevel=2,
            )
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """The target module is already executed."""


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname in PUBLIC:
            return importlib.util.spec_from_loader(fullname, _Alias(PUBLIC[fullname], warn=False))
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, _Alias(MOVED[fullname], warn=True))
        return None


def install() -> None:
    """Make the public short paths and 0.2's module paths importable (idempotent)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())


__all__ = ["MOVED", "NAMES", "PUBLIC", "install", "name"]
