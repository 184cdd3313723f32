"""State- and parameter-dependent noise: the diffusion-sensitivity term is needed and right."""

import math

import pytest
import torch

import fwdtrain as ft
from fwdtrain.examples.noisy import noisy_control, noisy_cost, noisy_cost_derivative, noisy_optimal_gain, noisy_sde

BETA = 1.0
DT = 0.01


def _paths(k, noise, beta=BETA):
    """X and the two candidate sensitivities by hand (scalar recursions, independent of fwdtrain):
    full:       Xt' = Xt + (-(1 + k) Xt - X) h + (-beta k Xt - beta X) dW
    drift-only: Xt' = Xt + (-(1 + k) Xt - X) h"""
    x, xt, xd = 0.3, 0.0, 0.0
    for dw in noise:
        x, xt, xd = (
            x - (1 + k) * x * DT + (1 - beta * k * x) * dw,
            xt + (-(1 + k) * xt - x) * DT + (-beta * k * xt - beta * x) * dw,
            xd + (-(1 + k) * xd - x) * DT,
        )
    return x, xt, xd


def test_sensitivity_matches_finite_differences_and_needs_the_diffusion_term():
    """Xtilde from fwdtrain.step = central FD of X(k) to 1e-6; the drift-only sensitivity is > 0.1 away."""
    noise = torch.randn(400, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * math.sqrt(DT)
    k, eps = 0.7, 1e-6
    sde = noisy_sde(BETA)
    state = ft.init(sde, {"gain": torch.tensor(k, dtype=torch.float64)}, torch.tensor([0.3], dtype=torch.float64))
    for dw in noise:
        state = ft.step(sde, state, dw.reshape(1, 1), DT, 0.0)
    fd = (_paths(k + eps, noise.tolist())[0] - _paths(k - eps, noise.tolist())[0]) / (2 * eps)
    _, by_hand, drift_only = _paths(k, noise.tolist())
    assert float(state.x_tilde["gain"][0, 0]) == pytest.approx(fd, rel=1e-6, abs=1e-9)
    assert by_hand == pytest.approx(fd, rel=1e-6, abs=1e-9)
    assert abs(drift_only - fd) > 0.1 and abs(drift_only - fd) > 0.2 * abs(fd)


def test_closed_form_against_simulation():
    """J(k) from the closed form vs a frozen-theta Monte Carlo estimate (fwdtrain.stationary_cost).

    At beta = 1, k = 0.8 the closed form is 0.933 while the beta = 0 formula gives 0.911; the Monte Carlo
    standard error is ~0.005 and the Euler bias (dt = 0.01) ~0.01."""
    k = 0.8
    sde = noisy_sde(BETA)
    estimate = ft.stationary_cost(
        sde,
        {"gain": torch.tensor(k, dtype=torch.float64)},
        torch.zeros(1, dtype=torch.float64),
        particles=400,
        dt=DT,
        steps=2500,
        burn_in=500,
        seed=3,
    )
    assert abs(estimate.mean - noisy_cost(k, BETA)) < 0.02
    assert abs(noisy_cost(k, BETA) - noisy_cost(k, 0.0)) > 0.02


def test_stationary_gradient_matches_closed_form():
    """With k frozen at 0.5, the mean of G estimates J'(0.5) = 0.198 (beta = 1). A drift-only sensitivity
    has the beta = 0 derivative as its target, 0.056, which is 0.14 away; the tolerance is 0.06 (the MC
    error with 256 particles over t = 15 is ~0.025: the multiplicative noise makes G heavy-tailed)."""
    k = 0.5
    ex = noisy_control(beta=BETA, gain=k, particles=256, dtype=torch.float64)
    state = ft.init(ex.sde, ex.theta, ex.x0, ex.particles)
    state, _ = ft.run(ex.sde, state, 500, DT, 0.0, noise=5)  # burn in X and Xtilde (rate ~ 1.4)
    generator = torch.Generator().manual_seed(6)
    total, steps = 0.0, 1500
    for _ in range(steps):
        dw = torch.randn(ex.particles, 1, generator=generator, dtype=torch.float64) * math.sqrt(DT)
        state, info = ft.step_with_info(ex.sde, state, dw, DT, 0.0)
        total += float(info.gradient["gain"])
    assert abs(noisy_cost_derivative(k, 0.0) - noisy_cost_derivative(k, BETA)) > 0.12
    assert abs(total / steps - noisy_cost_derivative(k, BETA)) < 0.06


@pytest.mark.slow
def test_training_reaches_the_closed_form_optimum():
    """From k = 1, 3000 steps reach k* = 0.3028 (beta = 1) within 0.04; the beta = 0 optimum 0.4142 that a
    drift-only sensitivity would train to is 0.11 away."""
    ex = noisy_control(beta=BETA, gain=1.0, particles=64, dtype=torch.float32)
    state, _ = ft.run(ex.sde, ft.init(ex.sde, ex.theta, ex.x0, ex.particles), 3000, ex.dt, ex.lr, noise=0)
    learned = ex.evaluate(state.theta)
    assert set(learned) == set(ex.reference)
    assert abs(learned["gain"] - noisy_optimal_gain(BETA)) < 0.04
    assert abs(noisy_optimal_gain(0.0) - noisy_optimal_gain(BETA)) > 0.1
    assert learned["cost"] < 1.005 * ex.reference["cost"]
