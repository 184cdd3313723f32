"""A state-dependent user model through the general engine (Newton over all events at once) against a Python loop
over the events written here: log-likelihood, gradient and information equal, and the user's functions are called
a number of times that does not grow with the events.

The model (a self-exciting process with a saturating jump): lambda = mu + Y, dY = -kappa Y dt, and at an event
Y jumps by alpha / (1 + Y / cap), so the jump depends on Y: no linear recursion, no scan of the additive kind.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import fwdtrain as ft
from fwdtrain.events import likelihood, models

pp = ft.pointprocess
D64 = torch.float64
PARAMETERS = {name: pp.Parameter((), positive=True) for name in ("mu", "alpha", "kappa", "cap")}
TRUTH = {"mu": 0.5, "alpha": 0.8, "kappa": 1.2, "cap": 2.0}


def _model(calls):
    def rate(theta, y):
        calls["rate"] += 1
        return (theta["mu"] + y).reshape(1)

    def jump(theta, y, k, z):
        calls["jump"] += 1
        return theta["alpha"] / (1 + y / theta["cap"])

    return pp.intensity_model(
        rate,
        parameters=PARAMETERS,
        decay=lambda theta: theta["kappa"].reshape(1),
        jump=jump,
        bound=lambda theta, y, horizon: (theta["mu"] + y + theta["alpha"]).reshape(1),
    )


def _loop(theta, times, end):
    """log L by a Python loop over the events, the compensator of each interval in closed form."""
    mu, alpha, kappa, cap = theta["mu"], theta["alpha"], theta["kappa"], theta["cap"]
    y, previous, value = torch.zeros((), dtype=D64), 0.0, torch.zeros((), dtype=D64)
    for t in [*times, end]:
        gap = t - previous
        value = value - mu * gap - y * (1 - torch.exp(-kappa * gap)) / kappa
        y = y * torch.exp(-kappa * gap)
        if t != end:
            value = value + torch.log(mu + y)
            y = y + alpha / (1 + y / cap)
        previous = t
    return value


def _theta(values):
    return {name: torch.tensor(float(value), dtype=D64) for name, value in values.items()}


@pytest.mark.parametrize("end", [60.0, 600.0])
def test_a_state_dependent_model_equals_a_python_loop_with_no_call_per_event(end):
    calls = {"rate": 0, "jump": 0}
    model = _model(calls)
    assert isinstance(model, models.GeneralModel)
    data = pp.simulate(model, _theta(TRUTH), end, seed=2)
    times = data.times[data.mask].tolist()
    assert len(times) > end
    prepared = likelihood.prepare(model, data)
    theta = _theta({"mu": 0.6, "alpha": 0.7, "kappa": 1.0, "cap": 1.5})
    u = models.pack(model, theta)
    calls.update(rate=0, jump=0)
    mine = likelihood.log_likelihood(model, theta, prepared)
    assert calls["rate"] <= 4 and calls["jump"] <= 40, calls  # a few vectorised calls per Newton step, not per event
    reference = _loop(theta, times, end)
    assert float(mine) == pytest.approx(float(reference), rel=1e-12)
    loop_of = lambda w: _loop(models.unpack(model, w), times, end)
    calls.update(rate=0, jump=0)
    gradient, curvature = ft.events.fitting.derivatives(model, prepared, u)
    assert calls["rate"] <= 8 and calls["jump"] <= 20, calls  # the adjoint pass: vectorised calls, none per event
    torch.testing.assert_close(gradient, torch.func.grad(loop_of)(u), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(curvature, torch.func.hessian(loop_of)(u), rtol=1e-8, atol=1e-8)
    through = torch.func.grad(lambda w: likelihood.log_likelihood(model, models.unpack(model, w), prepared))(u)
    torch.testing.assert_close(through, gradient, rtol=1e-9, atol=1e-9)  # torch.func through the solve agrees
    information = ft.events.information(model, theta, data)
    loop_information = -torch.func.hessian(lambda t: _loop(dict(zip(theta, t)), times, end))(
        torch.stack(list(theta.values()))
    )
    torch.testing.assert_close(information, loop_information, rtol=1e-8, atol=1e-8)


def test_where_the_jump_makes_the_chain_expand_the_solve_still_equals_the_loop():
    """cap small: dG/dy = -alpha / cap / (1 + y / cap)^2 reaches -4 near y = 0, where plain Newton from a far
    start diverges along the chain; the clipped steps find the loop's path."""
    calls = {"rate": 0, "jump": 0}
    model = _model(calls)
    data = pp.simulate(model, _theta(TRUTH), 1_000.0, seed=2)
    theta = _theta({"mu": 0.4762, "alpha": 1.3325, "kappa": 1.1189, "cap": 0.3125})
    calls.update(rate=0, jump=0)
    mine = likelihood.log_likelihood(model, theta, data)
    assert float(mine) == pytest.approx(float(_loop(theta, data.times[data.mask].tolist(), 1_000.0)), rel=1e-12)
    assert calls["jump"] < data.events / 4, (calls, data.events)


