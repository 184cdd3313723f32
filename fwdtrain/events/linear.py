"""The exact fit of an exponential-kernel Hawkes model through its likelihood's linearity in baseline and adjacency.

At decays b (U,) the intensity at each event is linear in the table T (K, F) = [baseline (K, P), weights (K, U K)]
(``ExponentialKernel``), and so is the compensator:

    lambda_{k_i}(t_i-) = x_i . T_{k_i},   x_i = (t_i's piece of the day one-hot (P,), b_u S_uj(t_i-) (U K,)),
    int sum_k lambda_k dt = sum_k T_k . q,  q = (the observed time in each piece (P,), sum_{m: type j}
                                                 (1 - exp(-b_u (end - t_m))) (U K,)),

so log L = sum_k [sum_{k_i = k} log(x_i . T_k) - q . T_k] is concave in T and separable by type. The features x
(one pass: ``expsums.strict_sums``) and q are computed once per decays; a Newton step then costs a few small
matmuls per type (``type_sums``), no pass over the events. T is linear in the natural parameters other than the
decays, T = M theta (M: the kernel at the basis vectors, once); Newton runs on the model's u (log baseline,
adjacency >= 0 by projection: ``newton.projected_newton``), so an entry whose MLE is 0 sits exactly at 0.

Fitted decays (``decay``, ``decay="row"``, ``fit_decays=True``): the profile likelihood, max over the linear
parameters at decays b, maximised over u_b = log b by the same projected Newton, its gradient d log L / d u_b at
the inner optimum (the envelope theorem) and its curvature the Schur complement H_bb - H_bF H_FF^-1 H_Fb of the
joint Hessian (``likelihood.jet_derivatives``) over the free linear entries F: one jets pass per outer step.

For ``ExponentialHawkes`` models whose jumps do not depend on theta (``model.jets``; not ``mark_scaling``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .expsums import strict_sums
from .likelihood import KernelJets, Prepared, jet_derivatives, kernel_jets, type_columns, type_sums
from .models import EventModel, ExponentialHawkes, season_exposure, season_pieces, unpack
from .newton import Newton, active, projected_newton

Sum = Callable[[torch.Tensor], torch.Tensor]


def split(model: EventModel, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """A flat vector (p,) in ``models.pack`` order as a dict of the parameters' shapes (no change of units)."""
    out, start = {}, 0
    for name, spec in model.parameters.items():
        n = math.prod(spec.shape)
        out[name] = flat[start : start + n].reshape(spec.shape)
        start += n
    return out


def mask(model: EventModel, domain: str) -> torch.Tensor:
    """(p,) True on the entries of the parameters whose ``domain`` ("positive" or "nonnegative") is set."""
    flags = [torch.full((math.prod(s.shape),), getattr(s, domain), dtype=torch.bool) for s in model.parameters.values()]
    return torch.cat(flags) if flags else torch.zeros(0, dtype=torch.bool)


def natural(model: EventModel, u: torch.Tensor) -> torch.Tensor:
    """theta flattened in natural units from u (exp of the positive entries)."""
    return torch.where(mask(model, "positive"), torch.exp(u), u)


def table(model: ExponentialHawkes, theta: Any) -> torch.Tensor:
    """T (K, F) = [baseline (K, P), weights (K, U K)]: lambda_{k_i}(t_i-) = x_i . T_{k_i}."""
    kernel = model.kernel
    return torch.cat([kernel.baseline(theta), kernel.weights(theta).reshape(model.type_count, -1)], 1)


class Features(NamedTuple):
    """What log L needs at fixed decays: the features x of each type's events (K tensors (F, N_k)) and q (F,)."""

    groups: tuple[torch.Tensor, ...]
    compensator: torch.Tensor


def features(model: ExponentialHawkes, decays: torch.Tensor, prepared: Prepared) -> Features:
    """The features and compensator coefficients at ``decays`` (U,) (see the module's docstring): one pass."""
    data, knots, k = prepared.data, model.kernel.knots, model.type_count
    sums, at_end = strict_sums(decays, data.times, data.types, data.mask, data.end, k)
    groups = []
    for kind in range(k):
        chosen = data.mask & (data.types == kind)
        rows = torch.cat([season_pieces(knots, data.times[chosen]), (sums[chosen] * decays[:, None]).flatten(1)], 1)
        groups.append(rows.T.contiguous())
    excitation = data.counts().sum(0) - at_end.sum(0)  # (U, K)
    exposure = (season_exposure(knots, data.end) - season_exposure(knots, data.start)).sum(0)
    return Features(tuple(groups), torch.cat([exposure, excitation.reshape(-1)]))


