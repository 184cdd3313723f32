"""What is trained: the ``Trainable`` interface and the problems that implement it.

- ``cost``: an ``SDE`` trained on its own running cost (``CostForm``), and the checked ``step``;
- ``calibration``: objectives nonlinear in stationary expectations;
- ``sgdct``: online drift estimation from observed paths;
- ``ensemble``: E independent members of any of these as one vmapped step.

Problems never import the loop: ``fwdtrain.run`` trains each of them.
"""

from . import calibration, cost, ensemble, sgdct, trainable
from .cost import CostForm, as_trainable, step, step_with_info
from .trainable import Trainable

__all__ = [
    "CostForm",
    "Trainable",
    "as_trainable",
    "calibration",
    "cost",
    "ensemble",
    "sgdct",
    "step",
    "step_with_info",
    "trainable",
]
