"""A state-dependent user model through the general engine (Newton over all events at once) against a Python loop
over the events written here: log-likelihood, gradient and information equal, and the user's functions are called
a number of times that does not grow with the events.

The model (a self-exciting process with a saturating jump): lambda = mu + Y, dY = -kappa Y dt, and at an event
Y jumps by alpha / (1 + Y / cap), so the jump depends on Y: no linear recursion, no scan of the additive kind.
"""

from __future__ import annotations

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
