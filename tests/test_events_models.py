"""One class per model kind: what each option of ``intensity_model`` builds, which engine a model takes (counted),
the refusal of a jump declared additive that depends on y, and the 0.5 names kept for one release."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import fwdtrain as ft
from fwdtrain.events import likelihood
from fwdtrain.events.models import AdditiveModel, EventModel, ExponentialHawkes, GeneralModel

pp = ft.pointprocess
D64 = torch.float64


def _rate(theta, y):
    return torch.nn.functional.softplus(theta["b"] + theta["w"] * y.sum())


PARAMETERS = {"b": (2,), "w": (2,), "k": pp.Parameter((), positive=True)}
BASE = {"parameters": PARAMETERS, "type_count": 2, "state_size": 1}
THETA = {name: torch.tensor(value, dtype=D64) for name, value in {"b": [0.2, -0.1], "w": [-0.5, 0.4], "k": 0.8}.items()}


def _decay(theta):
    return theta["k"].reshape(1)


def _drift(theta, y):
    return -theta["k"] * y


def _side(theta, y, k, z):
    return (1 - 2 * k).to(D64).reshape(1)


def _bound(theta, y, horizon):
    return torch.full((2,), 5.0, dtype=D64)


START = {"b": [0.0, 0.0], "w": [0.0, 0.0], "k": 2.0}


@pytest.mark.parametrize(
    ("option", "check"),
    [
        ({"type_count": 3}, lambda m: m.type_count == 3),
        ({"state_size": 2}, lambda m: m.state_size == 2),
        ({"drift": _drift}, lambda m: isinstance(m, GeneralModel) and m.drift is _drift),
        ({"decay": _decay}, lambda m: isinstance(m, GeneralModel) and m.decay is _decay),
        ({"jump": _side}, lambda m: m.jump is _side),
        ({"start": START}, lambda m: float(m.start(None)["k"]) == 2.0),
        ({"step": 0.5}, lambda m: m.step == 0.5),
        ({"bound": _bound}, lambda m: m.bound is _bound),
        ({"decay": _decay, "additive": True}, lambda m: isinstance(m, AdditiveModel) and m.decay is _decay),
    ],
)
def test_each_option_of_intensity_model_reaches_the_model(option, check):
    plain = pp.intensity_model(_rate, **BASE)
    model = pp.intensity_model(_rate, **{**BASE, **option})
    assert check(model) and not check(plain)


def test_each_kind_takes_its_engine_and_a_user_model_with_additive_true_is_scanned(engine_calls):
    calls = engine_calls
    additive = pp.intensity_model(_rate, **BASE, decay=_decay, jump=_side, bound=_bound, additive=True)
    data = pp.simulate(additive, THETA, 200.0, seed=1)
    assert data.events > 100
    scanned = pp.log_likelihood(additive, THETA, likelihood.prepare(additive, data))
    assert calls == {"exponential": 0, "additive": 1, "general": 0}  # one chunk: every event at once
    general = pp.intensity_model(_rate, **BASE, decay=_decay, jump=_side)
    looped = pp.log_likelihood(general, THETA, likelihood.prepare(general, data))
    assert calls["general"] == 1 and calls["additive"] == 1
    assert float(scanned) == pytest.approx(float(looped), rel=1e-12)
    hawkes = pp.hawkes(dimension=2)
    pp.log_likelihood(hawkes, hawkes.start(data), likelihood.prepare(hawkes, data))
    assert calls == {"exponential": 1, "additive": 1, "general": 1}


def test_a_jump_declared_additive_that_depends_on_y_is_refused_before_any_work():
    seen = []

    def rate(theta, y):
        seen.append(1)
        return _rate(theta, y)

    def lying(theta, y, k, z):
        return -0.5 * y + 1.0

    model = pp.intensity_model(rate, **BASE, decay=_decay, jump=lying, additive=True, start=THETA)
    data = pp.from_tick([np.array([1.0, 2.0]), np.array([1.5])], end_time=3.0)
    message = r"declares additive=True .* at k = 0 the jump is \[1.0\] at y = \[0.0\] and \[0.815\] .* drop additive"
    with pytest.raises(ValueError, match=message):
        pp.fit(model, data)
    with pytest.raises(ValueError, match="declares additive=True"):
        pp.simulate(model, THETA, 10.0)
    assert seen == []
    honest = pp.intensity_model(rate, **BASE, decay=_decay, jump=lying, start=THETA)  # not additive: accepted
    assert isinstance(honest, GeneralModel)
    pp.log_likelihood(honest, THETA, likelihood.prepare(honest, data))


def test_impossible_combinations_cannot_be_built():
    with pytest.raises(TypeError, match="EventModel is abstract"):
        EventModel(type_count=1, state_size=1, rate=_rate, jump=_side, parameters={}, start=dict)
    with pytest.raises(ValueError, match="not both"):
        pp.intensity_model(_rate, **BASE, decay=_decay, drift=_drift)
    with pytest.raises(ValueError, match="additive=True needs the closed-form flow"):
        pp.intensity_model(_rate, **BASE, drift=_drift, additive=True)
    with pytest.raises(TypeError):
        AdditiveModel(  # an additive model has no drift
            type_count=1, state_size=1, rate=_rate, jump=_side, parameters={}, start=dict, decay=_decay, drift=_drift
        )
    with pytest.raises(TypeError):
        pp.intensity_model(_rate, PARAMETERS)  # keywords only
    model = pp.hawkes(dimension=2)
    assert isinstance(model, ExponentialHawkes) and model.type_count == 2 and model.state_size == 2
    assert pp.hawkes(dimension=2, decays=(1.0, 10.0, 100.0)).state_size == 6
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.type_count = 3  # type: ignore[misc]


def test_the_05_names_warn_and_still_work():
    model = pp.hawkes(dimension=3)
    with pytest.warns(DeprecationWarning, match="type_count"):
        assert model.types == 3
    with pytest.warns(DeprecationWarning, match="state_size"):
        assert model.dimension == 3
    with pytest.warns(DeprecationWarning, match="type_count"), pytest.warns(DeprecationWarning, match="state_size"):
        old = pp.intensity_model(_rate, parameters=PARAMETERS, types=2, dimension=1)
    assert old.type_count == 2 and old.state_size == 1
    with pytest.raises(TypeError, match=r"unknown options \['kinds'\]"):
        pp.intensity_model(_rate, parameters=PARAMETERS, kinds=2)


def test_simulate_flows_a_drift_as_the_likelihood_does():
    decaying = pp.intensity_model(_rate, **BASE, decay=_decay, jump=_side, bound=_bound)
    drifting = pp.intensity_model(_rate, **BASE, drift=_drift, jump=_side, bound=_bound, step=0.01)
    exact = pp.simulate(decaying, THETA, 50.0, seed=4)
    integrated = pp.simulate(drifting, THETA, 50.0, seed=4)
    assert exact.events > 20
    torch.testing.assert_close(integrated.times, exact.times, rtol=1e-9, atol=1e-9)
    assert torch.equal(integrated.types, exact.types)
