"""A fitted event model judged on any events: log L of raw or held-out events equal to the prepared pass, AIC and
BIC by their definitions, the intensity on a grid against direct sums over past events (and the likelihood
engine's own intensities at the events), and the branching matrix against its closed form and the integral of
the kernel."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import fwdtrain as ft

ev = ft.events
D64 = torch.float64
TRUTH = {"baseline": [0.5, 0.3], "adjacency": [[0.5, 0.2], [0.3, 0.4]], "decay": 1.5}


def _hawkes_brute(timestamps, mu, alpha, beta, grid):
    """lambda_i(g-) = mu_i + sum_j alpha_ij beta sum_{t < g, type j} exp(-beta (g - t)), by direct sums."""
    out = np.zeros((len(grid), len(mu)))
    for a, g in enumerate(grid):
        for i in range(len(mu)):
            out[a, i] = mu[i] + sum(
                alpha[i][j] * beta * sum(math.exp(-beta * (g - t)) for t in times if t < g)
                for j, times in enumerate(timestamps)
            )
    return out


def _timestamps(data, r=0):
    mask = data.mask[r]
    return [data.times[r][mask & (data.types[r] == k)].tolist() for k in range(data.dimension)]


def test_log_likelihood_takes_any_events_and_equals_the_prepared_pass():
    model = ev.hawkes(dimension=2)
    data = ev.simulate(model, TRUTH, 60.0, seed=0, realizations=2)
    prepared = ev.prepare(model, data)
    reference = ev.likelihood.log_likelihood(model, {k: torch.tensor(v, dtype=D64) for k, v in TRUTH.items()}, prepared)
    assert float(ev.log_likelihood(model, TRUTH, data)) == float(reference)
    assert float(ev.log_likelihood(model, TRUTH, prepared)) == float(reference)
    tick = [_timestamps(data, r) for r in range(2)]
    assert float(ev.log_likelihood(model, TRUTH, tick, end_time=60.0)) == pytest.approx(float(reference), rel=1e-12)
    one = ev.hawkes()
    times = [0.3, 1.1, 1.2, 4.0]
    theta = {"baseline": [0.4], "adjacency": [[0.3]], "decay": 2.0}
    table = ev.log_likelihood(one, theta, ev.from_table(times, end_time=5.0))
    assert float(ev.log_likelihood(one, theta, times, end_time=5.0)) == float(table)
    assert float(ev.log_likelihood(one, theta, np.asarray(times), end_time=5.0)) == float(table)
    u = ev.pack(one, theta)  # params as tensors stay differentiable
    gradient = torch.func.grad(lambda w: ev.log_likelihood(one, ev.unpack(one, w), times, end_time=5.0))(u)
    assert torch.isfinite(gradient).all() and gradient.abs().sum() > 0


def test_a_held_out_day_is_scored_with_aic_and_bic_by_their_definitions():
    model = ev.hawkes(dimension=2)
    days = [ev.simulate(model, TRUTH, 200.0, seed=s) for s in (1, 2)]
    fitted = ev.fit(model, days[0])
    held_out = ev.evaluate(model, fitted.params, days[1])
    value = float(ev.log_likelihood(model, fitted.params, days[1]))
    assert held_out.log_likelihood == value and held_out.parameters == 7 and held_out.events == days[1].events
    assert held_out.aic == pytest.approx(2 * 7 - 2 * value)
    assert held_out.bic == pytest.approx(7 * math.log(days[1].events) - 2 * value)
    on_fitted = ev.evaluate(model, fitted.params, days[0])
    assert on_fitted.log_likelihood == pytest.approx(fitted.log_likelihood, rel=1e-10)
    fixed = ev.hawkes(dimension=2, decays=(1.5,))  # the decay fixed: one parameter fewer
    assert ev.evaluate(fixed, {"baseline": [1.0, 1.0], "adjacency": [[[0.1]] * 2] * 2}, days[1]).parameters == 6


@pytest.mark.parametrize("kind", ["shared", "row", "sums"])
def test_the_intensity_on_a_grid_equals_the_direct_sum_over_past_events(kind):
    if kind == "sums":
        model, decays = ev.hawkes(dimension=2, decays=(0.5, 4.0)), (0.5, 4.0)
        theta = {"baseline": [0.5, 0.3], "adjacency": [[[0.3, 0.2], [0.1, 0.1]], [[0.2, 0.1], [0.2, 0.2]]]}
    else:
        model = ev.hawkes(dimension=2, decay=kind)
        theta = dict(TRUTH, decay=[1.5, 0.7] if kind == "row" else 1.5)
    data = ev.simulate(model, theta, 30.0, seed=4, realizations=2)
    times = data.times[0][data.mask[0]]
    grid = torch.cat([torch.linspace(0.0, 31.0, 40, dtype=D64), times[:5], times[-1:] + 1e-9])
    lam = ev.intensity(model, theta, data, grid).numpy()
    assert lam.shape == (2, grid.numel(), 2)
    for r in range(2):
        stamps = _timestamps(data, r)
        if kind == "sums":
            expected = sum(
                _hawkes_brute(stamps, [0.0, 0.0], np.asarray(theta["adjacency"])[..., u], b, grid.tolist())
                for u, b in enumerate(decays)
            ) + np.asarray(theta["baseline"])
        elif kind == "row":  # row i decays at beta_i
            expected = np.stack(
                [
                    _hawkes_brute(stamps, theta["baseline"], theta["adjacency"], b, grid.tolist())[:, i]
                    for i, b in enumerate(theta["decay"])
                ],
                axis=1,
            )
        else:
            expected = _hawkes_brute(stamps, theta["baseline"], theta["adjacency"], 1.5, grid.tolist())
        np.testing.assert_allclose(lam[r], expected, rtol=1e-10, atol=1e-12)


def test_at_the_events_the_intensity_is_the_likelihoods_own_left_limit_ties_included():
    model = ev.hawkes(dimension=2)
    times = [0.5, 1.0, 1.0, 1.0, 2.0, 2.5, 2.5]
    kinds = [0, 1, 0, 1, 0, 1, 1]
    data = ev.from_table(times, kinds, end_time=3.0)
    lam = ev.intensity(model, TRUTH, data, torch.tensor(times, dtype=D64))[0]
    chosen = lam[torch.arange(len(times)), torch.tensor(kinds)]
    run = ev.likelihood.forward(
        model, {k: torch.tensor(v, dtype=D64) for k, v in TRUTH.items()}, ev.prepare(model, data)
    )
    torch.testing.assert_close(torch.log(chosen), run.log_rates[0], rtol=1e-12, atol=1e-12)


def test_the_intensity_of_state_dependent_models_equals_a_python_walk():
    model = ev.order_book()  # additive jumps, closed-form decay: the scan
    theta = {"baseline": [-0.3, 0.2], "weights": [[-0.8], [0.6]], "kappa": 0.7}
    data = ev.simulate(model, theta, 40.0, seed=2, marks=lambda rng, k: [1.0 + rng.integers(3)])
    grid = torch.linspace(0.0, 40.0, 57, dtype=D64)
    lam = ev.intensity(model, theta, data, grid)[0]
    mask = data.mask[0]
    t, k, z = data.times[0][mask].tolist(), data.types[0][mask].tolist(), data.marks[0][mask][:, 0].tolist()
    for a, g in enumerate(grid.tolist()):
        y = sum((1 - 2 * kind) * size * math.exp(-0.7 * (g - s)) for s, kind, size in zip(t, k, z) if s < g)
        expected = torch.nn.functional.softplus(torch.tensor([-0.3 - 0.8 * y, 0.2 + 0.6 * y], dtype=D64))
        torch.testing.assert_close(lam[a], expected, rtol=1e-10, atol=1e-12)

    def rate(theta, y):
        return torch.nn.functional.softplus(theta["b"] + theta["w"] * y)

    def jump(theta, y, kind, z):  # depends on y: the event-by-event walk
        return theta["a"] / (1 + y.abs())

    common = dict(parameters={"b": (1,), "w": (1,), "a": (1,), "kappa": (1,)}, jump=jump, step=0.01)
    closed = ev.intensity_model(rate, decay=lambda theta: theta["kappa"], **common)
    general = ev.intensity_model(rate, drift=lambda theta, y: -theta["kappa"] * y, **common)
    user = {"b": [0.1], "w": [0.8], "a": [0.6], "kappa": [1.3]}
    times = ev.from_table([0.2, 0.9, 0.9, 1.7, 3.0], end_time=4.0)
    grid = torch.linspace(0.0, 4.0, 33, dtype=D64)
    y, last, expected = 0.0, 0.0, []
    walk = [(0.2, 0), (0.9, 0), (0.9, 0), (1.7, 0), (3.0, 0)]
    afters = []
    for s, _ in walk:
        y = y * math.exp(-1.3 * (s - last))
        y, last = y + 0.6 / (1 + abs(y)), s
        afters.append((s, y))
    for g in grid.tolist():
        before = [(s, v) for s, v in afters if s < g]
        state = before[-1][1] * math.exp(-1.3 * (g - before[-1][0])) if before else 0.0
        expected.append(math.log1p(math.exp(0.1 + 0.8 * state)))
    exact = ev.intensity(closed, user, times, grid)[0, :, 0]
    np.testing.assert_allclose(exact.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(ev.intensity(general, user, times, grid)[0, :, 0].numpy(), expected, rtol=1e-8)


def test_the_grid_is_checked():
    model = ev.hawkes()
    data = ev.from_table([1.0, 2.0], end_time=3.0, start_time=0.5)
    with pytest.raises(ValueError, match=r"grid\[0, 0\] = 0.1 is before the window's start 0.5"):
        ev.intensity(model, {"baseline": [1.0], "adjacency": [[0.1]], "decay": 1.0}, data, [0.1, 1.0])
    with pytest.raises(ValueError, match=r"grid must be \(G,\) or \(R, G\)"):
        ev.intensity(model, {"baseline": [1.0], "adjacency": [[0.1]], "decay": 1.0}, data, torch.ones(2, 2, 2))


def test_branching_norms_and_spectral_radius_equal_the_closed_form_and_the_kernels_integral():
    assert torch.equal(ev.branching(ev.hawkes(dimension=2), TRUTH), torch.tensor(TRUTH["adjacency"], dtype=D64))
    row = dict(TRUTH, decay=[1.5, 0.4])
    assert torch.equal(
        ev.branching(ev.hawkes(dimension=2, decay="row"), row), torch.tensor(TRUTH["adjacency"], dtype=D64)
    )
    sums = ev.hawkes(dimension=2, decays=(0.5, 4.0))
    weights = torch.tensor([[[0.3, 0.2], [0.1, 0.1]], [[0.2, 0.1], [0.2, 0.2]]], dtype=D64)
    norms = ev.branching(sums, {"baseline": [0.5, 0.3], "adjacency": weights})
    torch.testing.assert_close(norms, weights.sum(-1), rtol=0, atol=1e-15)
    (a, b), (c, d) = norms.tolist()
    closed = (a + d) / 2 + math.sqrt(((a - d) / 2) ** 2 + b * c)
    assert ev.spectral_radius(sums, {"baseline": [0.5, 0.3], "adjacency": weights}) == pytest.approx(closed, rel=1e-12)
    assert ev.spectral_radius(ev.hawkes(dimension=2), TRUTH) == pytest.approx(0.7, rel=1e-12)
    # the L1 norm is the area under lambda_i - mu_i after one type-j event at 0 (trapezoid on a fine grid)
    grid = torch.linspace(1e-12, 40.0, 400_001, dtype=D64)
    for j in range(2):
        one = ev.from_table([0.0], [j], end_time=40.0, types=2)
        excess = ev.intensity(sums, {"baseline": [0.5, 0.3], "adjacency": weights}, one, grid)[0] - torch.tensor(
            [0.5, 0.3], dtype=D64
        )
        area = torch.trapezoid(excess, grid, dim=0)
        torch.testing.assert_close(area, norms[:, j], rtol=1e-6, atol=0)
    with pytest.raises(TypeError, match="branching needs a model with exponential kernels"):
        ev.branching(ev.order_book(), {})
