"""``python -m fwdtrain``: see ``fwdtrain.cli``."""

from .cli import main

raise SystemExit(main())
