"""Sum-of-exponential kernels with fitted decays against an exact MLE written here: the log-likelihood of a 1-D
Hawkes process with phi(t) = sum_u a_u b_u exp(-b_u t) by brute-force pairwise sums (numpy), its analytic
gradient, maximised by scipy's L-BFGS-B."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fwdtrain as ft

minimize = pytest.importorskip("scipy.optimize").minimize
pp = ft.pointprocess
TRUTH = {"baseline": [0.5], "adjacency": [[[0.3, 0.3]]], "decays": [1.0, 20.0]}


def _negative_log_likelihood(x, times, end):
    """-log L and its gradient in x = (mu, a_1, a_2, b_1, b_2), by pairwise sums over m < i."""
    mu, a, b = x[0], x[1:3], x[3:5]
    lags = times[:, None] - times[None, :]
    earlier = np.tril(np.ones_like(lags, dtype=bool), -1)
    value, gradient = mu * end, np.zeros(5)
    gradient[0] = end
    rates = np.full(times.size, mu)
    d_rates = np.zeros((times.size, 5))
    d_rates[:, 0] = 1.0
    for u in range(2):
        fades = np.where(earlier, np.exp(-b[u] * np.where(earlier, lags, 0.0)), 0.0)
        sums, slopes = fades.sum(1), -(fades * np.where(earlier, lags, 0.0)).sum(1)
        rates = rates + a[u] * b[u] * sums
        d_rates[:, 1 + u] = b[u] * sums
        d_rates[:, 3 + u] = a[u] * (sums + b[u] * slopes)
        remaining = end - times
        tails = np.exp(-b[u] * remaining)
        value += a[u] * (1 - tails).sum()
        gradient[1 + u] += (1 - tails).sum()
        gradient[3 + u] += a[u] * (remaining * tails).sum()
    value -= np.log(rates).sum()
    gradient -= (d_rates / rates[:, None]).sum(0)
    return value / times.size, gradient / times.size


def test_fitted_decays_equal_an_exact_scipy_mle():
    model = pp.hawkes(dimension=1, decays=(1.0, 20.0), fit_decays=True)
    assert set(model.parameters) == {"baseline", "adjacency", "decays"}
    data = pp.simulate(model, TRUTH, 1_200.0, seed=3)
    assert 1_000 < data.events < 2_500
    times = data.times[data.mask].numpy()
    start = {"baseline": [0.4], "adjacency": [[[0.2, 0.2]]], "decays": [0.7, 10.0]}
    result = pp.fit(model, data, start=start)
    x0 = np.array([0.4, 0.2, 0.2, 0.7, 10.0])
    options = {"ftol": 1e-16, "gtol": 1e-12, "maxiter": 5_000, "maxcor": 30}
    bounds = [(1e-8, None)] * 5
    reference = minimize(
        _negative_log_likelihood, x0, args=(times, 1_200.0), jac=True, method="L-BFGS-B", bounds=bounds, options=options
    ).x
    mine = np.concatenate([result.params[name].reshape(-1).numpy() for name in ("baseline", "adjacency", "decays")])
    np.testing.assert_allclose(mine, reference, rtol=1e-4)
    assert result.log_likelihood == pytest.approx(-_negative_log_likelihood(reference, times, 1_200.0)[0] * times.size)
    assert bool(torch.isfinite(result.stderr["decays"]).all())


def test_fixed_decays_stay_available_and_fit_decays_needs_them():
    fixed = pp.hawkes(dimension=2, decays=(1.0, 10.0))
    assert set(fixed.parameters) == {"baseline", "adjacency"}
    with pytest.raises(ValueError, match=r"needs the starting decays"):
        pp.hawkes(dimension=2, fit_decays=True)
