"""The gradient estimate G = c_x Xtilde + c_theta against the analytic derivative of the stationary cost.

Control u = -k x on dX = (-X + u) dt + dW with cost x^2 + u^2. In continuous time
J(k) = (1 + k^2) / (2 (1 + k)). Euler-Maruyama with step h has the stationary variance
1 / (2 a - a^2 h), a = 1 + k, so the discrete chain's cost is J_h(k) = (1 + k^2) / (2 a - a^2 h);
the pathwise estimator is unbiased for dJ_h/dk, which differs from dJ/dk by O(h).
"""

import math

import pytest
import torch

import fwdtrain as ft
from fwdtrain.core.sensitivity import linearise_particles

DT = 0.01


def _discrete_cost(k: torch.Tensor) -> torch.Tensor:
    a = 1 + k
    return (1 + k**2) / (2 * a - a**2 * DT)


def _continuous_gradient(k: float) -> float:
    return (k * k + 2 * k - 1) / (2 * (1 + k) ** 2)


@pytest.mark.slow
@pytest.mark.parametrize("k", [0.2, 1.0])
def test_gradient_estimate_matches_the_analytic_derivative(k):
    sde = ft.ControlledSDE(
        control=lambda th, x: -th["k"] * x,
        drift=lambda x, u: -x + u,
        diffusion=lambda x, u: torch.ones_like(x),
        cost=lambda x, u: (x**2 + u**2).sum(),
    )
    particles, burn_in, steps = 2000, 500, 2500
    theta = {"k": torch.tensor(k, dtype=torch.float64)}
    g = torch.Generator().manual_seed(11)
    # start X in (roughly) the stationary law; Xtilde forgets its start at rate 1 + k
    x0 = torch.randn(particles, 1, generator=g, dtype=torch.float64) / math.sqrt(2 * (1 + k))
    state = ft.init(sde, theta, x0)
    per_particle = torch.zeros(particles, dtype=torch.float64)
    for n in range(steps):
        dw = torch.randn(particles, 1, generator=g, dtype=torch.float64) * math.sqrt(DT)
        new_state, info = ft.step_with_info(sde, state, dw, DT, 0.0)
        if n >= burn_in:  # G_n of each particle, at the state of time n
            g_n = linearise_particles(sde.coefficients, state.theta, state.x, state.x_tilde).total.cost["k"]
            torch.testing.assert_close(info.gradient["k"], g_n.mean())
            per_particle += g_n
        state = new_state
    per_particle /= steps - burn_in
    estimate = per_particle.mean().item()
    stderr = (per_particle.std() / math.sqrt(particles)).item()

    k_t = torch.tensor(k, dtype=torch.float64, requires_grad=True)
    (exact,) = torch.autograd.grad(_discrete_cost(k_t), k_t)
    assert abs(estimate - exact.item()) < 4 * stderr, (estimate, exact.item(), stderr)
    assert abs(estimate - _continuous_gradient(k)) < 0.05 * abs(_continuous_gradient(k)) + 4 * stderr
    assert stderr < 0.1 * abs(exact.item())  # the test has power: the noise is small against the signal
