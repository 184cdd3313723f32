"""The exponential-kernel fit through the likelihood's linearity (``events.linear``): its sums against a plain loop,
its estimates, standard errors and log L against the generic exact engine (Newton on one torch.func pass per
iteration), and its passes over the events counted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fwdtrain as ft
from fwdtrain.events import expsums, fitting, likelihood, linear, models
from fwdtrain.events.newton import projected_newton

D64 = torch.float64
pp = ft.pointprocess
TRUTH = {"baseline": [0.5, 0.3], "adjacency": [[0.4, 0.2], [0.3, 0.3]], "decay": 1.5}


def test_the_strict_sums_equal_a_loop_with_ties_and_padding():
    generator = np.random.default_rng(0)
    days = [[np.sort(np.round(generator.uniform(0, 10, size), 1)) for _ in range(3)] for size in (14, 8)]  # ties
    data = pp.from_tick(days, end_time=12.0)
    decays = torch.tensor([0.7, 5.0], dtype=D64)
    sums, at_end = expsums.strict_sums(decays, data.times, data.types, data.mask, data.end, 3)
    for r in range(2):
        times = data.times[r][data.mask[r]].numpy()
        types = data.types[r][data.mask[r]].numpy()
        for i, t in enumerate(times):
            for j in range(3):
                earlier = times[(times < t) & (types == j)]
                expected = np.exp(-decays.numpy()[:, None] * (t - earlier)).sum(1)
                assert np.allclose(sums[r, i, :, j].numpy(), expected, rtol=1e-13, atol=1e-15)
        for j in range(3):
            expected = np.exp(-decays.numpy()[:, None] * (12.0 - times[types == j])).sum(1)
            assert np.allclose(at_end[r, :, j].numpy(), expected, rtol=1e-13, atol=1e-15)


def _generic(model, data):
    """The generic exact engine: projected Newton on log L and its torch.func derivatives, one pass each."""
    prepared = likelihood.prepare(model, data)
    u = models.pack(model, model.start(prepared.data))
    scale = float(data.events)
    objective = lambda w: likelihood.forward(model, models.unpack(model, w), prepared).log_likelihood / scale
    derivatives = lambda w: tuple(d / scale for d in fitting.derivatives(model, prepared, w))
    found = projected_newton(objective, derivatives, u, linear.mask(model, "nonnegative"))
    return fitting._finish(model, prepared, found.x, "batch", found, {}, lambda tensor: tensor)


TWO_SCALES = {"baseline": [0.5, 0.3], "adjacency": [[[0.3, 0.2], [0.1, 0.1]], [[0.1, 0.2], [0.2, 0.1]]]}


def _ties_and_days(scales: bool = False):
    """Two days of a 2-D Hawkes process (one decay, or decays (0.5, 4.0)), times rounded to 0.1: ties."""
    model = pp.hawkes(dimension=2, decays=(0.5, 4.0)) if scales else pp.hawkes(dimension=2)
    days = []
    for seed in (3, 4):
        day = pp.simulate(model, TWO_SCALES if scales else TRUTH, 150.0, seed=seed)
        times, types = day.times[0][day.mask[0]].numpy(), day.types[0][day.mask[0]].numpy()
        days.append([np.round(times[types == k], 1) for k in range(2)])  # rounded: ties
    return pp.from_tick(days, end_time=150.0)


MODELS = {
    "shared": lambda: pp.hawkes(dimension=2),
    "row": lambda: pp.hawkes(dimension=2, decay="row"),
    "fixed sums": lambda: pp.hawkes(dimension=2, decays=(0.5, 4.0)),
    "fitted sums": lambda: pp.hawkes(dimension=2, decays=(0.7, 3.0), fit_decays=True),
    "seasonal": lambda: pp.hawkes(dimension=2, baseline_knots=(50.0, 100.0)),
}


@pytest.mark.parametrize("kind", list(MODELS))
def test_the_fit_equals_the_generic_exact_engine(kind):
    model = MODELS[kind]()
    data = _ties_and_days(scales="sums" in kind)
    mine = pp.fit(model, data)
    theirs = _generic(model, data)
    assert mine.converged and theirs.converged
    for name in model.parameters:
        assert torch.allclose(mine.params[name], theirs.params[name], rtol=1e-8, atol=1e-10), name
        assert torch.equal(mine.at_bound[name], theirs.at_bound[name]), name
        finite = ~mine.at_bound[name]
        assert torch.allclose(mine.stderr[name][finite], theirs.stderr[name][finite], rtol=1e-6), name
    assert mine.log_likelihood == pytest.approx(theirs.log_likelihood, rel=1e-12)
    assert torch.allclose(mine.information, theirs.information, rtol=1e-6, atol=1e-8)


def _counted(monkeypatch, module, name):
    calls = {"n": 0}
    original = getattr(module, name)

    def counting(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def test_fixed_decays_take_one_pass_over_the_events(monkeypatch):
    sums = _counted(monkeypatch, linear, "strict_sums")
    jets = _counted(monkeypatch, linear, "kernel_jets")
    passes = _counted(monkeypatch, likelihood, "forward")
    result = pp.fit(pp.hawkes(dimension=2, decays=(0.5, 4.0)), _ties_and_days())
    assert result.converged and result.iterations > 2
    assert (sums["n"], jets["n"], passes["n"]) == (1, 0, 0)


def test_fitted_decays_take_one_jets_pass_per_profile_point(monkeypatch):
    jets = _counted(monkeypatch, linear, "kernel_jets")
    passes = _counted(monkeypatch, likelihood, "forward")
    result = pp.fit(pp.hawkes(dimension=2), _ties_and_days())
    assert result.converged
    assert passes["n"] == 0
    assert result.iterations <= jets["n"] <= result.iterations + 3  # at most a few rejected trial decays


def test_a_mark_scaled_model_takes_the_generic_engine(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a mark-scaled kernel is not linear in its parameters")

    monkeypatch.setattr(linear, "fit", refuse)
    data = _ties_and_days()
    data = data._replace(marks=torch.ones((*data.times.shape, 1), dtype=D64))
    with pytest.warns(RuntimeWarning, match="did not converge"):  # three iterations: enough to see the route
        result = pp.fit(pp.hawkes(dimension=2, mark_scaling="power"), data, iterations=3)
    assert result.method == "batch"
