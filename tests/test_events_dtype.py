"""The events' dtype and device carry through: float32 events give float32 log-likelihoods, fits and intensities
that agree with float64 to float32's precision, no operation makes a float64 tensor on the way, and parameters of
another dtype or device are refused with the fix in the message."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import fwdtrain as ft
from fwdtrain.events.neural import neural_intensity

pp = ft.events
F32, F64 = torch.float32, torch.float64
TRUTH = {"baseline": [0.5, 0.3], "adjacency": [[0.5, 0.2], [0.3, 0.4]], "decay": 1.5}
SATURATING = {"mu": 0.5, "alpha": 0.8, "kappa": 1.2, "cap": 2.0}


def _sizes(rng, k):
    return [1.0 + rng.integers(3)]


def _saturating():
    return pp.intensity_model(
        lambda theta, y: (theta["mu"] + y).reshape(1),
        parameters={name: pp.Parameter((), positive=True) for name in SATURATING},
        decay=lambda theta: theta["kappa"].reshape(1),
        jump=lambda theta, y, k, z: theta["alpha"] / (1 + y / theta["cap"]),
        bound=lambda theta, y, horizon: (theta["mu"] + y + theta["alpha"]).reshape(1),
    )


MODELS = {
    "hawkes": (pp.hawkes(dimension=2), TRUTH, None),
    "fitted decays": (
        pp.hawkes(dimension=2, decays=(1.0, 10.0), fit_decays=True),
        {"baseline": [0.5, 0.3], "adjacency": np.full((2, 2, 2), 0.15).tolist(), "decays": [1.0, 10.0]},
        None,
    ),
    "row": (pp.hawkes(dimension=2, decay="row"), {**TRUTH, "decay": [1.0, 2.0]}, None),
    "time of day": (
        pp.hawkes(dimension=2, baseline_knots=(60.0,)),
        {**TRUTH, "baseline": [[0.5, 0.8], [0.3, 0.2]]},
        None,
    ),
    "mark scaled": (
        pp.hawkes(dimension=2, mark_scaling="power", mark_reference=2.0),
        {**TRUTH, "mark_power": 0.5},
        _sizes,
    ),
    "order book": (pp.order_book(), {"baseline": [0.1, 0.2], "weights": [[0.5], [-0.5]], "kappa": 1.0}, _sizes),
    "state-dependent": (_saturating(), SATURATING, None),
}


class _Float64Outputs(TorchDispatchMode):
    """Counts the operations whose output holds a float64 tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.dtype == F64 for t in tree_flatten(out)[0]):
            self.seen.append(str(func))
        return out


def _drawn(name, end=120.0):
    model, theta, marks = MODELS[name]
    return model, theta, pp.simulate(model, theta, end, seed=1, marks=marks)


def test_events_move_to_a_dtype_and_keep_their_labels():
    _, _, data = _drawn("mark scaled", 20.0)
    single = data.to(dtype=F32)
    assert single.dtype == F32 and single.device == data.device
    assert all(t.dtype == F32 for t in (single.times, single.marks, single.start, single.end))
    assert single.types.dtype == torch.int64 and single.mask.dtype == torch.bool
    torch.testing.assert_close(single.times, data.times.float())
    assert data.dtype == F64 and data.to().times is data.times
    with pytest.raises(ValueError, match="floating dtype"):
        data.to(dtype=torch.int32)


@pytest.mark.parametrize("name", MODELS)
def test_float32_events_give_a_float32_log_likelihood_with_no_float64_tensor(name):
    model, theta, data = _drawn(name)
    exact = pp.log_likelihood(model, theta, data)
    with _Float64Outputs() as mode:
        single = pp.log_likelihood(model, theta, data.to(dtype=F32))
    assert mode.seen == []
    assert exact.dtype == F64 and single.dtype == F32
    assert float(single) == pytest.approx(float(exact), rel=3e-5)


@pytest.mark.parametrize("name", ["hawkes", "fitted decays", "time of day"])
def test_a_float32_fit_is_float32_throughout_and_agrees_with_float64(name):
    model, _, data = _drawn(name, 300.0)
    exact = pp.fit(model, data)
    with _Float64Outputs() as mode:
        single = pp.fit(model, data.to(dtype=F32))
    assert mode.seen == []
    assert single.converged and exact.converged
    for key, value in exact.params.items():
        assert single.params[key].dtype == F32 and single.stderr[key].dtype == F32
        torch.testing.assert_close(single.params[key].double(), value, rtol=1e-3, atol=1e-4)
        inside = ~(single.at_bound[key] | exact.at_bound[key])  # an estimate at 0 has no standard error
        torch.testing.assert_close(single.stderr[key].double()[inside], exact.stderr[key][inside], rtol=1e-2, atol=1e-4)


