"""Input validation: clear errors, raised before anything is computed (private)."""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

import torch

from ._tree import leaves_with_paths


def check_theta(theta: Any, name: str = "theta") -> tuple[torch.dtype, torch.device]:
    """Every leaf a finite floating tensor without grad, one dtype and device."""
    pairs = leaves_with_paths(theta)
    if not pairs:
        raise ValueError(f"{name} has no tensors: pass a dict (or other pytree) of parameter tensors")
    dtypes, devices = set(), set()
    for path, leaf in pairs:
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(f"{name}{path} is a {type(leaf).__name__}; every leaf of {name} must be a torch.Tensor")
        if not leaf.is_floating_point():
            raise TypeError(f"{name}{path} has dtype {leaf.dtype}; parameters must be floating tensors "
                            f"(float32 or float64), e.g. tensor.double()")
        if leaf.requires_grad:
            raise ValueError(f"{name}{path} requires grad; fwdtrain derives every derivative with torch.func "
                             f"and needs plain tensors: pass tensor.detach() (fwdtrain.functional(module) does this)")
        if not bool(torch.isfinite(leaf).all()):
            raise ValueError(f"{name}{path} contains NaN or inf")
        dtypes.add(leaf.dtype)
        devices.add(leaf.device)
    if len(dtypes) > 1:
        raise TypeError(f"{name} mixes dtypes {sorted(map(str, dtypes))}; cast every leaf to one dtype")
    if len(devices) > 1:
        raise ValueError(f"{name} spans devices {sorted(map(str, devices))}; move every leaf to one device")
    return dtypes.pop(), devices.pop()


def check_tensor(value: Any, name: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype != dtype:
        raise TypeError(f"{name} has dtype {value.dtype} but theta has {dtype}; use one dtype, e.g. {name}.to({dtype})")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device} but theta is on {device}; move it with .to({str(device)!r})")
    if value.requires_grad:
        raise ValueError(f"{name} requires grad; pass {name}.detach()")
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} contains NaN or inf")
    return value


def check_dt(dt: Any) -> None:
    """dt a positive finite number (or 0-d tensor)."""
    if isinstance(dt, torch.Tensor):
        if dt.ndim != 0:
            raise ValueError(f"dt must be a number or a 0-d tensor, got a tensor of shape {tuple(dt.shape)}")
        if torch.compiler.is_compiling():
            return
        dt = dt.item()
    if isinstance(dt, bool) or not isinstance(dt, Real):
        raise TypeError(f"dt must be a positive number, got {type(dt).__name__}")
    if not math.isfinite(dt) or dt <= 0:
        raise ValueError(f"dt must be positive and finite, got {dt}")


def check_lr(lr: Any) -> None:
    if callable(lr):
        return
    if isinstance(lr, torch.Tensor):
        if lr.ndim != 0:
            raise ValueError(f"lr must be a number, a 0-d tensor or a schedule t -> lr, got shape {tuple(lr.shape)}")
        if torch.compiler.is_compiling():
            return
        lr = lr.item()
    if isinstance(lr, bool) or not isinstance(lr, Real):
        raise TypeError(f"lr must be a number or a schedule (a function of t), got {type(lr).__name__}")
    if not math.isfinite(lr) or lr < 0:
        raise ValueError(f"lr must be finite and >= 0, got {lr}")


def check_count(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_same_structure(tree: Any, reference: Any, name: str, reference_name: str) -> None:
    import optree

    if optree.tree_structure(tree) != optree.tree_structure(reference):
        raise ValueError(f"{name} does not have the structure of {reference_name}: "
                         f"{optree.tree_structure(tree)} vs {optree.tree_structure(reference)}")


__all__ = ["check_theta", "check_tensor", "check_dt", "check_lr", "check_count", "check_same_structure"]
