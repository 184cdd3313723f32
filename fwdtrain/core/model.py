"""Models as pure functions of a parameter pytree.

A model is a pair ``(apply, theta)``: ``apply(theta, x)`` is a pure function and
``theta`` a dict of plain tensors (no ``requires_grad``, no ``grad_fn``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from numbers import Integral
from typing import NamedTuple

import torch
from torch.func import functional_call

Params = dict[str, torch.Tensor]
Apply = Callable[[Params, torch.Tensor], torch.Tensor]


class Model(NamedTuple):
    """A pure model: ``apply(theta, x)`` and its initial parameters ``theta``.

    Attributes:
        apply: ``apply(theta, x) -> output``, a pure function of the parameters and the input.
        theta: The initial parameters, a dict of plain tensors (no ``requires_grad``, no ``grad_fn``).
    """

    apply: Apply
    theta: Params


def functional(module: torch.nn.Module) -> Model:
    """Turn any ``torch.nn.Module`` into a pure ``apply(theta, x)`` and its parameters.

    ``apply`` calls the module through ``torch.func.functional_call``, so ``torch.func`` transforms
    differentiate and batch it; the module itself is never modified.

    Args:
        module: The network, e.g. ``torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.ReLU(), ...)``.

    Returns:
        ``Model(apply, theta)``: ``theta`` holds detached copies of ``module.named_parameters()`` (keyed by
        their names); buffers are copied once and frozen into ``apply``.

    Raises:
        TypeError: ``module`` is not a ``torch.nn.Module``.
        ValueError: The module has no parameters.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"functional(module) expects a torch.nn.Module, got {type(module).__name__}")
    theta = {name: p.detach().clone() for name, p in module.named_parameters()}
    if not theta:
        raise ValueError(f"{type(module).__name__} has no parameters to train")
    buffers = {name: b.detach().clone() for name, b in module.named_buffers()}

    def apply(theta: Params, x: torch.Tensor) -> torch.Tensor:
        return functional_call(module, (theta, buffers), (x,), strict=True)

    return Model(apply, theta)


_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "softplus": torch.nn.functional.softplus,
    "silu": torch.nn.functional.silu,
    "identity": lambda z: z,
}


def mlp(
    sizes: Sequence[int],
    *,
    activation: str = "relu",
    output_bias: bool = True,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    output_scale: float = 1.0,
) -> Model:
    """A multilayer perceptron ``sizes[0] -> ... -> sizes[-1]`` as a pure model.

    Layer i computes z W_i^T + b_i; hidden layers apply ``activation``. Weights and biases are drawn
    from U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (``torch.nn.Linear``'s default) by a generator seeded with
    ``seed``, so the same arguments give the same network.

    Args:
        sizes: Layer widths, at least two, e.g. ``[1, 16, 1]``.
        activation: ``"relu"``, ``"tanh"``, ``"sigmoid"``, ``"softplus"``, ``"silu"`` or ``"identity"``.
        output_bias: Whether the last layer has a bias.
        seed: Seed of the initial weights.
        dtype: ``torch.float32`` or ``torch.float64``.
        output_scale: Factor on the last layer's initial weights (e.g. 0.1 for a control that starts near 0).

    Returns:
        ``Model(apply, theta)``: ``theta`` has keys ``"weight{i}"`` (shape (sizes[i+1], sizes[i])) and
        ``"bias{i}"``; ``apply(theta, x)`` takes x of shape (sizes[0],) or (..., sizes[0]).

    Raises:
        ValueError: Fewer than two sizes, a size that is not a positive integer, or an unknown activation.
        TypeError: A dtype that is not floating.
    """
    sizes = list(sizes)
    if len(sizes) < 2 or not all(isinstance(s, Integral) and not isinstance(s, bool) and s >= 1 for s in sizes):
        raise ValueError(
            f"mlp(sizes) needs at least two positive integer layer widths, got {sizes}; e.g. mlp([d, 16, d])"
        )
    sizes = [int(s) for s in sizes]
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"mlp(dtype=...) must be a floating dtype (torch.float32 or torch.float64), got {dtype}")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(_ACTIVATIONS)}")
    act = _ACTIVATIONS[activation]
    layers = len(sizes) - 1
    generator = torch.Generator().manual_seed(seed)
    theta: Params = {}
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        bound = 1.0 / math.sqrt(fan_in)
        scale = output_scale if i == layers - 1 else 1.0
        weight = (torch.rand(fan_out, fan_in, generator=generator, dtype=torch.float64) * 2 - 1) * bound * scale
        theta[f"weight{i}"] = weight.to(dtype)
        if i < layers - 1 or output_bias:
            bias = (torch.rand(fan_out, generator=generator, dtype=torch.float64) * 2 - 1) * bound
            theta[f"bias{i}"] = bias.to(dtype)

    def apply(theta: Params, x: torch.Tensor) -> torch.Tensor:
        z = x
        for i in range(layers):
            weight, bias = theta[f"weight{i}"], theta.get(f"bias{i}")
            if z.ndim == 1:  # one point: a matrix-vector product, a third fewer autograd nodes than matmul's
                z = torch.mv(weight, z) if bias is None else torch.addmv(bias, weight, z)
            else:
                z = z @ weight.T if bias is None else z @ weight.T + bias
            if i < layers - 1:
                z = act(z)
        return z

    return Model(apply, theta)
