"""A fit one can trust: the batch solver says whether it converged, and ``fit`` warns when it did not."""

from __future__ import annotations

import warnings

import pytest
import torch

import fwdtrain as ft

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
