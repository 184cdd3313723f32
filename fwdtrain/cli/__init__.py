"""The command line: ``python -m fwdtrain [problem] [options]``."""

from .train import build_parser, main

__all__ = ["main", "build_parser"]
