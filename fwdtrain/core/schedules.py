"""Learning-rate schedules: pure, branch-free functions of the time t.

Each factory returns ``schedule(t) -> alpha(t)``; ``t`` may be a float or a
0-d tensor, and the schedule works under ``vmap`` and ``torch.compile``.

A parameter passed as a tensor stays a tensor (it is not turned into a float),
so ``torch.func.grad`` of a training run with respect to a schedule's parameter
(a meta-gradient) flows through the schedule, and ``vmap`` can batch it.
Arguments are validated when they are concrete (numbers or plain tensors):
finite, and >= 0 for learning rates, with errors naming the factory and argument.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._checks import is_concrete, real_number

Schedule = Callable[[torch.Tensor], Any]  # t -> alpha(t); the built-in ones return tensors shaped like t
Parameter = float | torch.Tensor


def _as_tensor(t) -> torch.Tensor:
    return t if isinstance(t, torch.Tensor) else torch.as_tensor(t, dtype=torch.float64)


def _parameter(
    value: Parameter, factory: str, name: str, *, minimum: float | None = 0.0, strict: bool = False
) -> Parameter:
    """A number (as float) or a 0-d floating tensor (kept as it is); if concrete, finite and >= (or >) minimum."""
    number = real_number(value, lambda got: f"{factory}: {name} must be a number or a 0-d floating tensor, got {got}")
    if number is None:
        return value
    if not math.isfinite(number):
        raise ValueError(f"{factory}: {name} must be finite, got {number}")
    if minimum is not None and (number <= minimum if strict else number < minimum):
        relation = ">" if strict else ">="
        raise ValueError(f"{factory}: {name} must be {relation} {minimum:g}, got {number}")
    return value if isinstance(value, torch.Tensor) else number


def constant(value: Parameter) -> Schedule:
    """alpha(t) = value.

    Args:
        value: The learning rate, >= 0 (a number, or a 0-d floating tensor to differentiate through).

    Returns:
        The schedule ``t -> alpha(t)``, a tensor shaped like t.

    Raises:
        TypeError, ValueError: A value that is not a number or 0-d tensor, not finite, or negative.
    """
    value = _parameter(value, "constant", "value")

    def schedule(t):
        return torch.zeros_like(_as_tensor(t)) + value

    return schedule


def inverse_time(scale: Parameter, offset: Parameter = 1.0) -> Schedule:
    """alpha(t) = scale / (offset + t): int alpha = inf, int alpha^2 < inf (the Robbins-Monro conditions).

    Args:
        scale: C >= 0 (a number or a 0-d floating tensor).
        offset: C0 > 0, so that alpha(0) = C / C0 is finite (default 1).

    Returns:
        The schedule ``t -> alpha(t)``, a tensor shaped like t.

    Raises:
        TypeError, ValueError: A parameter that is not a number or 0-d tensor, not finite, or out of range.
    """
    scale = _parameter(scale, "inverse_time", "scale")
    offset = _parameter(offset, "inverse_time", "offset", strict=True)

    def schedule(t):
        return scale / (offset + _as_tensor(t))

    return schedule


def piecewise_constant(values: Sequence[Parameter], boundaries: Sequence[Parameter]) -> Schedule:
    """alpha(t) = values[i] for boundaries[i-1] < t <= boundaries[i] (values[0] up to boundaries[0]).

    Branch-free, so it works under ``vmap`` and in compiled kernels:
    alpha(t) = values[0] + sum_i (values[i+1] - values[i]) 1[t > boundaries[i]].

    Args:
        values: K + 1 learning rates, finite and >= 0.
        boundaries: K times, finite and strictly increasing.

    Returns:
        The schedule ``t -> alpha(t)``, a tensor shaped like t.

    Raises:
        TypeError, ValueError: Bad values or boundaries, or one more value than boundaries missing.
    """
    values = [_parameter(v, "piecewise_constant", f"values[{i}]") for i, v in enumerate(values)]
    boundaries = [
        _parameter(b, "piecewise_constant", f"boundaries[{i}]", minimum=None) for i, b in enumerate(boundaries)
    ]
    if len(values) != len(boundaries) + 1:
        raise ValueError(
            f"piecewise_constant needs one more value than boundaries, "
            f"got {len(values)} values and {len(boundaries)} boundaries"
        )
    if all(is_concrete(b) for b in boundaries):
        numbers = [float(b) for b in boundaries]
        if any(b1 <= b0 for b0, b1 in itertools.pairwise(numbers)):
            raise ValueError(f"piecewise_constant: boundaries must increase strictly, got {numbers}")
    jumps = [(b, v1 - v0) for b, (v0, v1) in zip(boundaries, itertools.pairwise(values), strict=True)]

    def schedule(t):
        t = _as_tensor(t)
        alpha = torch.zeros_like(t) + values[0]
        for boundary, jump in jumps:
            alpha = alpha + jump * (t > boundary).to(t.dtype)
        return alpha

    return schedule


def staged(scale: Parameter) -> Schedule:
    """The seed's schedule: C up to t = 50, C/2 up to 100, C/5 up to 500, C/10 after.

    Args:
        scale: C >= 0.

    Returns:
        The schedule ``t -> alpha(t)`` (a ``piecewise_constant`` one).
    """
    scale = _parameter(scale, "staged", "scale")
    return piecewise_constant([scale, scale / 2, scale / 5, scale / 10], [50.0, 100.0, 500.0])


__all__ = ["Parameter", "Schedule", "constant", "inverse_time", "piecewise_constant", "staged"]
