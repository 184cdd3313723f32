"""A neural intensity: a small network of the decayed counts (and marks) of the events, at several time scales.

The state Y (S, K, 1 + m) holds, for each fixed decay b_s and each type j, the exponentially decayed count of past
type-j events and the decayed sums of their first m marks (an order's size, say):

    Y_sj0(t) = sum over past type-j events t_n of exp(-b_s (t - t_n)),
    Y_sjc(t) = sum over past type-j events of z_nc exp(-b_s (t - t_n)),   c = 1..m.

Its jumps do not depend on Y and it decays in closed form, so the model is an ``AdditiveModel``: the likelihood is a
scan over the events. The intensity of each type is

    lambda(theta, Y) = floor + softplus(MLP(theta, x)),   x = log1p(b_s Y_sjc) flattened,

x the log of one plus the rate-like estimates b_s Y (each about the event rate times a mark's size on its scale),
the MLP one tanh hidden layer (``core.model.mlp``): d = S K (1 + m) inputs, ``hidden`` units, K outputs, theta
{"weight0" (h, d), "bias0" (h,), "weight1" (K, h), "bias1" (K,)}, all real. The default start draws the weights
from a seeded generator (the output layer scaled by 0.1) and sets bias1 so that lambda starts near each type's mean
rate in the data. ``floor`` keeps every intensity positive (log lambda finite).

Fits: ``fit(model, events)`` (batch) or ``fit(..., method="online")`` (one pass, the sensitivity dY/dtheta carried
forward). For p ~ 100-300 parameters, batch L-BFGS (``solver="lbfgs"``) costs one gradient pass per iteration
where Newton's Hessian costs about p passes; see the events guide for the measured times.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..core.model import mlp
from .data import D64, EventData
from .models import AdditiveModel, Parameter


def _softplus_inverse(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))


def neural_intensity(
    type_count: int,
    decays: Sequence[float] = (0.1, 1.0, 10.0),
    hidden: int = 16,
    *,
    marks: int = 0,
    floor: float = 1e-3,
    seed: int = 0,
    step: float | None = None,
) -> AdditiveModel:
    """A neural intensity of K = ``type_count`` types (see the module's docstring): the state the decayed counts
    (and the first ``marks`` marks' decayed sums) of each type at each of the fixed ``decays`` (per unit of time),
    lambda = ``floor`` + softplus(MLP(theta, log1p(b Y))) with one tanh layer of ``hidden`` units. The default start
    (seeded by ``seed``) puts lambda near the events' mean rate of each type. ``step``: the longest Gauss-Legendre
    piece of the compensator (default 2 / max(decays): 8 nodes per two time constants of the fastest scale)."""
    k, h, m = int(type_count), int(hidden), int(marks)
    if k < 1 or h < 1 or m < 0:
        raise ValueError(
            f"neural_intensity needs type_count >= 1, hidden >= 1 and marks >= 0, got {type_count}, {hidden}, {marks}"
        )
    scales = torch.as_tensor(decays, dtype=D64).reshape(-1)
    if scales.numel() == 0 or not bool((scales > 0).all()) or not bool(torch.isfinite(scales).all()):
        raise ValueError(f"neural_intensity(decays=...) must be positive numbers, got {list(decays)}")
    if not floor > 0:
        raise ValueError(f"neural_intensity(floor=...) must be > 0 (it keeps log lambda finite), got {floor}")
    shape = (scales.numel(), k, 1 + m)
    d = scales.numel() * k * (1 + m)
    network = mlp([d, h, k], activation="tanh", seed=seed, dtype=D64, output_scale=0.1)
    parameters = {name: Parameter(tuple(value.shape)) for name, value in network.theta.items()}
    per_state = scales[:, None, None].expand(shape).reshape(-1)  # b_s of each entry of Y

    def rate(theta: Any, y: torch.Tensor) -> torch.Tensor:
        return floor + torch.nn.functional.softplus(
            network.apply(theta, torch.log1p(per_state.to(dtype=y.dtype, device=y.device) * y))
        )

    def jump(theta: Any, y: torch.Tensor, kind: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        one = torch.nn.functional.one_hot(kind, k).to(y.dtype)  # (K,)
        entries = torch.cat([y.new_ones(1), z[:m].to(y.dtype)])  # (1 + m,)
        return (one[:, None] * entries[None, :]).expand(shape).reshape(-1)

    def start(data: EventData) -> dict[str, torch.Tensor]:
        if data.marks.shape[-1] < m:
            raise ValueError(
                f"neural_intensity(marks={m}) reads the first {m} marks of each event, but the events have "
                f"{data.marks.shape[-1]}: give events with marks (a table's mark column) or build it with "
                f"marks={data.marks.shape[-1]}"
            )
        rates = data.counts().sum(0) / float((data.end - data.start).sum())
        theta = {name: value.to(rates, copy=True) for name, value in network.theta.items()}
        theta["bias1"] = _softplus_inverse((rates - floor).clamp(min=floor))
        return theta

    def bound(theta: Any, y: torch.Tensor, horizon: float) -> torch.Tensor:
        # |tanh| <= 1, so each output is at most bias1 + sum |weight1|, whatever the state
        return floor + torch.nn.functional.softplus(theta["bias1"] + theta["weight1"].abs().sum(1))

    return AdditiveModel(
        type_count=k,
        state_size=d,
        rate=rate,
        jump=jump,
        parameters=parameters,
        start=start,
        decay=lambda theta: per_state.to(dtype=theta["bias1"].dtype, device=theta["bias1"].device),
        step=2.0 / float(scales.max()) if step is None else float(step),
        bound=bound,
    )


__all__ = ["neural_intensity"]
