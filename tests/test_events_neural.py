"""The neural intensity: its exact log-likelihood's gradient against central finite differences, the vectorised
engine (counted), a batch fit against the true Hawkes model on held-out events, an online pass, and the rate
function under torch.func's grad and vmap."""

import warnings

import numpy as np
import pytest
import torch
from torch.func import grad, vmap

from fwdtrain import pointprocess as pp
from fwdtrain.events import likelihood
from fwdtrain.events.neural import neural_intensity

TRUTH = {"baseline": [0.5, 0.3], "adjacency": [[0.5, 0.2], [0.3, 0.4]], "decay": 1.5}


def _marked(seed=0, n=300, end=150.0):
    rng = np.random.default_rng(seed)
    times = np.sort(rng.uniform(0, end, n))
    times[10] = times[9]  # a tie: the second event sees the state before the first's jump
    return pp.from_table(times, rng.integers(0, 2, n), rng.lognormal(0, 1, n), end_time=end)


def test_the_log_likelihoods_gradient_equals_central_finite_differences():
    data = _marked()
    model = neural_intensity(2, decays=(0.5, 3.0), hidden=4, marks=1, seed=3)
    prepared = likelihood.prepare(model, data)
    u = pp.pack(model, model.start(data))
    u = u + 0.3 * torch.randn(u.shape, generator=torch.Generator().manual_seed(1), dtype=u.dtype)
    f = lambda w: pp.log_likelihood(model, pp.unpack(model, w), prepared)
    exact = grad(f)(u)
    h = 1e-5
    directions = torch.eye(u.numel(), dtype=u.dtype)[:: max(1, u.numel() // 8)]
    directions = torch.cat([directions, torch.randn(3, u.numel(), generator=torch.Generator().manual_seed(2))])
    for v in directions.to(u.dtype):
        central = (f(u + h * v) - f(u - h * v)) / (2 * h)
        assert float(exact @ v) == pytest.approx(float(central), rel=1e-6, abs=1e-6)


def test_the_marks_move_the_state_and_too_few_marks_are_refused_before_any_work():
    data = _marked()
    with_marks, without = neural_intensity(2, marks=1), neural_intensity(2)
    theta = with_marks.start(data)
    assert with_marks.state_size == 2 * without.state_size == 12
    z = torch.tensor([5.0], dtype=torch.float64)
    jump = with_marks.jump(theta, torch.zeros(12, dtype=torch.float64), torch.tensor(1), z).reshape(3, 2, 2)
    assert bool((jump[:, 1] == torch.tensor([1.0, 5.0], dtype=torch.float64)).all())
    assert bool((jump[:, 0] == 0).all())
    plain = pp.from_table(np.sort(np.random.default_rng(0).uniform(0, 10, 20)), end_time=10.0)
    with pytest.raises(ValueError, match="marks=1"):
        pp.fit(neural_intensity(1, marks=1), plain)
    with pytest.raises(ValueError, match="decays"):
        neural_intensity(2, decays=(1.0, -1.0))


def test_the_start_puts_each_intensity_near_its_types_mean_rate():
    data = _marked(n=400)
    model = neural_intensity(2, hidden=16, seed=7)
    theta = model.start(data)
    mean = data.counts().sum(0) / 150.0
    state = torch.rand(model.state_size, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for y in (torch.zeros(model.state_size, dtype=torch.float64), state):
        assert torch.allclose(model.rate(theta, y), mean, rtol=0.25)


def test_the_model_takes_the_vectorised_engine(engine_calls):
    calls = engine_calls
    data = _marked()
    model = neural_intensity(2, marks=1)
    assert isinstance(model, pp.AdditiveModel)
    scanned = pp.log_likelihood(model, model.start(data), data)
    assert calls == {"exponential": 0, "additive": 1, "general": 0}  # one chunk: every event at once
    looped = pp.log_likelihood(model.general(), model.start(data), data)
    assert float(scanned) == pytest.approx(float(looped), rel=1e-10)


@pytest.fixture(scope="module")
def hawkes_days():
    truth = pp.hawkes(2)
    return truth, pp.simulate(truth, TRUTH, 600.0, seed=1), pp.simulate(truth, TRUTH, 600.0, seed=2)


def test_a_batch_fit_beats_its_start_and_nears_the_true_hawkes_model_on_held_out_events(hawkes_days):
    truth, train, test = hawkes_days
    model = neural_intensity(2, decays=(0.5, 2.0), hidden=2)
    start = model.start(train)
    with warnings.catch_warnings():  # 100 L-BFGS iterations stop short of the tolerance, and fit says so
        warnings.simplefilter("ignore", RuntimeWarning)
        fitted = pp.fit(model, train, solver="lbfgs", iterations=100)
    assert fitted.log_likelihood > float(pp.log_likelihood(model, start, train)) + 300
    # an MLE of p parameters falls short of the truth on new events by about p / 2 (AIC's optimism): allow p
    p = pp.pack(model, start).numel()
    held_out = float(pp.log_likelihood(model, fitted.params, test))
    assert held_out > float(pp.log_likelihood(truth, TRUTH, test)) - p


def test_an_online_pass_runs_and_ends_with_a_finite_log_likelihood(hawkes_days):
    _, train, test = hawkes_days
    model = neural_intensity(2, decays=(0.3, 1.5, 6.0), hidden=4)
    fitted = pp.fit(model, train, method="online")
    assert fitted.method == "online" and fitted.iterations > 10
    assert np.isfinite(fitted.log_likelihood)
    assert all(bool(torch.isfinite(v).all()) for v in fitted.params.values())
    assert np.isfinite(float(pp.log_likelihood(model, fitted.params, test)))


def test_the_rate_function_is_transformable_by_grad_and_vmap():
    model = neural_intensity(2, hidden=6, marks=1)
    theta = model.start(_marked())
    states = torch.rand(5, model.state_size, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    batched = vmap(model.rate, in_dims=(None, 0))(theta, states)
    assert torch.allclose(batched, torch.stack([model.rate(theta, y) for y in states]), rtol=1e-14)
    total = lambda t, y: model.rate(t, y).sum()
    by_theta = grad(total)(theta, states[0])
    by_state = vmap(grad(total, argnums=1), in_dims=(None, 0))(theta, states)
    h = 1e-6
    v = torch.randn(model.state_size, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    central = (total(theta, states[0] + h * v) - total(theta, states[0] - h * v)) / (2 * h)
    assert float(by_state[0] @ v) == pytest.approx(float(central), rel=1e-7)
    shifted = {**theta, "bias1": theta["bias1"] + h}
    lowered = {**theta, "bias1": theta["bias1"] - h}
    central = (total(shifted, states[0]) - total(lowered, states[0])) / (2 * h)
    assert float(by_theta["bias1"].sum()) == pytest.approx(float(central), rel=1e-7)


def test_the_bound_holds_at_any_state_and_simulate_draws_from_the_model():
    model = neural_intensity(2, hidden=5, seed=2)
    theta = model.start(_marked())
    theta = {name: value + 0.5 for name, value in theta.items()}
    states = 10 * torch.rand(50, model.state_size, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    bound = model.bound(theta, states[0], 1.0)
    assert bool((vmap(model.rate, in_dims=(None, 0))(theta, states) <= bound).all())
    drawn = pp.simulate(model, theta, 50.0, seed=3)
    assert drawn.events > 20 and set(drawn.types[drawn.mask].tolist()) == {0, 1}
