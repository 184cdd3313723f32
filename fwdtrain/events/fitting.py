"""Fitting an ``EventModel`` to events: the exact maximum likelihood (batch) or online, with standard errors.

Both fits run on u (``models.pack``: logarithms of the positive parameters; the nonnegative ones, such as the
Hawkes adjacency, as they are, with a bound at 0 that Newton respects by projection); results are in natural units.

- batch: Newton's method on log L(u) with the exact gradient and Hessian of one pass (torch.func), damped
  (Levenberg) until the step stops (``newton.projected_newton``); or L-BFGS (``solver="lbfgs"``). The result
  says whether the solver converged; ``fit`` warns when it did not or when a standard error is NaN.
- online: one pass over the events in blocks, a second-order (recursive Newton) update after each block from
  the block's score and Fisher information, the first blocks' models taken again about later estimates (so a
  far start does not bias the end), continued over new events from the previous fit's state (``events.online``).

Standard errors (batch): sqrt(diag(I^-1)), I = -d^2 log L / dtheta^2 the observed information in natural units at the
estimate, from the same pass as the Hessian in u: with theta = exp(u) for a positive parameter,
d^2 L/du^2 = J H J + diag(g theta), J = diag(theta). A nonnegative entry at its bound 0 (``FitResult.at_bound``)
has a NaN standard error (the estimate's law there is not the normal that the information describes); the other
errors invert the information of the free entries, the bound ones held at 0.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.func import grad, jacfwd, vmap

from . import linear
from .data import EventData, as_events
from .likelihood import (
    Prepared,
    forward,
    general_derivatives,
    jet_derivatives,
    kernel_jets,
    prepare,
)
from .models import EventModel, ExponentialHawkes, GeneralModel, pack, unpack
from .newton import Newton, projected_newton
from .online import OnlineState, begin, check, walk

Sum = Callable[[torch.Tensor], torch.Tensor]  # a tensor summed over the processes that share a fit


class FitResult(NamedTuple):
    """A fit: ``params`` and ``stderr`` (dicts in natural units), ``at_bound`` (dict of bool tensors: the
    nonnegative entries that sit at 0, whose standard errors are NaN: the information's inverse does not describe
    an estimate at its bound; the other errors condition on them), the covariance (p, p) of the flattened
    parameters (``models.pack`` order, natural units), log L at params, the observed information, how many
    iterations (batch) or blocks (online), the online path of params (one dict of tensors, leading axis
    the blocks; empty for batch), whether the solver converged and why it stopped, and (online) the state that
    a next call continues (the pass at its last whole block and the events after it). Online, the information
    is the pass's accumulated Fisher information and log L the prequential sum of the blocks' log L, each at
    the estimate of its time (``events.online``)."""

    params: dict[str, torch.Tensor]
    stderr: dict[str, torch.Tensor]
    at_bound: dict[str, torch.Tensor]
    covariance: torch.Tensor
    log_likelihood: float
    information: torch.Tensor
    method: str
    iterations: int
    events: int
    path: dict[str, torch.Tensor]
    converged: bool
    reason: str
    state: OnlineState | None


def _objective(model: EventModel, prepared: Prepared, scale: float):
    return lambda u: forward(model, unpack(model, u), prepared).log_likelihood / scale


def derivatives(model: EventModel, prepared: Prepared, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient (p,) and Hessian (p, p) of log L in u, from one pass: for exponential kernels through the
    jets of the sums in the decays (``likelihood.kernel_jets``), else (a mark-scaled kernel too) torch.func
    through the whole pass."""
    if isinstance(model, ExponentialHawkes) and model.jets:
        jets = kernel_jets(model, model.kernel.decays(unpack(model, u)), prepared)
        return jet_derivatives(model, jets, lambda w: unpack(model, w), u)[1:]
    if isinstance(model, GeneralModel):
        return general_derivatives(model, prepared, lambda w: unpack(model, w), u)[1:]
    gradient = grad(_objective(model, prepared, 1.0))
    curvature, first = jacfwd(lambda w: (gradient(w), gradient(w)), has_aux=True)(u)
    return first, curvature


def natural_information(
    model: EventModel, u: torch.Tensor, gradient: torch.Tensor, curvature: torch.Tensor
) -> torch.Tensor:
    """-d^2 log L / dtheta^2 in natural units from the gradient and Hessian of log L in u."""
    positive = linear.mask(model, "positive")
    theta = torch.where(positive, torch.exp(u), torch.ones_like(u))
    chain = torch.where(positive, gradient, torch.zeros_like(gradient))  # d L / du of the positive entries
    return -(curvature - torch.diag(chain)) / (theta[:, None] * theta[None, :])


