"""Xtilde against central finite differences of X, with theta frozen and the same noise."""

import math

import pytest
import torch
from conftest import diagonal_2d, nonlinear_2d

import fwdtrain as ft

STEPS = 200
DT = 0.01


def _simulate_x(sde, theta, x0, noise):
    """Plain Euler-Maruyama for X alone, independent of fwdtrain.step."""
    x = x0.clone()
    for dw in noise[:, 0]:
        mu, sigma, _ = sde.coefficients(theta, x)
        x = x + mu * DT + (sigma * dw if sigma.ndim == 1 else sigma @ dw)
    return x


def _check_against_finite_differences(sde, theta, x0, m, mode, eps=1e-6, rtol=1e-6, atol=1e-8):
    noise = torch.randn(STEPS, 1, m, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * math.sqrt(DT)
    state = ft.init(sde, theta, x0)
    for dw in noise:
        state = ft.step(sde, state, dw, DT, 0.0, mode=mode)
    torch.testing.assert_close(state.x[0], _simulate_x(sde, theta, x0, noise))
    checked = 0
    for name, leaf in theta.items():
        for j in range(leaf.numel()):

            def shifted(delta):
                bumped = leaf.clone().reshape(-1)
                bumped[j] += delta
                return _simulate_x(sde, {**theta, name: bumped.reshape(leaf.shape)}, x0, noise)

            fd = (shifted(eps) - shifted(-eps)) / (2 * eps)
            analytic = state.x_tilde[name][0].reshape(x0.shape[0], -1)[:, j]
            torch.testing.assert_close(analytic, fd, rtol=rtol, atol=atol)
            checked += 1
    assert checked == sum(leaf.numel() for leaf in theta.values())
    assert max(leaf.abs().max() for leaf in state.x_tilde.values()) > 1e-2  # not trivially zero


@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_lqr_sensitivity_matches_finite_differences(mode):
    ex = ft.examples.lqr_1d(dtype=torch.float64, hidden=4)
    _check_against_finite_differences(ex.sde, ex.theta, ex.x0, 1, mode)


@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_nonlinear_full_noise_sensitivity(mode):
    sde, theta = nonlinear_2d()
    _check_against_finite_differences(sde, theta, torch.tensor([0.5, -0.3], dtype=torch.float64), 3, mode)


def test_diagonal_noise_sensitivity():
    sde, theta = diagonal_2d()
    _check_against_finite_differences(sde, theta, torch.tensor([0.5, -0.3], dtype=torch.float64), 2, "reverse")


def test_modes_agree():
    sde, theta = nonlinear_2d()
    x = torch.tensor([[0.5, -0.3], [0.1, 0.9]], dtype=torch.float64)
    state = ft.init(sde, theta, x)
    state = state._replace(x_tilde=ft.core._tree.tree_map(torch.randn_like, state.x_tilde))
    dw = torch.randn(2, 3, dtype=torch.float64)
    a = ft.step(sde, state, dw, DT, 0.3, mode="reverse")
    b = ft.step(sde, state, dw, DT, 0.3, mode="forward")
    for left, right in zip(ft.core._tree.leaves(a), ft.core._tree.leaves(b)):
        torch.testing.assert_close(left, right, rtol=1e-12, atol=1e-12)


def test_linearise_matches_explicit_jacobians():
    """D mu = mu_x Xtilde + mu_theta with the Jacobians computed separately by torch.autograd."""
    sde, theta = nonlinear_2d()
    x = torch.tensor([0.4, -0.2], dtype=torch.float64)
    x_tilde = {
        k: torch.randn(2, *v.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        for k, v in theta.items()
    }
    lin = ft.core.sensitivity.linearise(sde.coefficients, theta, x, x_tilde)
    mu_x = torch.autograd.functional.jacobian(lambda xx: sde.drift(theta, xx), x)
    for name, leaf in theta.items():

        def mu_of(p):
            return sde.drift({**theta, name: p}, x)

        mu_theta = torch.autograd.functional.jacobian(mu_of, leaf)  # (2, *s)
        expected = torch.tensordot(mu_x, x_tilde[name], dims=1) + mu_theta
        torch.testing.assert_close(lin.total.mu[name], expected)
