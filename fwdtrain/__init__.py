"""fwdtrain: online forward-propagation training of SDEs on torch.func.

The model is a pure function of a parameter pytree, the state (X, Xtilde, theta, t)
is immutable, and ``step`` is a pure function: state in, new state out.
"""

from . import calibration, distributed, ensemble, examples, noise, optim, schedules, sgdct
from .checkpoint import Checkpoint, check_compatible, load, save
from .checkpointing import CheckpointWriteError, Checkpointing
from .compiled import cache_dir, choose_compilation, compile_advance, compile_steps
from .ensemble import Ensemble, PerMember
from .ensemble import run as run_ensemble
from .driver import run, step_function
from .history import History
from .errors import CheckpointError, DivergenceError
from .evaluate import CostEstimate, average_cost, stationary_cost
from .model import Model, functional, mlp
from .noise import BrownianNoise, FunctionNoise, TensorNoise
from .problem import SDE, Coefficients, ControlledSDE
from .sensitivity import Linearisation, linearise
from .state import State, init, noise_dim, with_optimizer
from .euler import StepInfo
from .stepping import step, step_with_info
from .trainable import CostForm, Trainable

__version__ = "0.2.0"

__all__ = [
    "SDE", "ControlledSDE", "Coefficients", "State", "StepInfo", "History", "Model", "CostEstimate",
    "Linearisation", "functional", "mlp", "init", "step", "step_with_info", "run", "noise_dim",
    "linearise", "stationary_cost", "schedules", "examples", "distributed", "calibration", "sgdct",
    "BrownianNoise", "TensorNoise", "FunctionNoise", "Checkpoint", "save", "load", "step_function",
    "DivergenceError", "CheckpointError", "compile_advance", "compile_steps", "Checkpointing",
    "CheckpointWriteError", "Trainable", "CostForm", "optim", "check_compatible", "cache_dir",
    "choose_compilation", "average_cost", "ensemble", "Ensemble", "PerMember", "run_ensemble",
    "with_optimizer",
]
