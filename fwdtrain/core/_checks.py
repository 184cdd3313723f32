"""Input validation: clear errors, raised before anything is computed.

Two kinds of check:

- structure (types, shapes, dtypes, pytree structure): always, also inside the
  user's ``torch.func`` transforms and ``torch.compile``;
- values (finite, positive, ``requires_grad``): only on concrete tensors
  (``is_concrete``). Inside ``grad``/``vmap``/``jacfwd``/... a tensor is a functorch
  wrapper whose value is a tracer or a batch, and reading it (``bool``, ``.item()``)
  would crash ``vmap`` or cut the transform; those checks are skipped there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Real
from typing import Any

import optree
import torch

from .. import _compat as compat
from ._tree import leaves_with_paths

SUPPORTED_DTYPES = (torch.float32, torch.float64)


def is_concrete(value: Any) -> bool:
    """True for a value whose number can be read: a Python number or a plain tensor.

    False for a tensor wrapped by a ``torch.func`` transform (``vmap``'s BatchedTensor,
    the GradTrackingTensor of ``grad``, ``jacrev``, ``jacfwd``, ``vjp``, ``jvp``) and for
    every tensor while a graph is traced (``torch.compile``, ``make_fx``). Value checks run only
    on concrete values.
    """
    if not isinstance(value, torch.Tensor):
        return True
    return not (compat.tracing() or compat.is_wrapped(value) or compat.is_fake(value))


transform_of = compat.transform_of


def check_dtype(dtype: torch.dtype, name: str, allow_low_precision: bool = False) -> None:
    """float32 or float64; bfloat16/float16 only with the explicit opt-in ``allow_low_precision=True``."""
    if dtype in SUPPORTED_DTYPES or (allow_low_precision and dtype.is_floating_point):
        return
    raise TypeError(
        f"{name} has dtype {dtype}; fwdtrain trains in float32 or float64 (in {dtype} an update "
        f"alpha h G smaller than the spacing of theta is rounded away and training stalls "
        f"silently). Cast with .float() or .double(), or pass allow_low_precision=True to "
        f"opt in to {dtype} knowingly"
    )


def check_theta(theta: Any, name: str = "theta", allow_low_precision: bool = False) -> tuple[torch.dtype, torch.device]:
    """Every leaf a floating tensor (float32/float64 unless ``allow_low_precision``), one dtype and device;
    concrete leaves also finite and without ``requires_grad``."""
    pairs = leaves_with_paths(theta)
    if not pairs:
        raise ValueError(f"{name} has no tensors: pass a dict (or other pytree) of parameter tensors")
    dtypes, devices = set(), set()
    for path, leaf in pairs:
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(f"{name}{path} is a {type(leaf).__name__}; every leaf of {name} must be a torch.Tensor")
        if not leaf.is_floating_point():
            raise TypeError(
                f"{name}{path} has dtype {leaf.dtype}; parameters must be floating tensors "
                f"(float32 or float64), e.g. tensor.double()"
            )
        check_dtype(leaf.dtype, f"{name}{path}", allow_low_precision)
        if is_concrete(leaf):
            _check_values(leaf, f"{name}{path}")
        dtypes.add(leaf.dtype)
        devices.add(leaf.device)
    if len(dtypes) > 1:
        raise TypeError(f"{name} mixes dtypes {sorted(map(str, dtypes))}; cast every leaf to one dtype")
    if len(devices) > 1:
        raise ValueError(f"{name} spans devices {sorted(map(str, devices))}; move every leaf to one device")
    return dtypes.pop(), devices.pop()


def _check_values(leaf: torch.Tensor, name: str) -> None:
    """A concrete tensor: no ``requires_grad``, every entry finite."""
    if leaf.requires_grad:
        raise ValueError(
            f"{name} requires grad; fwdtrain derives every derivative with torch.func and needs "
            f"plain tensors: pass {name}.detach() (fwdtrain.functional(module) does this for a "
            f"module). To differentiate through fwdtrain use torch.func.grad/jacfwd/jacrev/vjp/jvp, "
            f"not torch.autograd"
        )
    if not bool(torch.isfinite(leaf).all()):
        raise ValueError(f"{name} contains NaN or inf")


def check_tensor(value: Any, name: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of theta's dtype and device; if concrete, also finite and without ``requires_grad``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype != dtype:
        raise TypeError(f"{name} has dtype {value.dtype} but theta has {dtype}; use one dtype, e.g. {name}.to({dtype})")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device} but theta is on {device}; move it with .to({str(device)!r})")
    if is_concrete(value):
        _check_values(value, name)
    return value


def check_dt(dt: Any) -> None:
    """dt a positive finite number (or 0-d tensor)."""
    if isinstance(dt, torch.Tensor):
        if dt.ndim != 0:
            raise ValueError(f"dt must be a number or a 0-d tensor, got a tensor of shape {tuple(dt.shape)}")
        if not dt.is_floating_point():
            raise TypeError(f"dt must be a floating number or tensor, got dtype {dt.dtype}")
        if not is_concrete(dt):
            return
        dt = dt.item()
    if isinstance(dt, bool) or not isinstance(dt, Real):
        raise TypeError(f"dt must be a positive number, got {type(dt).__name__}")
    if not math.isfinite(dt) or dt <= 0:
        raise ValueError(f"dt must be positive and finite, got {dt}")


def check_lr(lr: Any) -> None:
    """A schedule (checked later, on its value: ``check_alpha``), or a number / 0-d floating tensor, finite, >= 0."""
    if callable(lr):
        return
    if isinstance(lr, torch.Tensor):
        if lr.ndim != 0:
            raise ValueError(
                f"lr must be a number, a 0-d tensor or a schedule t -> lr, got shape {tuple(lr.shape)}"
                + (
                    " (under vmap, lr is one run's learning rate: batch the runs with vmap's in_dims, not inside lr)"
                    if transform_of(lr) == "vmap"
                    else ""
                )
            )
        if not lr.is_floating_point():
            raise TypeError(f"lr must be a floating tensor, got dtype {lr.dtype}; e.g. torch.tensor(0.1)")
        if not is_concrete(lr):
            return
        lr = lr.item()
    if isinstance(lr, bool) or not isinstance(lr, Real):
        raise TypeError(f"lr must be a number or a schedule (a function of t), got {type(lr).__name__}")
    if not math.isfinite(lr) or lr < 0:
        raise ValueError(f"lr must be finite and >= 0, got {lr}")


def good_rates(alphas: torch.Tensor) -> torch.Tensor:
    """(R,) bool: row r of ``alphas`` (R, ...) a finite number >= 0 in every entry (1-D: one entry a row)."""
    good = torch.isfinite(alphas) & (alphas >= 0)
    return good.flatten(1).all(1) if good.ndim > 1 else good


def real_number(value: Any, refuse: Callable[[str], str]) -> float | None:
    """``value`` as a float: a real number, or a 0-d floating tensor (None where it is traced, its value unknown);
    else ``TypeError`` or ``ValueError`` with the message ``refuse(what value is)``."""
    if isinstance(value, torch.Tensor):
        if value.ndim != 0 or not value.is_floating_point():
            raise ValueError(refuse(f"a {value.dtype} tensor of shape {tuple(value.shape)}"))
        return value.item() if is_concrete(value) else None
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(refuse(f"{type(value).__name__} ({value!r:.50})"))
    return float(value)


def check_alpha(alpha: Any, t: Any, lr: Any) -> None:
    """The learning rate alpha(t_n) that a step will use: a real number or a 0-d floating tensor; if concrete, also
    finite and >= 0 (``good_rates``). ``lr`` (a schedule or a value) and ``t`` name the culprit in the error. With
    members (t of shape (E,)): alpha one value or one per member, each checked."""
    if isinstance(t, torch.Tensor) and t.ndim:
        alphas = torch.as_tensor(alpha, dtype=t.dtype, device=t.device)
        if alphas.shape not in ((), t.shape):
            raise ValueError(
                f"the learning rate of {t.shape[0]} members has shape {tuple(alphas.shape)}; "
                f"expected one value per member, ({t.shape[0]},)"
            )
        for t_e, alpha_e in zip(t, alphas.expand(t.shape), strict=True):
            check_alpha(alpha_e, t_e, lr)
        return

    def refuse(got: Any, rule: str) -> str:
        source = f"the schedule {_describe(lr)}" if callable(lr) else f"lr = {lr!r}"
        at = f"t = {float(t):.6g}" if is_concrete(t) else "t"
        return f"{source} returned {got} at {at}; a learning rate must be {rule}"

    value = real_number(
        alpha, lambda got: refuse(got, "one floating number: a number or a 0-d floating tensor (not per-parameter)")
    )
    if value is not None and not math.isfinite(value):
        raise ValueError(refuse(value, "finite"))
    if value is not None and value < 0:
        raise ValueError(refuse(value, ">= 0 (a negative one runs gradient ascent)"))


def _describe(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def check_count(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_initial_state(within: torch.Tensor, checked: dict[str, Any], bound: float | None = None) -> None:
    """Raise ``ValueError`` unless ``within`` (a run's ``Trainable.within(state, bound)``: 0-d, or (E,) per member)
    is all True, naming the first leaf of the parts ``checked`` (``Trainable.checked``: x, x_tilde and theta) that
    is NaN or inf (or above ``bound``), the index of its first bad entry and the value there."""
    if bool(within.all()):
        return
    members = f" (members {torch.nonzero(~within).flatten().tolist()})" if within.ndim else ""
    for field, tree in checked.items():
        for path, leaf in leaves_with_paths(tree):
            if not isinstance(leaf, torch.Tensor) or leaf.numel() == 0:
                continue
            bad = ~torch.isfinite(leaf) if bound is None else ~(leaf.abs() <= bound)
            if not bool(bad.any()):
                continue
            index = tuple(int(i) for i in torch.nonzero(bad)[0])
            value = float(leaf[index])
            name = f"state.{field}{'' if path == '<root>' else path}"
            what = "non-finite entries" + (f" or entries above bound={bound}" if bound else "")
            where = ", ".join(map(str, index))
            raise ValueError(
                f"the initial state has {what}{members}: {name}[{where}] = {value:.6g}, the first of "
                f"{int(bad.sum())} in {name} of shape {tuple(leaf.shape)}. Every entry of x, x_tilde and theta must "
                f"be finite{f' and within bound={bound}' if bound else ''} before the first step: fix how {name} "
                f"was made (the initial theta or x0, an edit of the state, a diverged run or its checkpoint)"
            )
    raise ValueError(f"the initial state has non-finite entries{members}")


def check_same_structure(tree: Any, reference: Any, name: str, reference_name: str) -> None:
    if optree.tree_structure(tree) != optree.tree_structure(reference):
        raise ValueError(
            f"{name} does not have the structure of {reference_name}: "
            f"{optree.tree_structure(tree)} vs {optree.tree_structure(reference)}"
        )


__all__ = [
    "SUPPORTED_DTYPES",
    "check_alpha",
    "check_count",
    "check_dt",
    "check_dtype",
    "check_initial_state",
    "check_lr",
    "check_same_structure",
    "check_tensor",
    "check_theta",
    "is_concrete",
    "transform_of",
]