def _two_types():
    """Two types, Y (2,): lambda = mu + Y, dY = -kappa Y dt, a type-k event adds alpha_k / (1 + (Y_0 + Y_1) / cap)
    to Y_k."""
    parameters = {"mu": pp.Parameter((2,), positive=True), "alpha": pp.Parameter((2,), positive=True)}
    parameters.update(kappa=pp.Parameter((2,), positive=True), cap=pp.Parameter((), positive=True))

    def jump(theta, y, k, z):
        return torch.where(torch.arange(2) == k, theta["alpha"] / (1 + y.sum() / theta["cap"]), 0.0)

    return pp.intensity_model(
        lambda theta, y: theta["mu"] + y,
        parameters=parameters,
        type_count=2,
        state_size=2,
        decay=lambda theta: theta["kappa"],
        jump=jump,
    )


def _two_types_loop(theta, events, end):
    """log L of ``_two_types`` by a Python loop over (time, type) in time order; a tied event sees the state
    before its tie's first event."""
    mu, alpha, kappa, cap = theta["mu"], theta["alpha"], theta["kappa"], theta["cap"]
    y, previous, value, left = torch.zeros(2, dtype=D64), 0.0, torch.zeros((), dtype=D64), None
    for t, k in [*events, (end, None)]:
        gap = t - previous
        value = value - (mu * gap + y * (1 - torch.exp(-kappa * gap)) / kappa).sum()
        y = y * torch.exp(-kappa * gap)
        if k is None:
            break
        left = y if left is None or gap > 0 else left
        value = value + torch.log(mu[k] + left[k])
        y = y + torch.where(torch.arange(2) == k, alpha / (1 + y.sum() / cap), 0.0)
        previous = t
    return value


