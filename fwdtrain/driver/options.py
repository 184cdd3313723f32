"""The options of ``run`` that say what the loop does besides stepping: what to save, and when to check."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..core import _checks


class SaveAt(NamedTuple):
    """What the history records, and how often.

    Attributes:
        every: Steps between records (default 100); the last step of a run is always recorded.
        record: ``record(state) -> pytree`` stored at each record (default: theta; for an ensemble, each
            member's theta).
    """

    every: int = 100
    record: Callable[[Any], Any] | None = None


class Checks(NamedTuple):
    """How the run guards against divergence.

    The check: x, x_tilde and theta all finite, and ``max |.| <= bound`` when ``bound`` is given. It is made
    inside each block (eager or compiled) every ``every`` steps and at the block's end; a failed check is traced
    back one step at a time to the step n that failed, and the run stops with the state of step n - 1. The
    learning rate alpha(t_n) of every state is checked too (a finite number >= 0), before its block runs.

    Attributes:
        every: Steps between checks inside a block (default 100; also where a process group checks together).
            It changes the cost of a failure (at most ``every`` steps stepped again), not which step is named.
        bound: An upper bound on |x|, |x_tilde| and |theta| (None: finiteness only).
    """

    every: int = 100
    bound: float | None = None


def _events_option(value: Any, kind: Any, argument: str) -> Any:
    """``kind()`` for None, else ``value`` if it is a ``kind`` with a positive ``every``; a clear error otherwise."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        fields = ", ".join(f"{name}=..." for name in kind._fields)
        raise TypeError(f"{argument} must be a fwdtrain.{kind.__name__}({fields}), got {type(value).__name__}")
    _checks.check_count(value.every, f"{kind.__name__}(every=...)")
    return value


def check_save(save: Any) -> SaveAt:
    save = _events_option(save, SaveAt, "save")
    if save.record is not None and not callable(save.record):
        raise TypeError(f"SaveAt(record=...) must be a function of the state, got {type(save.record).__name__}")
    return save


def check_checks(checks: Any) -> Checks:
    checks = _events_option(checks, Checks, "checks")
    bound = checks.bound
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0):
        raise ValueError(f"Checks(bound=...) must be a positive number or None, got {bound!r}")
    return checks


__all__ = ["Checks", "SaveAt", "check_checks", "check_save"]
