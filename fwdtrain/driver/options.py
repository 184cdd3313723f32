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

    Attributes:
        every: Steps between divergence checks (default 100; also at the first step, at every record and
            checkpoint, and at the end). A check looks at x, x_tilde and theta: all finite, and
            ``max |.| <= bound`` when ``bound`` is given; it also checks alpha(t) of the schedule.
        bound: An upper bound on |x|, |x_tilde| and |theta| (None: finiteness only).
    """

    every: int = 100
    bound: float | None = None


def check_save(save: Any) -> SaveAt:
    if save is None:
        return SaveAt()
    if not isinstance(save, SaveAt):
        raise TypeError(f"save must be a fwdtrain.SaveAt(every=..., record=...), got {type(save).__name__}")
    _checks.check_count(save.every, "SaveAt(every=...)")
    if save.record is not None and not callable(save.record):
        raise TypeError(f"SaveAt(record=...) must be a function of the state, got {type(save.record).__name__}")
    return save


def check_checks(checks: Any) -> Checks:
    if checks is None:
        return Checks()
    if not isinstance(checks, Checks):
        raise TypeError(f"checks must be a fwdtrain.Checks(every=..., bound=...), got {type(checks).__name__}")
    _checks.check_count(checks.every, "Checks(every=...)")
    bound = checks.bound
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0):
        raise ValueError(f"Checks(bound=...) must be a positive number or None, got {bound!r}")
    return checks


__all__ = ["Checks", "SaveAt", "check_checks", "check_save"]
