"""A baseline that varies with the time of day and excitation scaled by the marks, each against a brute-force
likelihood (a double sum over events and the compensator by numerical integration), its gradient and Hessian
against finite differences, and fits that recover simulated truth."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from fwdtrain.events import fit, intensity, simulate
from fwdtrain.events.fitting import derivatives
from fwdtrain.events.likelihood import forward, log_likelihood, prepare
from fwdtrain.events.models import hawkes, pack, unpack

KNOTS = (2.0, 5.0)
REFERENCE = 1.3


def _brute(theta, data, knots=(), reference=None):
    """sum_i log lambda_{k_i}(t_i) - int sum_k lambda_k dt, lambda_i(t) = mu_i(piece of t) + sum_{t_m < t}
    g(z_m) sum_u A_i k_m u b_u exp(-b_u (t - t_m)), the integral by 24-point Gauss-Legendre between consecutive
    events and knots."""
    t = {name: np.asarray(value, dtype=float) for name, value in theta.items()}
    k = t["baseline"].shape[0]
    mu = t["baseline"].reshape(k, -1)
    adjacency = t["adjacency"] if t["adjacency"].ndim == 3 else t["adjacency"][..., None]
    decays = t["decays"] if "decays" in t else np.broadcast_to(t["decay"], (adjacency.shape[-1],))
    nodes, weights = np.polynomial.legendre.leggauss(24)

    def rates(s, times, kinds, jumps):  # lambda (len(s), K) from the events strictly before each s
        out = mu[:, np.searchsorted(np.asarray(knots), s, side="right")].T.copy()
        for tm, km, g in zip(times, kinds, jumps, strict=True):
            lag = s - tm
            kernel = (adjacency[:, km, :] * decays * np.exp(-np.outer(np.clip(lag, 0, None), decays))[:, None]).sum(-1)
            out += np.where(lag[:, None] > 0, g * kernel, 0.0)
        return out

    total = 0.0
    for r in range(data.times.shape[0]):
        mask = data.mask[r].numpy()
        times, kinds = data.times[r].numpy()[mask], data.types[r].numpy()[mask]
        sizes = data.marks[r, :, 0].numpy()[mask] if data.marks.shape[-1] else np.ones(len(times))
        jumps = (sizes / reference) ** t["mark_power"] if reference else np.ones(len(times))
        total += np.log(rates(times, times, kinds, jumps)[np.arange(len(times)), kinds]).sum()
        start, end = float(data.start[r]), float(data.end[r])
        edges = np.unique(np.concatenate([[start, end], times, [c for c in knots if start < c < end]]))
        for a, b in itertools.pairwise(edges):
            s = a + (b - a) * (nodes + 1) / 2
            total -= (b - a) / 2 * (weights[:, None] * rates(s, times, kinds, jumps)).sum()
    return total


def _tied(data):
    """The events with times rounded to 0.1: many ties, inside and across chunks."""
    return data._replace(times=torch.round(data.times * 10) / 10)


CASES = {
    "seasonal": (
        {"dimension": 2, "baseline_knots": KNOTS},
        {"baseline": [[0.5, 1.2, 0.3], [0.4, 0.2, 0.9]], "adjacency": [[0.3, 0.1], [0.2, 0.25]], "decay": 1.5},
    ),
    "seasonal, two fitted decays": (
        {"dimension": 2, "decays": (0.5, 4.0), "fit_decays": True, "baseline_knots": KNOTS},
        {
            "baseline": [[0.5, 1.2, 0.3], [0.4, 0.2, 0.9]],
            "adjacency": [[[0.2, 0.1], [0.05, 0.1]], [[0.1, 0.1], [0.2, 0.05]]],
            "decays": [0.7, 3.0],
        },
    ),
    "marked": (
        {"dimension": 2, "mark_scaling": "power", "mark_reference": REFERENCE},
        {"baseline": [0.6, 0.5], "adjacency": [[0.3, 0.1], [0.2, 0.25]], "decay": 1.5, "mark_power": 0.7},
    ),
    "seasonal and marked": (
        {"dimension": 2, "baseline_knots": KNOTS, "mark_scaling": "power", "mark_reference": REFERENCE},
        {
            "baseline": [[0.5, 1.2, 0.3], [0.4, 0.2, 0.9]],
            "adjacency": [[0.3, 0.1], [0.2, 0.25]],
            "decay": 1.5,
            "mark_power": 0.7,
        },
    ),
}


def _sizes(rng, kind):
    return [rng.lognormal(0.0, 0.6)]


def _case(name):
    options, theta = CASES[name]
    model = hawkes(**options)
    theta = {key: torch.tensor(value, dtype=torch.float64) for key, value in theta.items()}
    data = _tied(simulate(model, theta, 20.0, seed=3, realizations=2, marks=_sizes))
    return model, theta, data, options


@pytest.mark.parametrize("name", list(CASES))
def test_the_log_likelihood_equals_a_brute_force_double_sum_and_integral_with_ties_across_chunks(name):
    model, theta, data, options = _case(name)
    assert int(data.mask.sum()) > 40
    assert int(((data.times[:, 1:] == data.times[:, :-1]) & data.mask[:, 1:]).sum()) > 2
    reference = options.get("mark_reference") if "mark_scaling" in options else None
    expected = _brute(theta, data, options.get("baseline_knots", ()), reference)
    prepared = prepare(model, data)
    assert float(log_likelihood(model, theta, prepared)) == pytest.approx(expected, rel=1e-10, abs=1e-9)
    chunked = forward(model, theta, prepared, size=4).log_likelihood  # carries (and ties) across chunks
    assert float(chunked) == pytest.approx(expected, rel=1e-10, abs=1e-9)


@pytest.mark.parametrize("name", ["seasonal, two fitted decays", "seasonal and marked"])
def test_the_gradient_and_hessian_equal_finite_differences(name):
    model, theta, data, _ = _case(name)
    prepared = prepare(model, data)
    u = pack(model, theta)
    gradient, hessian = derivatives(model, prepared, u)  # the jets (seasonal) or torch.func (marked)
    value = lambda w: float(log_likelihood(model, unpack(model, w), prepared))
    h = 1e-5
    eye = torch.eye(u.numel(), dtype=torch.float64)
    numeric = torch.tensor([(value(u + h * e) - value(u - h * e)) / (2 * h) for e in eye], dtype=torch.float64)
    torch.testing.assert_close(gradient, numeric, rtol=1e-6, atol=1e-6)
    columns = [
        (derivatives(model, prepared, u + h * e)[0] - derivatives(model, prepared, u - h * e)[0]) / (2 * h) for e in eye
    ]
    torch.testing.assert_close(hessian, torch.stack(columns, 1), rtol=1e-5, atol=1e-5)


def _recovered(result, truth, sigmas=3.0):
    for name, value in truth.items():
        gap = (result.params[name] - value).abs() / result.stderr[name]
        assert bool((gap < sigmas).all()), (name, result.params[name], value, result.stderr[name])


def test_a_seasonal_fit_recovers_the_simulated_truth_batch_and_online():
    model = hawkes(dimension=2, baseline_knots=(400.0, 800.0))
    truth = {
        "baseline": torch.tensor([[0.3, 0.9, 0.5], [0.6, 0.2, 0.4]], dtype=torch.float64),
        "adjacency": torch.tensor([[0.4, 0.1], [0.15, 0.3]], dtype=torch.float64),
        "decay": torch.tensor(2.0, dtype=torch.float64),
    }
    data = simulate(model, truth, 1200.0, seed=11, realizations=2)  # two days, knots at 400 s and 800 s
    batch = fit(model, data)
    assert batch.converged
    _recovered(batch, truth)
    online = fit(model, data, method="online")
    for name in truth:
        gap = (online.params[name] - batch.params[name]).abs() / batch.stderr[name]
        assert bool((gap < 3).all()), (name, online.params[name], batch.params[name])


def test_a_mark_scaled_fit_recovers_the_simulated_truth_batch_and_online():
    reference = float(np.exp(0.6**2 / 2))  # the mean size
    model = hawkes(dimension=2, mark_scaling="power", mark_reference=reference)
    truth = {
        "baseline": torch.tensor([0.5, 0.4], dtype=torch.float64),
        "adjacency": torch.tensor([[0.4, 0.1], [0.15, 0.3]], dtype=torch.float64),
        "decay": torch.tensor(2.0, dtype=torch.float64),
        "mark_power": torch.tensor(0.8, dtype=torch.float64),
    }
    data = simulate(model, truth, 800.0, seed=5, realizations=2, marks=_sizes)
    batch = fit(model, data)
    assert batch.converged
    _recovered(batch, truth)
    online = fit(model, data, method="online")
    for name in truth:
        gap = (online.params[name] - batch.params[name]).abs() / batch.stderr[name]
        assert bool((gap < 3).all()), (name, online.params[name], batch.params[name])


def test_bad_knots_and_scalings_are_refused_and_a_seasonal_rate_needs_the_time():
    with pytest.raises(ValueError, match="increasing"):
        hawkes(baseline_knots=(3.0, 1.0))
    with pytest.raises(ValueError, match="mark_scaling"):
        hawkes(mark_scaling="log")
    model = hawkes(baseline_knots=(1.0,))
    theta = {"baseline": torch.ones(1, 2), "adjacency": torch.zeros(1, 1), "decay": torch.tensor(1.0)}
    with pytest.raises(ValueError, match="time of day"):
        model.rate(theta, torch.zeros(1))


def test_the_intensity_on_a_grid_follows_the_time_of_day():
    model = hawkes(dimension=1, baseline_knots=(1.0, 2.0))
    theta = {"baseline": [[0.5, 2.0, 1.0]], "adjacency": [[0.5]], "decay": 3.0}
    events = [np.array([0.5])]
    grid = np.array([0.25, 0.75, 1.5, 2.5])
    lam = intensity(model, theta, events, grid, end_time=3.0)[0, :, 0]
    excitation = 0.5 * 3.0 * np.exp(-3.0 * (grid - 0.5)) * (grid > 0.5)
    torch.testing.assert_close(
        lam, torch.tensor([0.5, 0.5, 2.0, 1.0], dtype=torch.float64) + torch.from_numpy(excitation)
    )
