"""0.2's keywords of ``run``, accepted for one release (0.3) with a ``DeprecationWarning`` naming their 0.3 form.

seed=s                          noise=s
history=h                       start=(state, h)  (or the Run / Checkpoint itself)
record_every=k, record=f        save=SaveAt(every=k, record=f)
check_every=k, bound=b          checks=Checks(every=k, bound=b)
callback=f, callback_every=k    hooks=(Callback(f, every=k),)
progress=p, progress_every=k    hooks=(Progress(every=k, enabled=p),)
checkpoint=path | Checkpointing hooks=(Checkpointing(path, every, metadata),)
reduce=f                        hooks=(GradientHook(f),)
mode=m                          solver=Euler(mode=m)
chunk=c                         compile=Compile(chunk=c)
fuse=K                          compile=Compile(True, unroll=K) (K steps per iteration of the compiled loop)
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from ..compile.options import as_compile
from ..core.solvers import as_solver
from .hooks import Callback, Checkpointing, GradientHook, Progress
from .options import Checks, SaveAt

F = TypeVar("F", bound=Callable[..., Any])
OLD = (
    "seed",
    "history",
    "record_every",
    "record",
    "check_every",
    "bound",
    "callback",
    "callback_every",
    "progress",
    "progress_every",
    "checkpoint",
    "reduce",
    "mode",
    "chunk",
    "fuse",
)


def translate(args: tuple, kwargs: dict[str, Any], old: dict[str, Any]) -> tuple[tuple, dict[str, Any], list[str]]:
    """(args, kwargs) of the 0.3 call for 0.2's keywords ``old``, and the 0.3 forms, for the warning."""
    said: list[str] = []
    positional = list(args)
    if "seed" in old:
        kwargs.setdefault("noise", old.pop("seed"))
        said.append("seed=s -> noise=s")
    if "history" in old:
        history = old.pop("history")
        if history is not None:
            if len(positional) > 1:
                positional[1] = (positional[1], history)
            else:
                kwargs["start"] = (kwargs["start"], history)
        said.append("history=h -> run(problem, (state, h), ...) or the Run itself")
    if "record_every" in old or "record" in old:
        save = kwargs.get("save") or SaveAt()
        kwargs["save"] = save._replace(every=old.pop("record_every", save.every), record=old.pop("record", save.record))
        said.append("record_every=, record= -> save=SaveAt(every=, record=)")
    if "check_every" in old or "bound" in old:
        checks = kwargs.get("checks") or Checks()
        kwargs["checks"] = checks._replace(
            every=old.pop("check_every", checks.every), bound=old.pop("bound", checks.bound)
        )
        said.append("check_every=, bound= -> checks=Checks(every=, bound=)")
    _translate_hooks(kwargs, old, said)
    if "mode" in old:
        solver = as_solver(kwargs.get("solver"))
        kwargs["solver"] = dataclasses.replace(solver, mode=old.pop("mode"))
        said.append("mode=m -> solver=Euler(mode=m)")
    if "chunk" in old or "fuse" in old:
        options = as_compile(kwargs.get("compile", "auto"))
        fuse = old.pop("fuse", 1)
        if fuse > 1:
            options = options._replace(enabled=True, unroll=fuse)
        kwargs["compile"] = options._replace(chunk=old.pop("chunk", options.chunk))
        said.append("chunk=, fuse=K -> compile=Compile(chunk=, unroll=K)")
    return tuple(positional), kwargs, said


def _translate_hooks(kwargs: dict[str, Any], old: dict[str, Any], said: list[str]) -> None:
    """0.2's callback=, progress=, checkpoint= and reduce= as hooks appended to kwargs["hooks"]."""
    hooks = list(kwargs.get("hooks") or ())
    if "callback" in old:
        every = old.pop("callback_every", None) or kwargs.get("save", SaveAt()).every
        if old["callback"] is not None:
            hooks.append(Callback(old["callback"], every))
        old.pop("callback")
        said.append("callback=f -> hooks=(Callback(f, every),)")
    old.pop("callback_every", None)
    if "progress" in old or "progress_every" in old:
        enabled = old.pop("progress", None)
        if enabled is not False:
            hooks.append(Progress(old.pop("progress_every", 256), enabled))
        old.pop("progress_every", None)
        said.append("progress= -> hooks=(Progress(),)")
    if "checkpoint" in old:
        checkpoint = old.pop("checkpoint")
        if isinstance(checkpoint, (str, os.PathLike)):
            checkpoint = Checkpointing(checkpoint)
        if checkpoint is not None:
            hooks.append(checkpoint)
        said.append("checkpoint=path -> hooks=(Checkpointing(path),)")
    if "reduce" in old:
        reduce = old.pop("reduce")
        if reduce is not None:
            hooks.append(GradientHook(reduce))
        said.append("reduce=f -> hooks=(GradientHook(f),)")
    if hooks:
        kwargs["hooks"] = tuple(hooks)


def accepts_0_2_keywords(fn: F) -> F:
    """``fn`` that also takes 0.2's keywords of ``run`` (see the module docstring), for one release."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        old = {key: kwargs.pop(key) for key in OLD if key in kwargs}
        if old:
            args, kwargs, said = translate(args, kwargs, old)
            warnings.warn(
                f"fwdtrain 0.3: these keywords of {fn.__name__} are deprecated and will be removed in "
                f"0.4: {'; '.join(said)}",
                DeprecationWarning,
                stacklevel=2,
            )
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


__all__ = ["OLD", "accepts_0_2_keywords", "translate"]
