"""Point-process fitting (fwdtrain.pointprocess): the online log-likelihood gradient equals jacrev through the
chain, a Hawkes fit recovers its parameters within their Monte Carlo error, and bad data is refused."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import jacrev

import fwdtrain as ft

pp = ft.pointprocess
D64 = torch.float64


def test_the_online_gradient_is_the_gradient_of_the_log_likelihood():
    model, dt = pp.grid_hawkes(), 0.05
    theta, y0 = pp.hawkes_theta(0.6, 0.7, 1.3), torch.zeros(1, dtype=D64)
    data = pp.grid_simulate(model, theta, y0, 100, dt, paths=3, seed=2)
    assert data[..., 0].sum() >= 5
    fit = pp.IntensityFit(model)

    def log_likelihood(th):
        state = fit.start(th, y0, 3)
        plan = fit.plan(state)
        total, gradient = torch.zeros((), dtype=D64), None
        for n in range(data.shape[0]):
            moved, value, d_value = fit.score_step(state, data[n], dt, plan)
            total = total + value.sum()
            step = {k: v.sum(0) for k, v in d_value.items()}
            gradient = step if gradient is None else {k: gradient[k] + step[k] for k in step}
            state = state._replace(x=moved.x, x_tilde=moved.x_tilde)
        return total, gradient

    _, online = log_likelihood(theta)
    exact = jacrev(lambda th: log_likelihood(th)[0])(theta)
    for name in theta:
        torch.testing.assert_close(online[name], exact[name], rtol=1e-10, atol=1e-12)


def test_a_hawkes_fit_recovers_its_parameters_within_their_monte_carlo_error():
    example = ft.examples.hawkes_fit()
    data = example.data(0, example.steps)
    fit = pp.IntensityFit(example.sde, events=data)
    start = fit.start(example.theta, example.x0, example.particles)
    run = ft.run(fit, start, example.steps, example.dt, example.lr, compile=True)
    truth = pp.hawkes_theta(**ft.examples.hawkes.TRUTH)
    errors = pp.standard_errors(fit, truth, example.x0, data, example.dt)
    for name in truth:
        deviation = abs(float(run.state.theta[name] - truth[name]))
        assert deviation < 3 * float(errors[name]), (name, deviation, float(errors[name]))
        assert float(errors[name]) < 0.1  # the data pin the parameters down (the test can fail)
    moved = {name: abs(float(run.state.theta[name] - example.theta[name])) for name in truth}
    assert min(moved.values()) > 0.03  # it did move from the start


def test_bad_event_data_and_models_are_refused():
    with pytest.raises(TypeError, match="rate that depends on theta"):
        pp.IntensityFit(ft.SDE(lambda th, x: x, lambda th, x: x, lambda th, x: x.sum()))
    with pytest.raises(ValueError, match="0 or 1"):
        pp.check_events(torch.full((3, 1, 1), 2.0), (1, 1))
    with pytest.raises(ValueError, match=r"shape \(steps, 1, 1\)"):
        pp.check_events(torch.zeros((3, 2, 1)), (1, 1))
    with pytest.raises(ValueError, match="two events fall in one step"):
        pp.bin_events(torch.tensor([0.11, 0.12], dtype=D64), 0.1, 10)
    binned = pp.bin_events(torch.tensor([0.05, 0.31], dtype=D64), 0.1, 5)
    assert binned[:, 0, 0].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="mu > 0"):
        pp.hawkes_theta(-1.0, 0.5, 1.0)
    model = pp.grid_hawkes()
    fit = pp.IntensityFit(model, events=torch.zeros((5, 2, 1), dtype=D64))
    start = fit.start(pp.hawkes_theta(1.0, 0.5, 1.0), torch.zeros(1, dtype=D64), 3)
    with pytest.raises(ValueError, match=r"events must have shape \(steps, 3, 1\)"):
        ft.run(fit, start, 5, 0.1, 0.1)
    assert math.isfinite(float(start.x.sum()))
