"""Fitting an ``EventModel`` to events: the exact maximum likelihood (batch) or online, with standard errors.

Both fits run on the unconstrained u (``models.pack``: logarithms of the positive parameters); results are in
natural units.

- batch: Newton's method on log L(u) with the exact gradient and Hessian of one pass (torch.func), damped
  (Levenberg) until the step stops; or L-BFGS (``solver="lbfgs"``).
- online: one pass over the events in blocks of ``block``; the sensitivity dY/du of the carried state goes with
  the state (forward mode: a jvp of each chunk with tangents (I, dY/du)), the block's score s_n = D log L updates
  u by Adam on -s_n / (events in the block) at rate lr / (1 + n / lr_decay)^(1/2) (n the block count), and the
  result is the Polyak average of u over the blocks after ``average_from`` of the events.

Standard errors: sqrt(diag(I^-1)), I = -d^2 log L / dtheta^2 the observed information in natural units at the
estimate, from the same pass as the Hessian in u: with theta = exp(u) for a positive parameter,
d^2 L/du^2 = J H J + diag(g theta), J = diag(theta).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch.func import grad, jacfwd, jvp, vmap

from ..optim import adam, apply_updates
from .data import EventData, as_events
from .likelihood import Carry, Prepared, chunk, forward, init, jet_derivatives, kernel_jets, pieces, prepare
from .models import EventModel, ExponentialHawkes, pack, unpack


class FitResult(NamedTuple):
    """A fit: ``params`` and ``stderr`` (dicts in natural units), the covariance (p, p) of the flattened
    parameters (``models.pack`` order, natural units), log L at params, the observed information, how many
    iterations (batch) or blocks (online), and the online path of params (one dict of tensors, leading axis
    the blocks; empty for batch)."""

    params: dict[str, torch.Tensor]
    stderr: dict[str, torch.Tensor]
    covariance: torch.Tensor
    log_likelihood: float
    information: torch.Tensor
    method: str
    iterations: int
    events: int
    path: dict[str, torch.Tensor]


def _objective(model: EventModel, prepared: Prepared, scale: float):
    return lambda u: forward(model, unpack(model, u), prepared).log_likelihood / scale


def derivatives(model: EventModel, prepared: Prepared, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient (p,) and Hessian (p, p) of log L in u, from one pass: for exponential kernels through the
    jets of the sums in the decays (``likelihood.kernel_jets``), else torch.func through the whole pass."""
    if isinstance(model, ExponentialHawkes):
        jets = kernel_jets(model, model.kernel.decays(unpack(model, u)), prepared)
        return jet_derivatives(model, jets, lambda w: unpack(model, w), u)[1:]
    gradient = grad(_objective(model, prepared, 1.0))
    curvature, first = jacfwd(lambda w: (gradient(w), gradient(w)), has_aux=True)(u)
    return first, curvature


def _positive_mask(model: EventModel) -> torch.Tensor:
    return torch.cat(
        [torch.full((math.prod(s.shape),), s.positive, dtype=torch.bool) for s in model.parameters.values()]
    )


def natural_information(
    model: EventModel, u: torch.Tensor, gradient: torch.Tensor, curvature: torch.Tensor
) -> torch.Tensor:
    """-d^2 log L / dtheta^2 in natural units from the gradient and Hessian of log L in u."""
    positive = _positive_mask(model)
    theta = torch.where(positive, torch.exp(u), torch.ones_like(u))
    chain = torch.where(positive, gradient, torch.zeros_like(gradient))  # d L / du of the positive entries
    return -(curvature - torch.diag(chain)) / (theta[:, None] * theta[None, :])