def _errors(information: torch.Tensor, held: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(covariance, standard errors) (p, p), (p,): the inverse information of the free entries (the others held
    at their bound); NaN in the rows, columns and errors of the held entries, NaN errors where it is singular."""
    free = ~held
    covariance = torch.full_like(information, float("nan"))
    block = torch.linalg.pinv(information[free][:, free], hermitian=True)
    index = free.nonzero()[:, 0]
    covariance[index[:, None], index[None, :]] = block
    variance = covariance.diagonal()
    errors = torch.where(variance > 0, variance.clamp(min=0).sqrt(), torch.full_like(variance, float("nan")))
    return covariance, errors


def information(model: EventModel, params: dict[str, Any], events: Any, end_time: Any = None) -> torch.Tensor:
    """The observed information (p, p) in natural units at ``params``: one gradient and one Hessian pass."""
    prepared = prepare(model, as_events(events, end_time, types=model.type_count))
    u = pack(model, params, prepared.data.times)
    return natural_information(model, u, *derivatives(model, prepared, u))


def _lbfgs(objective: Any, u: torch.Tensor, iterations: int, tolerance: float) -> Newton:
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
    count = int(optimizer.state[u].get("n_iter", 0))
    converged = count < iterations  # stopped by its tolerances (the gradient, or no change left in u or -log L)
    reason = "converged" if converged else f"iteration limit ({iterations}) reached"
    return Newton(u.detach(), converged, reason, count)


def _finish(
    model: EventModel, prepared: Prepared, u: torch.Tensor, method: str, solver: Newton, path: dict, reduce: Sum
) -> FitResult:
    gradient, curvature = (reduce(d) for d in derivatives(model, prepared, u))
    value = float(reduce(_objective(model, prepared, 1.0)(u)))
    return _result(model, prepared, u, gradient, curvature, value, method, solver, path, reduce)


def _result(
    model: EventModel,
    prepared: Prepared,
    u: torch.Tensor,
    gradient: torch.Tensor,
    curvature: torch.Tensor,
    value: float,
    method: str,
    solver: Newton,
    path: dict,
    reduce: Sum,
) -> FitResult:
    """The ``FitResult`` at u from log L's gradient and Hessian in u there (summed over the processes)."""
    observed = natural_information(model, u, gradient, curvature)
    held = linear.mask(model, "nonnegative") & (u <= 0)
    covariance, errors = _errors(observed, held)
    return FitResult(
        params=unpack(model, u),
        stderr=linear.split(model, errors),
        at_bound=linear.split(model, held),
        covariance=covariance,
        log_likelihood=value,
        information=observed,
        method=method,
        iterations=solver.iterations,
        events=int(reduce(torch.tensor(prepared.data.events))),
        path=path,
        converged=solver.converged,
        reason=solver.reason,
        state=None,
    )


def _warn(result: FitResult) -> None:
    """One warning when the solver did not converge or a standard error is NaN."""
    problems = [] if result.converged else [f"the {result.method} fit did not converge: {result.reason}"]
    missing = [name for name, e in result.stderr.items() if bool((torch.isnan(e) & ~result.at_bound[name]).any())]
    if missing:
        problems.append(f"NaN standard errors in {missing} (the information is singular there)")
    if problems:
        warnings.warn(f"fwdtrain: {'; '.join(problems)}", RuntimeWarning, stacklevel=3)


def _alone(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def batch(
    model: EventModel,
    prepared: Prepared,
    start: dict[str, Any],
    solver: str = "newton",
    iterations: int = 100,
    tolerance: float = 1e-10,
    reduce: Sum | None = None,
) -> FitResult:
    """The exact maximum-likelihood estimate from ``start`` (see the module's docstring). ``reduce``: a function
    that sums a tensor over the processes holding the other realizations (``ranks.group_sum``); log L, its
    gradient and Hessian are summed before every decision, and the start is the ranks' mean u."""
    total = _alone if reduce is None else reduce
    if reduce is not None and solver != "newton":
        raise ValueError(f"reduce= (realizations across processes) needs solver='newton', got {solver!r}")
    u = pack(model, start, prepared.data.times)
    tolerance = max(tolerance, 100 * torch.finfo(u.dtype).eps)  # float32: 1.2e-5, float64 as given
    u = total(u) / total(torch.ones((), dtype=u.dtype, device=u.device))
    scale = float(total(torch.tensor(float(prepared.data.events)))) or 1.0
    objective = lambda w: total(_objective(model, prepared, 1.0)(w)) / scale
    if solver == "newton" and isinstance(model, ExponentialHawkes) and model.jets:
        found = linear.fit(model, prepared, u, iterations, tolerance, total, scale)
        value = float(found.log_likelihood)
        return _result(model, prepared, found.u, found.gradient, found.hessian, value, "batch", found.newton, {}, total)
    if solver == "newton":
        scaled = lambda w: tuple(total(d) / scale for d in derivatives(model, prepared, w))
        result = projected_newton(objective, scaled, u, linear.mask(model, "nonnegative"), iterations, tolerance)  # type: ignore[arg-type]
    elif solver == "lbfgs":
        # L-BFGS has no bounds: the nonnegative entries go through exp, as the positive ones do in u
        bounded = linear.mask(model, "nonnegative")
        natural = lambda v: torch.where(bounded, torch.exp(torch.where(bounded, v, 0)), v)
        result = _lbfgs(
            lambda v: objective(natural(v)), torch.where(bounded, u.clamp(min=1e-8).log(), u), iterations, tolerance
        )
        result = result._replace(x=natural(result.x))
    else:
        raise ValueError(f"solver must be 'newton' or 'lbfgs', got {solver!r}")
    return _finish(model, prepared, result.x, "batch", result, {}, total)


def online(
    model: EventModel,
    prepared: Prepared,
    start: dict[str, Any],
    block: int = 64,
    prior: float = 1.0,
    radius: float = 1.0,
    state: OnlineState | None = None,
) -> FitResult:
    """One online pass from ``start``, or from ``state`` (a previous online fit's ``FitResult.state``) continued
    over the next events (``events.online``); the result's ``state`` continues it again."""
    if int(block) < 1:
        raise ValueError(f"online block must be a positive number of events, got {block!r}")
    if not (math.isfinite(radius) and radius > 0):
        raise ValueError(f"online radius (the largest move per block) must be a positive number, got {radius!r}")
    bounded = linear.mask(model, "nonnegative")
    if state is None:
        state = begin(model, prepared, start, prior)
    else:
        check(state, prepared)
    kept, moved, path = walk(model, prepared, state, bounded, int(block), radius)
    fisher = moved.information - moved.prior * torch.eye(moved.u.numel(), dtype=moved.u.dtype, device=moved.u.device)
    observed = natural_information(model, moved.u, torch.zeros_like(moved.u), -fisher)
    held = bounded & (moved.u <= 0)
    covariance, errors = _errors(observed, held)
    trajectory = vmap(lambda w: unpack(model, w))(torch.stack(path)) if path else {}
    return FitResult(
        params=unpack(model, moved.u),
        stderr=linear.split(model, errors),
        at_bound=linear.split(model, held),
        covariance=covariance,
        log_likelihood=moved.log_likelihood,
        information=observed,
        method="online",
        iterations=moved.blocks,
        events=int(moved.seen.sum()),
        path=trajectory,
        converged=True,
        reason="one pass",
        state=kept,
    )


_OPTIONS = {"batch": ("solver", "iterations", "tolerance", "reduce"), "online": ("block", "prior", "radius", "state")}


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
    tolerance, reduce: ``ranks.group_sum`` when the realizations are split across processes) or ``"online"``
    (options: block, prior, radius, and state: a previous online fit's ``FitResult.state`` to continue over
    these next events). ``start``: theta in natural units (default
    ``model.start(data)``). Returns a ``FitResult`` with ``params`` and ``stderr`` in natural units."""
    if not isinstance(model, EventModel):
        raise TypeError(
            f"fit(model, ...) needs an EventModel (pointprocess.hawkes, intensity_model), got {type(model).__name__}"
        )
    if method not in _OPTIONS:
        raise ValueError(f"method must be 'batch' or 'online', got {method!r}")
    unknown = sorted(set(options) - set(_OPTIONS[method]))
    if unknown:
        raise ValueError(f"fit(method={method!r}) takes the options {list(_OPTIONS[method])}, got {unknown}")
    if start is not None and options.get("state") is not None:
        raise ValueError("give start= (a new online fit) or state= (continue one), not both")
    data = events if isinstance(events, EventData) else as_events(events, end_time, start_time, model.type_count)
    prepared = prepare(model, data)
    theta = model.start(prepared.data) if start is None else start
    pack(model, theta, prepared.data.times)  # checked before any work
    result = (batch if method == "batch" else online)(model, prepared, theta, **options)
    _warn(result)
    return result


__all__ = ["FitResult", "batch", "derivatives", "fit", "information", "natural_information", "online"]