def test_a_two_dimensional_state_with_ties_equals_a_python_loop():
    """d = 2 (the scans' 2x2 Jacobians, the adjoint's transposes) and tied times (events on a grid of 0.05): the
    gradient and Hessian of the adjoint pass equal the loop's, and torch.func through the solve agrees."""
    model = _two_types()
    rng = np.random.default_rng(4)
    end = 80.0
    times = np.round(np.sort(rng.uniform(0, end, 120)) / 0.05) * 0.05
    kinds = rng.integers(0, 2, times.size)
    data = pp.from_tick([times[kinds == k] for k in range(2)], end_time=end)
    order = np.lexsort((kinds, times))  # the engine's order: by time, then type
    events = [(float(times[i]), int(kinds[i])) for i in order]
    assert bool((np.diff(times[order]) == 0).any())  # ties
    theta = {
        "mu": torch.tensor([0.4, 0.7], dtype=D64),
        "alpha": torch.tensor([0.6, 0.9], dtype=D64),
        "kappa": torch.tensor([1.1, 2.3], dtype=D64),
        "cap": torch.tensor(1.5, dtype=D64),
    }
    prepared = likelihood.prepare(model, data)
    u = models.pack(model, theta)
    loop_of = lambda w: _two_types_loop(models.unpack(model, w), events, end)
    assert float(likelihood.log_likelihood(model, theta, prepared)) == pytest.approx(float(loop_of(u)), rel=1e-12)
    gradient, curvature = ft.events.fitting.derivatives(model, prepared, u)
    torch.testing.assert_close(gradient, torch.func.grad(loop_of)(u), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(curvature, torch.func.hessian(loop_of)(u), rtol=1e-8, atol=1e-8)
    through = lambda w: likelihood.log_likelihood(model, models.unpack(model, w), prepared)
    torch.testing.assert_close(torch.func.jacfwd(torch.func.grad(through))(u), curvature, rtol=1e-8, atol=1e-8)


def test_an_online_pass_ends_within_three_standard_errors_of_the_batch_fit():
    """One online pass with the defaults (block, prior, start) on the saturating model: finite standard errors,
    no warning, every parameter within 3 batch standard errors of the batch MLE."""
    model = _model({"rate": 0, "jump": 0})
    data = pp.simulate(model, _theta(TRUTH), 400.0, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        batch = pp.fit(model, data)
        online = pp.fit(model, data, method="online")
    assert batch.converged
    for name in TRUTH:
        assert bool(torch.isfinite(online.stderr[name])), (name, online.stderr)
        z = float((online.params[name] - batch.params[name]) / batch.stderr[name])
        assert abs(z) < 3, (name, z, online.params, batch.params)


def _drifting():
    """The saturating jump with a nonlinear drift dY = -kappa Y (1 + Y / 10) dt (RK4 between events)."""
    return pp.intensity_model(
        lambda theta, y: (theta["mu"] + y).reshape(1),
        parameters=PARAMETERS,
        drift=lambda theta, y: -theta["kappa"] * y * (1 + 0.1 * y),
        jump=lambda theta, y, k, z: theta["alpha"] / (1 + y / theta["cap"]),
        bound=lambda theta, y, horizon: (theta["mu"] + y + theta["alpha"]).reshape(1),
        step=0.2,
    )


def test_with_a_drift_the_adjoint_pass_equals_torch_func_through_the_solve():
    model = _drifting()
    data = pp.simulate(model, _theta(TRUTH), 100.0, seed=1)
    prepared = likelihood.prepare(model, data)
    u = models.pack(model, _theta({"mu": 0.6, "alpha": 0.7, "kappa": 1.0, "cap": 1.5}))
    gradient, curvature = ft.events.fitting.derivatives(model, prepared, u)
    through = lambda w: likelihood.log_likelihood(model, models.unpack(model, w), prepared)
    torch.testing.assert_close(torch.func.grad(through)(u), gradient, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(torch.func.jacfwd(torch.func.grad(through))(u), curvature, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["decay", "drift"])
def test_the_online_blocks_scores_sum_to_the_batch_gradient_at_a_fixed_theta(kind):
    """The online pass's blocks (each chunk's path solved once and moved by its sensitivities, the state's
    sensitivity carried from block to block) at a fixed u: their scores, with the window's end through the
    carried sensitivity, sum to the batch gradient."""
    model = _model({"rate": 0, "jump": 0}) if kind == "decay" else _drifting()
    data = pp.simulate(model, _theta(TRUTH), 150.0 if kind == "decay" else 40.0, seed=5)
    prepared = likelihood.prepare(model, data)
    u = models.pack(model, _theta({"mu": 0.6, "alpha": 0.7, "kappa": 1.0, "cap": 1.5}))
    carry = likelihood.init(model, models.unpack(model, u), prepared.data)
    tangents = tuple(torch.zeros((*s.shape, u.numel()), dtype=D64) for s in carry.state)
    total = torch.zeros_like(u)
    for piece in likelihood.pieces(prepared, 16):
        step = ft.events.online.block_step(model, piece, u, carry, tangents)
        carry, tangents, total = step.carry, step.tangents, total + step.score

    def rest(w, state):  # the window's end after the last event, through the carried state's sensitivity
        closing = likelihood.Carry((state,), carry.time)
        return -likelihood.tail(
            model, models.unpack(model, w), closing, prepared.data.end, prepared.tail_substeps
        ).sum()

    eye = torch.eye(u.numel(), dtype=D64)
    for i in range(u.numel()):
        total[i] += torch.func.jvp(rest, (u, carry.state[0]), (eye[i], tangents[0][..., i]))[1]
    gradient, _ = ft.events.fitting.derivatives(model, prepared, u)
    torch.testing.assert_close(total, gradient, rtol=1e-9, atol=1e-8)