def _errors(model: EventModel, information: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    covariance = torch.linalg.pinv(information, hermitian=True)
    variance = covariance.diagonal()
    flat = torch.where(variance > 0, variance.clamp(min=0).sqrt(), torch.full_like(variance, float("nan")))
    out, start = {}, 0
    for name, spec in model.parameters.items():
        n = math.prod(spec.shape)
        out[name] = flat[start : start + n].reshape(spec.shape)
        start += n
    return covariance, out


def information(model: EventModel, params: dict[str, Any], events: Any, end_time: Any = None) -> torch.Tensor:
    """The observed information (p, p) in natural units at ``params``: one gradient and one Hessian pass."""
    prepared = prepare(model, as_events(events, end_time, types=model.type_count))
    u = pack(model, params)
    return natural_information(model, u, *derivatives(model, prepared, u))


def _newton(
    model: EventModel, prepared: Prepared, u: torch.Tensor, iterations: int, tolerance: float
) -> tuple[torch.Tensor, int]:
    """Levenberg-damped Newton ascent on log L(u) / N; stops when the step is below ``tolerance``."""
    scale = max(prepared.data.events, 1)
    objective = _objective(model, prepared, scale)
    value = objective(u)
    damping = 1e-8
    eye = torch.eye(u.numel(), dtype=u.dtype)
    for count in range(1, iterations + 1):
        gradient, curvature = (d / scale for d in derivatives(model, prepared, u))
        while True:
            step = torch.linalg.solve(-curvature + damping * eye * (1 + curvature.diagonal().abs()), gradient)
            trial = objective(u + step)
            if bool(torch.isfinite(trial)) and float(trial) >= float(value) - 1e-15:
                break
            damping *= 10
            if damping > 1e12:
                return u, count
        u, value, damping = u + step, trial, max(damping / 10, 1e-12)
        if float(step.abs().max()) < tolerance:
            return u, count
    return u, iterations


def _lbfgs(objective: Any, u: torch.Tensor, iterations: int, tolerance: float) -> tuple[torch.Tensor, int]:
    u = u.clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS(
        [u],
        max_iter=iterations,
        tolerance_grad=tolerance,
        tolerance_change=1e-16,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = -objective(u)
        loss.backward()
        return loss

    optimizer.step(closure)
    return u.detach(), int(optimizer.state[u].get("n_iter", 0))


def _finish(model: EventModel, prepared: Prepared, u: torch.Tensor, method: str, count: int, path: dict) -> FitResult:
    gradient, curvature = derivatives(model, prepared, u)
    observed = natural_information(model, u, gradient, curvature)
    covariance, stderr = _errors(model, observed)
    value = float(_objective(model, prepared, 1.0)(u))
    return FitResult(unpack(model, u), stderr, covariance, value, observed, method, count, prepared.data.events, path)


def batch(
    model: EventModel,
    prepared: Prepared,
    start: dict[str, Any],
    solver: str = "newton",
    iterations: int = 100,
    tolerance: float = 1e-10,
) -> FitResult:
    """The exact maximum-likelihood estimate from ``start`` (see the module's docstring)."""
    u = pack(model, start)
    if solver == "newton":
        u, count = _newton(model, prepared, u, iterations, tolerance)
    elif solver == "lbfgs":
        u, count = _lbfgs(_objective(model, prepared, max(prepared.data.events, 1)), u, iterations, tolerance)
    else:
        raise ValueError(f"solver must be 'newton' or 'lbfgs', got {solver!r}")
    return _finish(model, prepared, u, "batch", count, {})


def _block_step(model: EventModel, prepared: Prepared, piece: Any, u: torch.Tensor, carry: Carry, tangents: tuple):
    """(the moved carry, its tangents dY/du, the block's log L, its gradient in u) by forward mode."""

    def block(w: torch.Tensor, state: tuple) -> tuple[tuple, torch.Tensor]:
        moved, log_rate, compensator = chunk(model, unpack(model, w), Carry(state, carry.time), piece)
        return moved.state, log_rate.sum() - compensator.sum()

    eye = torch.eye(u.numel(), dtype=u.dtype)
    state_dims = tuple(-1 for _ in carry.state)
    (state, value), (d_state, d_value) = vmap(  # type: ignore[misc]
        lambda du, ds: jvp(block, (u, carry.state), (du, ds)),
        in_dims=(0, state_dims),
        out_dims=(0, (state_dims, 0)),  # type: ignore[arg-type]
    )(eye, tangents)
    return Carry(tuple(s[0] for s in state), piece.times[:, -1]), d_state, value[0], d_value


def online(
    model: EventModel,
    prepared: Prepared,
    start: dict[str, Any],
    block: int = 64,
    lr: float = 0.1,
    lr_decay: float = 10.0,
    average_from: float = 0.5,
) -> FitResult:
    """One online pass (see the module's docstring); standard errors from the information at the result."""
    u = pack(model, start)
    rule = adam()
    opt_state = rule.init(u)
    carry = init(model, unpack(model, u), prepared.data)
    tangents = tuple(torch.zeros((*s.shape, u.numel()), dtype=s.dtype) for s in carry.state)
    total = max(prepared.data.events, 1)
    seen, mean, averaged = 0, torch.zeros_like(u), 0
    path = []
    for n, piece in enumerate(pieces(prepared, block)):
        carry, tangents, _, score = _block_step(model, prepared, piece, u, carry, tangents)
        events = max(int(piece.mask.sum()), 1)
        updates, opt_state = rule.update(-score / events, opt_state, u, lr / math.sqrt(1 + n / lr_decay))
        u = apply_updates(u, updates)
        seen += events
        if seen >= average_from * total:
            averaged += 1
            mean = mean + (u - mean) / averaged
        path.append(u)
    final = mean if averaged else u
    trajectory = vmap(lambda w: unpack(model, w))(torch.stack(path))
    return _finish(model, prepared, final, "online", len(path), trajectory)


def fit(
    model: EventModel,
    events: Any,
    end_time: Any = None,
    *,
    method: str = "batch",
    start: dict[str, Any] | None = None,
    start_time: Any = 0.0,
    **options: Any,
) -> FitResult:
    """Fit ``model`` to ``events`` (``EventData``, tick's list of arrays, an array of times or a table) on the
    window [start_time, end_time] by the exact likelihood: ``method="batch"`` (options: solver, iterations,
    tolerance) or ``"online"`` (options: block, lr, lr_decay, average_from). ``start``: theta in natural units
    (default ``model.start(data)``). Returns a ``FitResult`` with ``params`` and ``stderr`` in natural units."""
    if not isinstance(model, EventModel):
        raise TypeError(
            f"fit(model, ...) needs an EventModel (pointprocess.hawkes, intensity_model), got {type(model).__name__}"
        )
    if method not in ("batch", "online"):
        raise ValueError(f"method must be 'batch' or 'online', got {method!r}")
    data = events if isinstance(events, EventData) else as_events(events, end_time, start_time, model.type_count)
    prepared = prepare(model, data)
    theta = model.start(prepared.data) if start is None else start
    pack(model, theta)  # checked before any work
    if method == "batch":
        return batch(model, prepared, theta, **options)
    return online(model, prepared, theta, **options)


__all__ = ["FitResult", "batch", "derivatives", "fit", "information", "natural_information", "online"]
