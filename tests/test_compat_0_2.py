"""fwdtrain computes what 0.2 computed: eager results equal to values pinned with fwdtrain 0.2, and a checkpoint
written by 0.2 loads and resumes to 0.2's own continuation.

The pins (hex floats) and the checkpoint were written by ``tests/data/make_pins_0_2.py`` running 0.2 on one CPU.
Another CPU (AVX-512 against AVX2 kernels, another summation order) rounds differently by an ulp, and the
runs carry that ulp forward; so the pins are compared to a relative 1e-6 of each tensor's largest entry,
far below any change of the algorithm (a different update or time index moves them by 1e-3 or more).
0.2's names, module paths and keywords are gone since 0.4 (``tests/test_public_face.py``).
"""

import json
from pathlib import Path

import pytest
import torch
from conftest import nonlinear_2d

import fwdtrain as ft
from fwdtrain import ensemble

DATA = Path(__file__).parent / "data"
PINS = json.loads((DATA / "pins_0_2.json").read_text())
EAGER = dict(compile=False)
F64 = torch.float64


RTOL = 1e-6


def pinned(hexes):
    return torch.tensor([float.fromhex(v) for v in hexes], dtype=F64)


def assert_close_to_pin(tensor, hexes, what):
    computed, pin = tensor.detach().double().reshape(-1), pinned(hexes)
    assert computed.shape == pin.shape, f"{what}: {computed.numel()} numbers, 0.2 pinned {pin.numel()}"
    scale = float(pin.abs().max()) if pin.numel() else 0.0
    error = float((computed - pin).abs().max()) if pin.numel() else 0.0
    assert error <= RTOL * scale, f"{what} differs from 0.2 by {error:.3g} (tolerance {RTOL * scale:.3g})"


def assert_pinned(case, values):
    for name, tensor in values.items():
        assert_close_to_pin(tensor, PINS[case][name], f"{case}: {name}")


def test_the_tolerance_catches_a_change_of_the_algorithm():
    """A pin compared to 1e-6 still fails on a real change: a learning rate 1% off moves theta far more."""
    ex = ft.examples.lqr_1d(particles=8)
    start = ft.init(ex.sde, ex.theta, ex.x0, 8)
    slower = ft.schedules.inverse_time(10.0 * 0.99, 20.0)
    state, _ = ft.run(ex.sde, start, 300, ex.dt, slower, 3, save=ft.SaveAt(100), **EAGER)
    with pytest.raises(AssertionError, match="differs from 0.2"):
        assert_pinned("lqr1d_f32", {"theta.weight1": state.theta["weight1"]})


def test_the_seed_problem_in_float32():
    ex = ft.examples.lqr_1d(particles=8)
    state, history = ft.run(
        ex.sde, ft.init(ex.sde, ex.theta, ex.x0, 8), 300, ex.dt, ex.lr, 3, save=ft.SaveAt(100), **EAGER
    )
    assert_pinned(
        "lqr1d_f32",
        {
            "theta.weight1": state.theta["weight1"],
            "x": state.x,
            "average_cost": history.average_cost,
            "cost": history.cost,
        },
    )


@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_multiplicative_noise_in_both_modes(mode):
    ex = ft.examples.noisy_control(particles=6, dtype=F64)
    start = ft.init(ex.sde, ex.theta, ex.x0, 6)
    state, history = ft.run(ex.sde, start, 200, ex.dt, ex.lr, 1, solver=ft.Euler(mode=mode), **EAGER)
    assert_pinned(
        f"noisy_f64_{mode}",
        {"gain": state.theta["gain"], "x_tilde": state.x_tilde["gain"], "average_cost": history.average_cost},
    )


def test_adam_with_averaging():
    ex = ft.examples.lqr_1d(particles=4, dtype=F64, hidden=4)
    rule = ft.optim.adam()
    start = ft.init(ex.sde, ex.theta, ex.x0, 4, optimizer=rule, average_from=0.5)
    state, _ = ft.run(ex.sde, start, 150, ex.dt, ex.lr, 2, optimizer=rule, **EAGER)
    assert_pinned("adam_f64", {"weight0": state.theta["weight0"], "mean.weight0": state.average.mean["weight0"]})


def test_calibration_sgdct_and_ensemble():
    ex = ft.examples.ou_calibration(particles=8, dtype=F64)
    state, history = ft.run(ex.problem, ex.initial_state(), 200, ex.dt, ex.lr, 4, **EAGER)
    assert_pinned(
        "ou_calibration_f64", {"mean": state.theta["mean"], "scale": state.theta["scale"], "cost": history.cost}
    )

    ex = ft.examples.sgdct_ou(dtype=F64, steps=500)
    state, _ = ft.run(ex.trainable, ex.initial_state(), 500, ex.dt, ex.lr, ex.noise(5), **EAGER)
    assert_pinned("sgdct_f64", {"kappa": state.theta["kappa"], "mean": state.theta["mean"]})

    ex = ft.examples.lqr_1d(particles=4, dtype=F64, hidden=4)
    start = ensemble.init(ex.sde, ex.theta, ex.x0, 4, members=3)
    rates = torch.tensor([0.5, 1.0, 2.0], dtype=F64)
    state, history = ft.run(ensemble.Ensemble(ex.sde, 3), start, 120, ex.dt, rates, 7, **EAGER)
    assert_pinned("ensemble_f64", {"weight1": state.theta["weight1"], "average_cost": history.average_cost})


def test_step_with_info_on_full_noise():
    sde, theta = nonlinear_2d()
    state = ft.init(sde, theta, torch.tensor([0.3, -0.2], dtype=F64), particles=5)
    generator = torch.Generator().manual_seed(11)
    for _ in range(20):
        dw = torch.randn(5, 3, generator=generator, dtype=F64) * 0.1
        state, info = ft.step_with_info(sde, state, dw, 0.01, 0.3)
    assert_pinned("nonlinear2d_f64", {"a": state.theta["a"], "x": state.x, "cost": info.cost})


def test_a_checkpoint_written_by_0_2_loads_and_resumes_to_0_2s_continuation():
    checkpoint = ft.load(DATA / "checkpoint_0_2.pt")
    assert checkpoint.metadata["written_by"] == "fwdtrain 0.2.0" and checkpoint.history.steps == 40
    ex = ft.examples.lqr_1d(particles=3, dtype=F64, hidden=4)
    state, history = ft.run(
        ex.sde, checkpoint, 30, ex.dt, ex.lr, optimizer=ft.optim.adam(), save=ft.SaveAt(20), **EAGER
    )
    resumed = json.loads((DATA / "checkpoint_0_2_resumed.json").read_text())
    assert_close_to_pin(state.theta["weight0"], resumed["resumed_weight0"], "resumed weight0")
    assert history.steps == 70
