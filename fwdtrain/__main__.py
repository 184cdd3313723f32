"""``python -m fwdtrain``: see ``fwdtrain.cli``."""

from .cli import entry

entry()
