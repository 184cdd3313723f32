"""What is trained: the ``Trainable`` interface and the problems that implement it.

- ``cost``: an ``SDE`` trained on its own running cost (``CostForm``) and its checks;
- ``prepared``: the public pure step, ``step``, ``step_with_info`` and the prepared ``jit_step``
  (the compiled step under the user's ``vmap`` too);
- ``calibration``: objectives nonlinear in stationary expectations;
- ``sgdct``: online drift estimation from observed paths;
- ``ensemble``: E independent members of any of these as one vmapped step.

Problems never import the loop: ``fwdtrain.run`` trains each of them.
"""

from . import calibration, cost, ensemble, sgdct, trainable
from .cost import CostForm, as_trainable
from .prepared import JitStep, jit_step, step, step_with_info
from .trainable import Trainable

__all__ = [
    "CostForm",
    "JitStep",
    "Trainable",
    "as_trainable",
    "calibration",
    "cost",
    "ensemble",
    "jit_step",
    "sgdct",
    "step",
    "step_with_info",
    "trainable",
]
