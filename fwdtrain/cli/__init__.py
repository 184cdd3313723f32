"""The command line: ``python -m fwdtrain [PROBLEM] [options]`` (``main``).

- ``parser``: the options, one subcommand per built-in problem;
- ``configure``: options (and a checkpoint to resume) to a ``Job``, every path probed before any step;
- ``train``: the job through ``fwdtrain.run`` (one run, an ensemble, or every rank of a group);
- ``report``: the results as a table or one JSON object, and the plot;
- ``cache_command``: ``fwdtrain cache``, the compiled kernels' folder shown, pruned or emptied;
- ``app``: ``main``, the entry point, and its exit statuses; ``entry``, the process's.
"""

from .app import entry, main
from .parser import build_parser

__all__ = ["build_parser", "entry", "main"]
