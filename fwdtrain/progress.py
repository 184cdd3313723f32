"""A progress line for long runs: a tqdm bar when tqdm is installed, else a carriage-return line."""

from __future__ import annotations

import sys
import time
from typing import Any

import torch


def progress_enabled(progress: bool | None, stream: Any = None) -> bool:
    """progress=None means on only when ``stream`` (default stderr) is a terminal."""
    if progress is not None:
        return bool(progress)
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class ProgressBar:
    """Steps done of ``total`` (counted from step ``start``) and the running cost, on stderr."""

    def __init__(self, total: int, start: int) -> None:
        self.start, self.total, self.last, self.clock = start, total, start, time.perf_counter()
        try:
            from tqdm.auto import tqdm
        except ImportError:
            self.bar = None
        else:
            self.bar = tqdm(total=total, unit="step", file=sys.stderr, smoothing=0.1)

    def update(self, n: int, average: torch.Tensor | float) -> None:
        """Move to step n, showing the running cost ``average``."""
        cost = float(average)
        if self.bar is not None:
            self.bar.set_postfix(cost=f"{cost:.5g}", refresh=False)
            self.bar.update(n - self.last)
        else:
            rate = (n - self.start) / max(time.perf_counter() - self.clock, 1e-9)
            sys.stderr.write(f"\rstep {n - self.start}/{self.total}  {rate:.0f} steps/s  cost {cost:.5g}")
            sys.stderr.flush()
        self.last = n

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            sys.stderr.write("\n")


__all__ = ["progress_enabled", "ProgressBar"]