def from_jets(model: ExponentialHawkes, jets: KernelJets, prepared: Prepared) -> Features:
    """The same features read from the jets of the sums (their values), without another pass."""
    k, p = model.type_count, len(model.kernel.knots) + 1
    n, u = jets.features.shape[0], jets.decays.shape[0]
    sums = jets.features[:, p:].reshape(n, u, k, 3)[..., 0] * jets.decays[:, None]
    types = prepared.data.types[prepared.data.mask]
    at_end = (jets.last.value * torch.exp(-jets.remaining[:, None] * jets.decays)[..., None]).sum(0)  # (U, K)
    compensator = torch.cat([jets.exposure, (jets.counts - at_end).reshape(-1)])
    return Features(type_columns(torch.cat([jets.features[:, :p], sums.reshape(n, -1)], 1), types, k), compensator)


def _log_likelihood(groups: tuple[torch.Tensor, ...], compensator: torch.Tensor, rates_table: torch.Tensor):
    value = rates_table.new_zeros(())
    for x, row in zip(groups, rates_table, strict=True):
        value = value + torch.log(row @ x).sum()
    return value - (rates_table @ compensator).sum()


class Problem(NamedTuple):
    """The concave problem in the linear entries of u at fixed decays: their mask (p,), which of them are positive,
    u (its other entries held), the map M (K F, p_lin) from the linear parameters in natural units to T, and the
    features."""

    linear: torch.Tensor
    positive: torch.Tensor  # (p_lin,) the linear entries fitted through their logarithm
    u: torch.Tensor
    map: torch.Tensor
    features: Features


