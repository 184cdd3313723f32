"""Hooks: what a run does at its events besides stepping. ``run(..., hooks=(...))`` takes a tuple of them.

A hook subclasses ``Hook`` and overrides what it needs; the loop calls, in this order:

    start(loop)               before the first step (probe a path, open a bar); may raise, nothing stepped yet
    reduce(gradient)          between the two halves of every step (``reduces_gradient = True``)
    checked(loop, ok) -> ok   at the Checks(every) grid, on the checked state (a group agrees on its ranks' checks)
    record(values) -> values  on every record before it is kept (a group averages its costs here)
    at(loop)                  at every multiple of ``every`` steps (a block ends there), after its records
    failed(loop, error)       a step raised or was interrupted; a hook may raise something else instead
    end(loop, interrupted)    after the last step or a Ctrl-C (a checkpoint is written here)

``loop`` is the running ``fwdtrain.driver.loop.Loop``: ``loop.carry.state`` is the state reached,
``loop.carry.n`` its step count and ``loop.history()`` the records so far. Built in here:
``Callback`` (a function of (n, state)), ``Progress`` (a progress bar) and ``Checkpointing``
(``fwdtrain.save`` at the end, on Ctrl-C and every ``every`` steps; its folder is probed before the
first step, and a save that fails raises ``CheckpointWriteError`` carrying the run's results).
``fwdtrain.distributed`` adds the group's gradient mean and checks.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from ..core import _checks
from ..core.errors import CheckpointError, CheckpointWriteError
from ..core.history import History
from ..core.state import State
from .checkpoint import check_folder
from .checkpoint import save as save_checkpoint


class RunView(Protocol):
    """What a hook sees of the running loop (``fwdtrain.driver.loop.Loop``)."""

    carry: Any  # (state, n, total, info) where the loop stands
    end: int  # the step it runs to
    good: tuple[Any, dict]  # the carry of the last passed check, and its noise position

    def history(self, c: Any = None, noise_state: dict | None = None, interrupted: bool = False) -> History:
        """The records so far, stacked, continuing from carry ``c`` (default the current one)."""

    def running_cost(self) -> torch.Tensor:
        """(1/n) sum_k mean_i c(X_k) so far."""

    def visible(self) -> State:
        """The state a callback sees (frozen members at their frozen state)."""

    def next_event(self, n: int, stop: int | None = None, *, record_hooks_only: bool = False) -> int:
        """The first step after n at which the loop checks (the loop's one event clock)."""

    def diverged(self, n: int) -> Exception:
        """The DivergenceError of a failed check at step n."""

    @property
    def route(self) -> Any:
        """ "compiled" or "eager": how the next block runs."""


class Hook:
    """Does nothing at every event; subclasses override what they need (see the module docstring)."""

    every: int | None = None
    reduces_gradient = False
    needs_record = False  # its ``at`` steps are also checked and recorded (a checkpoint saves a checked state)

    def start(self, loop: RunView) -> None:
        """Before the first step."""

    def reduce(self, gradient: Any) -> Any:
        """The gradient used for the update (called only when ``reduces_gradient``)."""
        return gradient

    def checked(self, loop: RunView, ok: torch.Tensor) -> torch.Tensor:
        """After a divergence check of ``loop.carry.state``: ``ok`` the flags (0-d, or (E,) per member) that the
        loop acts on, returned as they are or combined (a group: passed on every rank)."""
        return ok

    def record(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A record's {"cost", "average_cost"} before it is kept."""
        return values

    def at(self, loop: RunView) -> None:
        """At every multiple of ``every`` steps."""

    def failed(self, loop: RunView, error: BaseException) -> None:
        """A step raised ``error`` (KeyboardInterrupt included); raise to replace it."""

    def end(self, loop: RunView, interrupted: bool) -> None:
        """After the last step (or an interrupt)."""


class Callback(Hook):
    """Call ``fn(n, state)`` every ``every`` steps, with a state that has passed a divergence check.

    Args:
        fn: ``fn(n, state)``: n the step count since the start of training; its return value is ignored.
        every: Steps between calls (default 100).

    Raises:
        TypeError, ValueError: ``fn`` not callable, or ``every`` not a positive integer.
    """

    def __init__(self, fn: Callable[[int, State], Any], every: int = 100) -> None:
        if not callable(fn):
            raise TypeError(f"Callback(fn, every) needs a function (n, state) -> None, got {type(fn).__name__}")
        self.fn, self.every = fn, _checks.check_count(every, "Callback(every=...)")

    def at(self, loop: RunView) -> None:
        self.fn(loop.carry.n, loop.visible())

    def __repr__(self) -> str:
        return f"Callback({getattr(self.fn, '__qualname__', self.fn)!r}, every={self.every})"


class GradientHook(Hook):
    """Map the gradient estimate between the two halves of every step: the update uses ``fn(G_n)``.

    E.g. an all-reduce across processes. In a compiled run the two halves are compiled and ``fn`` runs
    eagerly between them.

    Args:
        fn: ``fn(gradient) -> gradient``, pytrees like theta.

    Raises:
        TypeError: ``fn`` is not callable.
    """

    reduces_gradient = True

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        if not callable(fn):
            raise TypeError(f"GradientHook(fn) needs a function gradient -> gradient, got {type(fn).__name__}")
        self.fn = fn

    def reduce(self, gradient: Any) -> Any:
        return self.fn(gradient)


def progress_enabled(enabled: bool | None, stream: Any = None) -> bool:
    """``enabled=None`` means on only when ``stream`` (default stderr) is a terminal."""
    if enabled is not None:
        return bool(enabled)
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress(Hook):
    """A progress bar on stderr: steps done and the running cost (tqdm when installed, else one line).

    Args:
        every: Steps between updates of the bar (default 256).
        enabled: True (default): always shown; False: never; None: only when stderr is a terminal.

    Raises:
        ValueError: ``every`` is not a positive integer.
    """

    def __init__(self, every: int = 256, enabled: bool | None = True) -> None:
        self.every = _checks.check_count(every, "Progress(every=...)")
        self.enabled = enabled
        self.shown = False  # the bar is open
        self.bar: Any = None  # a tqdm bar, or None for the carriage-return line

    def start(self, loop: RunView) -> None:
        self.shown = progress_enabled(self.enabled) and loop.end > loop.carry.n
        if not self.shown:
            return
        self.first, self.total, self.last, self.clock = (
            loop.carry.n,
            loop.end - loop.carry.n,
            loop.carry.n,
            time.perf_counter(),
        )
        try:
            from tqdm.auto import tqdm
        except ImportError:
            self.bar = None
        else:
            self.bar = tqdm(total=self.total, unit="step", file=sys.stderr, smoothing=0.1)

    def at(self, loop: RunView) -> None:
        if not self.shown:
            return
        n, cost = loop.carry.n, float(loop.running_cost())
        if self.bar is None:
            rate = (n - self.first) / max(time.perf_counter() - self.clock, 1e-9)
            sys.stderr.write(f"\rstep {n - self.first}/{self.total}  {rate:.0f} steps/s  cost {cost:.5g}")
            sys.stderr.flush()
        else:
            self.bar.set_postfix(cost=f"{cost:.5g}", refresh=False)
            self.bar.update(n - self.last)
        self.last = n

    def end(self, loop: RunView, interrupted: bool) -> None:
        if not self.shown:
            return
        self.at(loop)
        if self.bar is None:
            sys.stderr.write("\n")
        else:
            self.bar.close()
        self.shown, self.bar = False, None


def probe(path: str | os.PathLike, what: str = "checkpoint") -> None:
    """Raise ``CheckpointError`` unless a file (a ``what``) can be written at ``path``: its folder exists and a
    file can be created and removed there (checked by doing so)."""
    path = os.fspath(path)
    folder = check_folder(path, what)
    try:
        fd, trial = tempfile.mkstemp(prefix=".probe-" + os.path.basename(path) + "-", dir=folder)
        os.close(fd)
        os.unlink(trial)
    except OSError as error:
        raise CheckpointError(
            f"cannot write the {what} {path!r}: the folder {folder!r} is not writable "
            f"({error.strerror or error}); choose another path"
        ) from None


Saver = Callable[..., None]  # save(path, state, history, metadata=...)


class Checkpointing(Hook):
    """Save the run to a checkpoint (``fwdtrain.save``) at the end, on Ctrl-C and every ``every`` steps.

    The folder is probed before the first step (a file is created and removed there). A saved state has passed
    a divergence check; ``fwdtrain.load(path)`` is a start for ``fwdtrain.run`` that continues the run.

    Args:
        path: The checkpoint file.
        every: Steps between saves; None (default): only at the end and on Ctrl-C.
        metadata: A dict of plain values (numbers, strings, lists, dicts, tensors) saved with the run.
        save: Keyword only. The writer, ``save(path, state, history, metadata=...)`` (default
            ``fwdtrain.save``; ``fwdtrain.distributed.save_group`` writes every rank's particles).

    Raises:
        TypeError, ValueError: A path that is not a path, metadata that is not a dict, a bad ``every``.
        CheckpointError: (when the run starts) the folder is missing or not writable.
        CheckpointWriteError: (during the run) a save failed; it carries the state and history reached.
    """

    needs_record = True

    def __init__(
        self,
        path: str | os.PathLike,
        every: int | None = None,
        metadata: dict | None = None,
        *,
        save: Saver | None = None,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"Checkpointing(path, ...) needs a file path, got {type(path).__name__}")
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError(f"Checkpointing(metadata=...) must be a dict or None, got {type(metadata).__name__}")
        self.path, self.metadata, self.save = path, metadata, save
        self.every = None if every is None else _checks.check_count(every, "Checkpointing(every=...)")

    def start(self, loop: RunView) -> None:
        probe(self.path)

    def at(self, loop: RunView) -> None:
        if loop.carry.n != loop.end:  # the end writes its own, after the last record
            self.write(loop.carry.state, loop.history())

    def end(self, loop: RunView, interrupted: bool) -> None:
        self.write(loop.carry.state, loop.history(interrupted=interrupted))

    def write(self, state: State, history: History | None) -> None:
        """Save; an OSError becomes a ``CheckpointWriteError`` carrying ``state`` and ``history``."""
        try:
            (self.save or save_checkpoint)(self.path, state, history, metadata=self.metadata)
        except OSError as error:
            path = os.fspath(self.path)
            raise CheckpointWriteError(
                f"could not save the checkpoint {path!r}: {error.strerror or error}; the run's state and history "
                f"are in this error's .state and .history",
                path=path,
                state=state,
                history=history,
            ) from None

    def __repr__(self) -> str:
        return f"Checkpointing({os.fspath(self.path)!r}, every={self.every})"


def check_hooks(hooks: Any) -> tuple[Hook, ...]:
    """A tuple of ``Hook`` objects from what a user passes (a hook, or a sequence of them)."""
    if hooks is None:
        return ()
    if isinstance(hooks, Hook):
        hooks = (hooks,)
    if not isinstance(hooks, (tuple, list)) or not all(isinstance(h, Hook) for h in hooks):
        raise TypeError(
            f"hooks must be a tuple of fwdtrain hooks (fwdtrain.Progress(), fwdtrain.Checkpointing(path), "
            f"fwdtrain.driver.Callback(fn, every), ...), got {hooks!r:.200}"
        )
    return tuple(hooks)


__all__ = ["Callback", "Checkpointing", "GradientHook", "Hook", "Progress", "check_hooks", "probe", "progress_enabled"]