@pytest.mark.filterwarnings("ignore:fwdtrain. NaN standard errors")  # the book's short pass, float64 alike
@pytest.mark.parametrize("name", ["hawkes", "order book"])
def test_a_float32_online_pass_and_intensity_stay_float32(name):
    model, theta, data = _drawn(name)
    single = data.to(dtype=F32)
    with _Float64Outputs() as mode:
        online = pp.fit(model, single, method="online")
        grid = pp.intensity(model, theta, single, torch.linspace(0.0, 100.0, 11))
    assert mode.seen == []
    assert all(value.dtype == F32 for value in online.params.values()) and grid.dtype == F32
    exact = pp.intensity(model, theta, data, torch.linspace(0.0, 100.0, 11, dtype=F64))
    torch.testing.assert_close(grid.double(), exact, rtol=1e-4, atol=1e-5)


def test_a_neural_intensity_follows_float32_events():
    _, _, data = _drawn("hawkes")
    model = neural_intensity(2, hidden=4)
    theta = model.start(data.to(dtype=F32))
    assert all(value.dtype == F32 for value in theta.values())
    exact = pp.log_likelihood(model, {k: v.double() for k, v in theta.items()}, data)
    with _Float64Outputs() as mode:
        single = pp.log_likelihood(model, theta, data.to(dtype=F32))
    assert mode.seen == [] and single.dtype == F32
    assert float(single) == pytest.approx(float(exact), rel=3e-5)


def test_parameters_of_another_dtype_are_refused_with_the_fix():
    model, theta, data = _drawn("hawkes", 30.0)
    doubles = {key: torch.tensor(value, dtype=F64) for key, value in theta.items()}
    single = data.to(dtype=F32)
    message = r"theta\['baseline'\] is torch.float64 on cpu, the events are torch.float32 on cpu: .*events.to\("
    with pytest.raises(ValueError, match=message):
        pp.fit(model, single, start=doubles)
    with pytest.raises(ValueError, match=r"params\['baseline'\] is torch.float64"):
        pp.log_likelihood(model, doubles, single)
    with pytest.raises(ValueError, match="params"):
        pp.goodness(model, doubles, single)
    assert pp.log_likelihood(model, {k: v.float() for k, v in doubles.items()}, single).dtype == F32


def test_simulate_returns_the_dtype_of_its_parameters_and_refuses_a_mix():
    model, theta, marks = MODELS["mark scaled"]
    singles = {key: torch.tensor(value, dtype=F32) for key, value in theta.items()}
    drawn = pp.simulate(model, singles, 30.0, seed=2, marks=marks)
    exact = pp.simulate(model, theta, 30.0, seed=2, marks=marks)
    assert drawn.dtype == F32 and exact.dtype == F64
    torch.testing.assert_close(drawn.times, exact.times.float())
    with pytest.raises(ValueError, match="theta mixes"):
        pp.simulate(model, {**singles, "decay": torch.tensor(1.5, dtype=F64)}, 30.0)


@pytest.mark.parametrize("name", ["time of day", "mark scaled", "order book", "state-dependent"])
def test_no_tensor_is_made_on_the_default_device_instead_of_the_events(name):
    """With the default device set elsewhere (meta), a tensor made without the events' device would meet them in
    an operation and fail: the likelihood, the intensity and the residuals make none."""
    model, theta, data = _drawn(name, 40.0)
    theta = {key: torch.as_tensor(value, dtype=F64) for key, value in theta.items()}
    grid = data.times.new_tensor([0.5, 7.0])
    torch.set_default_device("meta")
    try:
        value = pp.log_likelihood(model, theta, data)
        lam = pp.intensity(model, theta, data, grid)
        good = pp.goodness(model, theta, data)
    finally:
        torch.set_default_device(None)
    assert value.device == lam.device == data.device and len(good.residuals) == model.type_count


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_events_on_a_gpu_give_the_cpu_results():
    """The likelihood and the intensity (a fit also needs fitting's parameter masks on the device)."""
    model, theta, data = _drawn("hawkes", 200.0)
    device = torch.device("cuda")
    moved = data.to(device)
    value = pp.log_likelihood(model, theta, moved)
    assert value.device.type == "cuda"
    assert float(value) == pytest.approx(float(pp.log_likelihood(model, theta, data)), rel=1e-10)
    grid = torch.linspace(0.0, 150.0, 16, dtype=F64)
    lam = pp.intensity(model, theta, moved, grid.to(device))
    assert lam.device.type == "cuda"
    torch.testing.assert_close(lam.cpu(), pp.intensity(model, theta, data, grid), rtol=1e-10, atol=1e-12)
    book, book_theta, book_data = _drawn("order book", 100.0)
    on_gpu = pp.log_likelihood(book, book_theta, book_data.to(device))
    assert float(on_gpu) == pytest.approx(float(pp.log_likelihood(book, book_theta, book_data)), rel=1e-10)


def test_numbers_reach_the_events_dtype_directly_not_through_float32():
    model = pp.intensity_model(
        lambda theta, y: theta["mu"].reshape(1), parameters={"mu": pp.Parameter((), positive=True)}, start={"mu": 0.1}
    )
    _, _, data = _drawn("hawkes", 10.0)
    assert model.start(data)["mu"].item() == 0.1
    assert model.start(data.to(dtype=F32))["mu"].dtype == F32
    assert ft.events.pack(model, {"mu": 0.1}, data.times).exp().item() == pytest.approx(0.1, rel=1e-15)