def table_map(model: ExponentialHawkes, linear: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """M (K F, p_lin) with T flattened = M theta_linear: ``table`` at the basis vectors (it is linear in them), in
    u's dtype and on its device."""
    basis = torch.eye(linear.shape[0], dtype=u.dtype, device=u.device)[linear]
    return torch.func.vmap(lambda e: table(model, split(model, e)).reshape(-1))(basis).T


def linear_derivatives(
    model: ExponentialHawkes, task: Problem, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log L, gradient, Hessian) in the linear entries w of u (theta = exp(w) on the positive ones):
    g = J M' (dPhi/dT - q), H = J M' blockdiag(d^2 Phi / dT_k^2) M J + diag(g_theta theta) on the positive ones."""
    positive = task.positive
    theta = torch.where(positive, torch.exp(w), w)
    k = model.type_count
    rates_table = (task.map @ theta).reshape(k, -1)
    value, slope, curvature = type_sums(task.features.groups, rates_table)
    value = value - (rates_table @ task.features.compensator).sum()
    gradient = task.map.T @ (slope - task.features.compensator).reshape(-1)
    hessian = task.map.T @ torch.block_diag(*curvature) @ task.map
    chain = torch.where(positive, theta, torch.ones_like(theta))
    hessian = hessian * chain[:, None] * chain[None, :] + torch.diag(torch.where(positive, gradient * theta, 0.0))
    return value, gradient * chain, hessian


def _linear_value(model: ExponentialHawkes, task: Problem, w: torch.Tensor) -> torch.Tensor:
    theta = torch.where(task.positive, torch.exp(w), w)
    rates_table = (task.map @ theta).reshape(model.type_count, -1)
    return _log_likelihood(task.features.groups, task.features.compensator, rates_table)


class Solution(NamedTuple):
    """A fit: u, how the solver stopped, log L, its gradient and Hessian in u at u (summed over processes)."""

    u: torch.Tensor
    newton: Newton
    log_likelihood: torch.Tensor
    gradient: torch.Tensor
    hessian: torch.Tensor


def _inner(
    model: ExponentialHawkes,
    task: Problem,
    iterations: int,
    tolerance: float,
    total: Sum,
    scale: float,
) -> tuple[torch.Tensor, Newton]:
    """u with its linear entries at their maximum at the problem's decays (``projected_newton``)."""
    bounded = mask(model, "nonnegative")[task.linear]
    objective = lambda w: total(_linear_value(model, task, w)) / scale
    derivatives = lambda w: tuple(total(d) / scale for d in linear_derivatives(model, task, w)[1:])
    found = projected_newton(objective, derivatives, task.u[task.linear], bounded, iterations, tolerance)  # type: ignore[arg-type]
    return task.u.masked_scatter(task.linear, found.x), found


def fit(
    model: ExponentialHawkes,
    prepared: Prepared,
    u: torch.Tensor,
    iterations: int = 100,
    tolerance: float = 1e-10,
    total: Sum = lambda tensor: tensor,
    scale: float = 1.0,
) -> Solution:
    """The exact MLE from u (see the module's docstring): Newton in the linear entries at the decays if none is
    fitted, else the profile likelihood over the decays. ``total`` sums a tensor over the processes holding the
    other realizations; log L and its derivatives are divided by ``scale`` inside the solvers."""
    decays = decay_entries(model, u)
    linear = ~decays
    reading = table_map(model, linear, u)
    positive = mask(model, "positive")[linear]
    if not bool(decays.any()):
        task = Problem(linear, positive, u, reading, features(model, model.kernel.decays(unpack(model, u)), prepared))
        u, inner = _inner(model, task, iterations, tolerance, total, scale)
        value, gradient, hessian = (total(d) for d in linear_derivatives(model, task, u[linear]))
        return Solution(u, inner, value, gradient, hessian)
    return _profile(model, prepared, u, linear, positive, reading, iterations, tolerance, total, scale)


def decay_entries(model: ExponentialHawkes, u: torch.Tensor) -> torch.Tensor:
    """(p,) True on the entries of the parameters that the kernel's decays read (each parameter moved by one)."""
    theta = natural(model, u)
    decays = model.kernel.decays(split(model, theta))
    flags, start = [], 0
    for spec in model.parameters.values():
        n = math.prod(spec.shape)
        moved = theta.clone()
        moved[start : start + n] += 1
        flags.append(torch.full((n,), not torch.equal(model.kernel.decays(split(model, moved)), decays)))
        start += n
    return torch.cat(flags)


def _profile(
    model: ExponentialHawkes,
    prepared: Prepared,
    u: torch.Tensor,
    linear: torch.Tensor,
    positive: torch.Tensor,
    reading: torch.Tensor,
    iterations: int,
    tolerance: float,
    total: Sum,
    scale: float,
) -> Solution:
    """Projected Newton on the profile log-likelihood in the decay entries v of u (see the module's docstring);
    the last points' jets, problems and inner optima are kept for the calls that read them again."""
    known: dict[tuple[float, ...], dict[str, Any]] = {}
    latest = [u]  # the last inner optimum: the next inner fit's start

    def solved(v: torch.Tensor) -> dict[str, Any]:
        key = tuple(v.tolist())
        if key not in known:
            if len(known) > 3:
                known.pop(next(iter(known)))
            point = latest[0].masked_scatter(~linear, v)
            jets = kernel_jets(model, model.kernel.decays(unpack(model, point)), prepared)
            task = Problem(linear, positive, point, reading, from_jets(model, jets, prepared))
            latest[0], _ = _inner(model, task, iterations, tolerance, total, scale)
            known[key] = {"u": latest[0], "jets": jets, "task": task}
        return known[key]

    def profile(v: torch.Tensor) -> torch.Tensor:
        point = solved(v)
        return total(_linear_value(model, point["task"], point["u"][linear])) / scale

    def joint(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        point = solved(v)
        if "joint" not in point:
            found = jet_derivatives(model, point["jets"], lambda w: unpack(model, w), point["u"])
            point["joint"] = tuple(total(d) for d in found)
        return point["joint"]

    def reduced(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, gradient, hessian = joint(v)
        free = linear & ~active(solved(v)["u"], gradient, mask(model, "nonnegative"))
        outer = ~linear
        coupling = hessian[outer][:, free]
        inverse = torch.linalg.pinv(hessian[free][:, free], hermitian=True)  # singular: a type without events
        schur = hessian[outer][:, outer] - coupling @ inverse @ coupling.T
        # the inner optimum is exact to its last (untaken) Newton step: the step's first-order effect on g_v
        slope = gradient[outer] - coupling @ inverse @ gradient[free]
        return slope / scale, schur / scale

    start = u[~linear]
    outer = projected_newton(profile, reduced, start, torch.zeros_like(start, dtype=torch.bool), iterations, tolerance)
    value, gradient, hessian = joint(outer.x)
    return Solution(solved(outer.x)["u"], outer, value, gradient, hessian)


__all__ = [
    "Features",
    "Problem",
    "Solution",
    "decay_entries",
    "features",
    "fit",
    "from_jets",
    "linear_derivatives",
    "mask",
    "natural",
    "split",
    "table",
    "table_map",
]
