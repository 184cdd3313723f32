"""SGDCT: the update is the one in the paper, and it recovers known OU parameters from simulated paths."""

import math

import pytest
import torch

import fwdtrain as ft
from fwdtrain import sgdct
from fwdtrain.examples.ou_sgdct import ou_model, ou_path, sgdct_ou


def test_step_is_the_formula():
    """theta' = theta + alpha (d mu / d theta)' (sigma sigma')^{-1} (dX - mu dt), by hand for a 2-D linear
    drift mu = A x + c with full (2 x 3) noise: d mu / dA_ij = e_i x_j, d mu / dc = I. A transposed Jacobian
    (x_i instead of x_j) or a missing (sigma sigma')^{-1} would change the result."""
    gen = torch.Generator().manual_seed(0)
    sigma = torch.randn(2, 3, generator=gen, dtype=torch.float64)
    sde = ft.SDE(lambda th, x: th["A"] @ x + th["c"], lambda th, x: sigma, lambda th, x: x.sum() * 0)
    theta = {
        "A": torch.randn(2, 2, generator=gen, dtype=torch.float64),
        "c": torch.randn(2, generator=gen, dtype=torch.float64),
    }
    x, dx, dt, alpha = (
        torch.tensor([0.3, -1.2], dtype=torch.float64),
        torch.tensor([0.05, 0.02], dtype=torch.float64),
        0.01,
        0.7,
    )
    new = sgdct.step(sde, sgdct.init(theta), x, dx, dt, alpha)
    weighted = torch.linalg.solve(sigma @ sigma.T, dx - (theta["A"] @ x + theta["c"]) * dt)
    torch.testing.assert_close(new.theta["A"], theta["A"] + alpha * torch.outer(weighted, x))
    torch.testing.assert_close(new.theta["c"], theta["c"] + alpha * weighted)
    assert float(new.t) == pytest.approx(dt)
    assert not torch.allclose(torch.outer(weighted, x), torch.outer(x, weighted))


def test_recovers_ou_parameters():
    """16 exact OU paths (kappa = 1, mean = 1, scale = 1) of length T = 100 (h = 0.02): the MLE standard
    deviations are sqrt(2 kappa / (16 T)) = 0.035 for kappa and scale / (kappa sqrt(16 T)) = 0.025 for the
    mean; tolerances 0.15 and 0.1 (about 4 sd). The start (0.5, 0) is 0.5 and 1 away, and a wrong sign
    diverges, so neither passes."""
    ex = sgdct_ou(particles=16, dt=0.02, steps=5000, seed=0)
    state, history = ft.run(ex.trainable, ex.initial_state(), ex.steps, ex.dt, ex.lr, ex.noise(0))
    learned = ex.evaluate(state.theta)
    assert set(learned) == set(ex.reference)
    assert abs(learned["kappa"] - 1.0) < 0.15
    assert abs(learned["mean"] - 1.0) < 0.1
    assert history.theta["kappa"].shape == history.t.shape


def test_single_path_and_errors():
    increments = ou_path(1.0, 1.0, 1.0, 1.0, 50, 0.02, seed=1)[:, 0]
    assert increments.shape == (50, 1)
    model = ou_model(1.0)
    theta = {"kappa": torch.tensor(0.5, dtype=torch.float64), "mean": torch.tensor(0.0, dtype=torch.float64)}
    problem = sgdct.DriftEstimation(model, single=True, increments=increments)
    start = sgdct.as_state(sgdct.init(theta), torch.ones(1, dtype=torch.float64))
    state, history = ft.run(problem, start, 50, 0.02, 0.5, save=ft.SaveAt(10))
    assert history.t.shape == (5,) and math.isfinite(float(state.theta["kappa"]))
    same, _ = ft.run(sgdct.DriftEstimation(model, single=True), start, 50, 0.02, 0.5, increments[:, None])
    assert torch.equal(same.theta["kappa"], state.theta["kappa"])  # the data given to the problem, or as noise
    with pytest.raises(ValueError, match="shape"):
        ft.run(sgdct.DriftEstimation(model, single=True, increments=increments[:, :0]), start, 50, 0.02, 0.5)
    with pytest.raises(TypeError, match="SGDCTState"):
        sgdct.step(model, theta, torch.ones(1, dtype=torch.float64), increments[0], 0.02, 0.5)
    with pytest.raises(ValueError, match="dt must be positive"):
        sgdct.step(model, sgdct.init(theta), torch.ones(1, dtype=torch.float64), increments[0], -0.02, 0.5)


def test_the_clock_is_float64_so_a_long_float32_run_ends_at_its_time():
    ex = sgdct_ou(particles=2, steps=5_000)  # a float32 clock is off by about 1e-4 here
    state, _ = ft.run(ex.trainable, ex.initial_state(), ex.steps, ex.dt, ex.lr, ex.noise(0), compile=False)
    assert state.t.dtype == torch.float64 and abs(float(state.t) - 50.0) < 1e-9
