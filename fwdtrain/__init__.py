"""fwdtrain: online forward-propagation training of SDEs on torch.func.

The model is a pure function of a parameter pytree; the state (X, Xtilde, theta, t) is immutable; a step
is a pure function (state in, new state out) and ``run`` loops over it with a history, checks and hooks.

The layers, from the ground up (each imports only those below it): ``optim`` and ``core`` (the maths),
``compile`` (compiled steps), ``problems`` (what is trained), ``driver`` (the run), then
``distributed`` and ``examples``, and ``cli`` (``python -m fwdtrain``). The submodules a user writes
have short public paths (``fwdtrain.schedules``, ``noise``, ``errors``, ``calibration``, ``sgdct``,
``ensemble``): small modules that re-export their layer's names.
"""

# ruff: noqa: I001  (the public face, grouped by what a user writes, not sorted)
# What the SDE is: a problem of pure functions of (theta, x); a network as such a function
from .core.problem import SDE, ControlledSDE
from .core.jumps import Jumps
from .core.model import functional, mlp

# How one step is taken
from .core.solvers import Euler, Heun, Milstein

# The pure step: state in, new state out
from .core.state import State, init
from .problems.prepared import step, step_with_info, jit_step

# Running: the loop and its options and hooks
from .driver.runner import run
from .driver.options import SaveAt, Checks
from .compile.options import Compile
from .driver.hooks import Progress, Checkpointing

# Results and files
from .core.history import History
from .driver.checkpoint import save, load
from .driver.evaluate import stationary_cost

# Errors (and fwdtrain.errors, which also holds CheckpointWriteError)
from .core.errors import DivergenceError, CheckpointError
from . import errors

# Submodules: schedules and noise sources, update rules, other kinds of problems, processes, built-in problems
from . import schedules, noise
from . import optim
from . import calibration, sgdct, ensemble, pointprocess
from . import distributed, examples

__version__ = "0.4.0"

__all__ = [  # noqa: RUF022  (grouped by concept, as above)
    "SDE", "ControlledSDE", "Jumps", "functional", "mlp",
    "Euler", "Heun", "Milstein",
    "State", "init", "step", "step_with_info", "jit_step",
    "run", "SaveAt", "Checks", "Compile", "Progress", "Checkpointing",
    "History", "save", "load", "stationary_cost",
    "DivergenceError", "CheckpointError", "errors",
    "schedules", "noise", "optim", "calibration", "sgdct", "ensemble", "pointprocess", "distributed", "examples",
]  # fmt: skip
