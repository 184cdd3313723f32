"""A fit one can trust: the batch solver says whether it converged, and ``fit`` warns when it did not."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import fwdtrain as ft

minimize = pytest.importorskip("scipy.optimize").minimize
pp = ft.pointprocess
D64 = torch.float64
TRUTH = {"baseline": [0.5, 0.3], "adjacency": [[0.5, 0.2], [0.3, 0.4]], "decay": 1.5}


def _ours(caught):
    return [str(w.message) for w in caught if str(w.message).startswith("fwdtrain")]


@pytest.fixture(scope="module")
def events():
    return pp.simulate(pp.hawkes(dimension=2), TRUTH, 300.0, seed=3)


def test_a_fit_that_stops_early_says_so_and_warns_once(events):
    with pytest.warns(RuntimeWarning, match=r"did not converge: iteration limit \(2\) reached") as caught:
        result = pp.fit(pp.hawkes(dimension=2), events, iterations=2)
    assert len(_ours(caught)) == 1
    assert not result.converged and result.iterations == 2 and "iteration limit" in result.reason


def test_a_normal_fit_converges_without_warnings(events):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = pp.fit(pp.hawkes(dimension=2), events)
    assert _ours(caught) == []
    assert result.converged and result.reason == "converged" and 2 < result.iterations < 30


def test_nan_standard_errors_are_warned_about():
    # one event of type 0 and none of type 1: the information about type 1's parameters is singular
    data = pp.from_table([0.5], [0], types=2, end_time=1.0)
    with pytest.warns(RuntimeWarning, match=r"NaN standard errors"):
        pp.fit(pp.hawkes(dimension=2), data, iterations=3)


def test_newton_stops_when_no_step_ascends():
    objective = lambda x: -(x**2).sum() - 10 * x.sum()
    lying = lambda x: (torch.ones_like(x), -torch.eye(x.numel(), dtype=x.dtype))  # a gradient that is wrong
    result = ft.events.newton.projected_newton(objective, lying, torch.zeros(2, dtype=D64), torch.zeros(2, dtype=bool))
    assert not result.converged and "damping past 1e12" in result.reason


DECAYS = (1.0, 10.0, 100.0)  # the data's kernel has no 100: its weights' MLE is 0 or near it
SPARSE = {
    "baseline": [0.4, 0.3],
    "adjacency": [[[0.3, 0.2, 0.0], [0.0, 0.0, 0.0]], [[0.2, 0.1, 0.0], [0.25, 0.2, 0.0]]],  # (K, K, U)
}


def _features(data, decays):
    """x_i = (one-hot of k_i, b_u S_uj(t_i-) at the events), and the compensator's coefficients: log L is
    sum_i log(mu_{k_i} + sum_{u j} alpha_{k_i j u} b_u S_uj(t_i-)) - T sum mu - sum_{i j u} alpha_iju C_ju,
    C_ju = sum over type-j events of 1 - exp(-b_u (T - t_m)), by a loop over the events."""
    times = data.times[0][data.mask[0]].numpy()
    kinds = data.types[0][data.mask[0]].numpy()
    end, b = float(data.end[0]), np.asarray(decays)
    sums, previous = np.zeros((b.size, 2)), 0.0
    out = np.zeros((times.size, 2, b.size))
    for i, (t, k) in enumerate(zip(times, kinds)):
        sums = sums * np.exp(-b * (t - previous))[:, None]
        out[i] = (b[:, None] * sums).T
        sums[:, k] += 1.0
        previous = t
    tails = np.stack([np.stack([(1 - np.exp(-bu * (end - times[kinds == j]))).sum() for j in range(2)]) for bu in b])
    return kinds, out, tails.T, end  # features (n, j, U), tails (j, U)


def _scipy_mle(data, decays):
    """The MLE by scipy's L-BFGS-B on the exact log L above: baseline >= 1e-10, adjacency >= 0."""
    kinds, features, tails, end = _features(data, decays)
    n, u = kinds.size, len(decays)

    def objective(x):
        mu, alpha = x[:2], x[2:].reshape(2, 2, u)
        rates = mu[kinds] + np.einsum("nju,nju->n", alpha[kinds], features)
        value = np.log(rates).sum() - end * mu.sum() - (alpha * tails[None]).sum()
        g_mu = np.bincount(kinds, 1 / rates, minlength=2) - end
        g_alpha = np.zeros((2, 2, u))
        np.add.at(g_alpha, kinds, features / rates[:, None, None])
        return -value / n, -np.concatenate([g_mu, (g_alpha - tails[None]).reshape(-1)]) / n

    start = np.concatenate([[0.5, 0.5], np.full(4 * u, 0.1)])
    bounds = [(1e-10, None)] * 2 + [(0.0, None)] * (4 * u)
    options = {"ftol": 1e-16, "gtol": 1e-13, "maxiter": 20_000, "maxcor": 30}
    return minimize(objective, start, jac=True, method="L-BFGS-B", bounds=bounds, options=options)


@pytest.mark.parametrize("decays", [DECAYS, (0.1, 1.0, 10.0, 100.0, 1000.0)])
def test_weights_whose_mle_is_0_are_reached_in_a_few_iterations_and_equal_scipys_bounded_mle(decays):
    # in log space (0.5) Newton ran to its 100-iteration limit on both, walking these weights towards -infinity
    data = pp.simulate(pp.hawkes(dimension=2, decays=DECAYS), SPARSE, 1_500.0, seed=11)
    assert 2_000 < data.events < 5_000
    result = pp.fit(pp.hawkes(dimension=2, decays=decays), data)
    reference = _scipy_mle(data, decays)
    assert reference.success, reference.message
    estimate = np.concatenate([result.params["baseline"].numpy(), result.params["adjacency"].numpy().reshape(-1)])
    np.testing.assert_allclose(estimate, reference.x, rtol=1e-6, atol=1e-7)
    assert result.converged and result.iterations <= 15, (result.iterations, result.reason)
    zero = reference.x[2:].reshape(2, 2, len(decays)) == 0
    assert zero.sum() >= 3 and bool((result.at_bound["adjacency"].numpy() == zero).all())
    assert bool((result.params["adjacency"][result.at_bound["adjacency"]] == 0).all())
    assert bool(result.stderr["adjacency"][result.at_bound["adjacency"]].isnan().all())
    assert bool(result.stderr["adjacency"][~result.at_bound["adjacency"]].isfinite().all())
