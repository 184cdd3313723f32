"""simulate: the Hawkes loop on floats equals a torch thinning through the model's own rate, jump and bound draw
for draw; the simulated processes pass time rescaling; no model call per candidate where the kernel is known."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import fwdtrain as ft
from fwdtrain.events.data import D64
from fwdtrain.events.models import kernel_rate

pp = ft.events
TRUTH = {"baseline": [0.5, 0.3], "adjacency": [[0.5, 0.2], [0.3, 0.4]], "decay": 1.5}
SEASON = {**TRUTH, "baseline": [[0.5, 0.8, 0.3], [0.3, 0.2, 0.6]]}
MULTI = {"baseline": [0.4, 0.3], "adjacency": np.full((2, 2, 3), 0.12).tolist()}


def _sizes(rng, k):
    return [1.0 + rng.integers(3)]


HAWKES = {
    "shared": (pp.hawkes(dimension=2), TRUTH, None),
    "row": (pp.hawkes(dimension=2, decay="row"), {**TRUTH, "decay": [1.0, 3.0]}, None),
    "three decays": (pp.hawkes(dimension=2, decays=(0.5, 5.0, 50.0)), MULTI, None),
    "fitted decays": (
        pp.hawkes(dimension=2, decays=(1.0, 9.0), fit_decays=True),
        {**MULTI, "adjacency": np.full((2, 2, 2), 0.15).tolist(), "decays": [2.0, 7.0]},
        None,
    ),
    "time of day": (pp.hawkes(dimension=2, baseline_knots=(40.0, 90.0)), SEASON, None),
    "mark scaled": (
        pp.hawkes(dimension=2, mark_scaling="power", mark_reference=2.0),
        {**TRUTH, "mark_power": 0.7},
        _sizes,
    ),
    "one type": (pp.hawkes(), {"baseline": [0.7], "adjacency": [[0.6]], "decay": 2.0}, _sizes),
}


def _reference(model, theta, end, seed, marks=None, window=1.0):
    """Ogata's thinning in torch through the model's own ``bound``, ``rate`` and ``jump``, one candidate at a time,
    the state decayed in closed form; the same draws in the same order as ``simulate``."""
    theta = {name: torch.as_tensor(value, dtype=D64) for name, value in theta.items()}
    rng = np.random.default_rng(seed)
    y, t, out = torch.zeros(model.state_size, dtype=D64), 0.0, []
    decay = model.decay(theta)
    while t < end:
        span = min(window, end - t)
        bound = float(model.bound(theta, y, span).sum())
        wait = rng.exponential(1 / bound)
        y, t = y * torch.exp(-decay * min(wait, span)), t + min(wait, span)
        if wait >= span:
            continue
        rates = kernel_rate(model.kernel, theta, y, torch.tensor(t, dtype=D64))
        assert float(rates.sum()) <= bound * (1 + 1e-12)
        if rng.uniform() * bound >= float(rates.sum()):
            continue
        kind = int(rng.choice(model.type_count, p=(rates / rates.sum()).numpy()))
        mark = torch.as_tensor(np.asarray(marks(rng, kind) if marks else [], dtype=np.float64))
        y = y + model.jump(theta, y, torch.tensor(kind), mark)
        out.append((t, kind, mark.tolist()))
    return out


@pytest.mark.parametrize("name", HAWKES)
def test_the_hawkes_loop_equals_a_torch_thinning_draw_for_draw(name):
    model, theta, marks = HAWKES[name]
    data = pp.simulate(model, theta, 150.0, seed=7, marks=marks)
    expected = _reference(model, theta, 150.0, 7, marks)
    assert data.events == len(expected) > 100
    mask = data.mask[0]
    np.testing.assert_allclose(data.times[0][mask].numpy(), [t for t, _, _ in expected], rtol=1e-12, atol=0)
    assert data.types[0][mask].tolist() == [k for _, k, _ in expected]
    if marks is not None:
        assert data.marks[0][mask].tolist() == [z for _, _, z in expected]


def _counted(model, calls):
    def count(name, function):
        def counted(*args):
            calls[name] = calls.get(name, 0) + 1
            return function(*args)

        return counted

    kernel = model.kernel._replace(
        decays=count("decays", model.kernel.decays),
        weights=count("weights", model.kernel.weights),
        baseline=count("baseline", model.kernel.baseline),
        jump_size=None if model.kernel.jump_size is None else count("jump_size", model.kernel.jump_size),
    )
    return dataclasses.replace(
        model, kernel=kernel, rate=count("rate", model.rate), jump=count("jump", model.jump), bound=None
    )


@pytest.mark.parametrize("name", ["time of day", "mark scaled"])
def test_a_hawkes_simulation_calls_the_model_once_per_realization_not_per_candidate(name):
    model, theta, marks = HAWKES[name]
    calls: dict[str, int] = {}
    data = pp.simulate(_counted(model, calls), theta, 150.0, seed=7, marks=marks, realizations=3)
    assert data.events > 300
    per_event = {"jump_size": data.events} if marks is not None else {}
    assert calls == {"decays": 3, "weights": 3, "baseline": 3, **per_event}


def _residuals_pass(model, theta, data):
    good = pp.goodness(model, theta, data)
    assert min(len(r) for r in good.residuals) > 1_000
    assert min(good.pvalue) > 0.01, good.ks


@pytest.mark.parametrize("name", ["shared", "three decays", "time of day", "mark scaled"])
def test_a_long_hawkes_simulation_passes_time_rescaling(name):
    model, theta, marks = HAWKES[name]
    data = pp.simulate(model, theta, 1_400.0, seed=3, marks=marks)
    _residuals_pass(model, theta, data)


SATURATING = {"mu": 0.5, "alpha": 0.8, "kappa": 1.2, "cap": 2.0}


def _saturating(calls, bounded):
    def rate(theta, y):
        calls["rate"] += 1
        return (theta["mu"] + y).reshape(1)

    return pp.intensity_model(
        rate,
        parameters={name: pp.Parameter((), positive=True) for name in SATURATING},
        decay=lambda theta: theta["kappa"].reshape(1),
        jump=lambda theta, y, k, z: theta["alpha"] / (1 + y / theta["cap"]),
        bound=(lambda theta, y, horizon: (theta["mu"] + y + theta["alpha"]).reshape(1)) if bounded else None,
    )


@pytest.mark.parametrize("bounded", [True, False])
def test_a_state_dependent_simulation_passes_time_rescaling_with_one_rate_call_per_candidate(bounded):
    """Without a bound, the grid (17 states, one batched call) is drawn once per window and after each event."""
    calls = {"rate": 0}
    model = _saturating(calls, bounded)
    data = pp.simulate(model, SATURATING, 2_000.0, seed=5)
    events, candidates = data.events, calls["rate"]
    theta = {name: torch.tensor(value, dtype=D64) for name, value in SATURATING.items()}
    _residuals_pass(model, theta, data)
    assert candidates < 3 * events + (0 if bounded else 2_000), (candidates, events)


def test_simulate_is_reproducible_from_its_seed():
    model, theta, marks = HAWKES["mark scaled"]
    one, again = (pp.simulate(model, theta, 50.0, seed=4, realizations=2, marks=marks) for _ in range(2))
    other = pp.simulate(model, theta, 50.0, seed=5, realizations=2, marks=marks)
    assert torch.equal(one.times, again.times) and torch.equal(one.marks, again.marks)
    assert one.times.shape != other.times.shape or not torch.equal(one.times, other.times)


def test_a_bound_that_does_not_hold_stops_the_simulation():
    calls = {"rate": 0}
    model = dataclasses.replace(
        _saturating(calls, True), bound=lambda theta, y, horizon: (0.5 * theta["mu"]).reshape(1)
    )
    with pytest.raises(RuntimeError, match="exceeds its bound"):
        pp.simulate(model, SATURATING, 100.0, seed=1)
