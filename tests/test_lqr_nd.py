"""d-dimensional LQR: the references agree with each other, the gradient estimate matches the exact
dJ/dK, and short training moves the gain and cost to the Riccati optimum (full length: benchmarks/validate.py)."""

import numpy as np
import pytest
import torch

import fwdtrain as ft
from fwdtrain.examples.lqr_riccati import (
    LQR,
    linear_control_cost,
    linear_control_gradient,
    lqr_nd,
    lqr_problem,
    random_lqr,
    riccati,
)

pytest.importorskip("scipy")


@pytest.mark.parametrize("dim", [2, 5, 10])
def test_references_agree(dim):
    """Riccati cost = Lyapunov cost at K*, dJ/dK(K*) = 0, and dJ/dK matches finite differences of J."""
    problem = random_lqr(dim, seed=0)
    assert not np.allclose(problem.A, np.diag(np.diag(problem.A)))  # generic, not diagonal
    solution = riccati(problem)
    assert linear_control_cost(problem, solution.gain) == pytest.approx(solution.cost, rel=1e-9)
    assert np.abs(linear_control_gradient(problem, solution.gain)).max() < 1e-8
    gain = 0.5 * solution.gain
    eps, i, j = 1e-6, dim - 1, 0
    bump = np.zeros_like(gain)
    bump[i, j] = eps
    fd = (linear_control_cost(problem, gain + bump) - linear_control_cost(problem, gain - bump)) / (2 * eps)
    assert linear_control_gradient(problem, gain)[i, j] == pytest.approx(fd, rel=1e-5)


def test_missing_scipy_message(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.startswith("scipy"):
            raise ImportError("no scipy")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match=r"pip install 'fwdtrain\[riccati\]'"):
        riccati(random_lqr(2))


def test_gradient_estimate_matches_exact_gradient():
    """With K frozen, the time-and-particle mean of G estimates dJ/dK = 2 (R K - B'P_K) S_K.

    Discriminates: K is off the optimum in a skew direction, so the exact gradient g is far from symmetric:
    a transposed Jacobian (G ~ g') would be |g - g'| / |g| = 1.6 away (asserted > 1 below), a sign error
    2 away; the Monte Carlo error with this seed is ~0.1 (64 particles, t = 16), the tolerance 0.2.
    """
    problem = random_lqr(3, seed=1)
    tilt = np.random.default_rng(5).standard_normal((3, 3))
    gain = riccati(problem).gain + 0.4 * (tilt - tilt.T)  # off the optimum, in a skew direction
    ex = lqr_problem(problem, particles=64, dt=0.02, dtype=torch.float64)
    theta = {"gain": torch.tensor(gain)}
    state = ft.init(ex.sde, theta, torch.zeros(3, dtype=torch.float64), ex.particles)
    state, _ = ft.run(ex.sde, state, 200, 0.02, 0.0, noise=1)  # burn in X and Xtilde (mixing time ~ 1)
    generator = torch.Generator().manual_seed(2)
    total = torch.zeros_like(theta["gain"])
    steps = 800
    for _ in range(steps):
        dw = torch.randn(ex.particles, 3, generator=generator, dtype=torch.float64) * 0.02**0.5
        state, info = ft.step_with_info(ex.sde, state, dw, 0.02, 0.0)
        total += info.gradient["gain"]
    estimate = (total / steps).numpy()
    exact = linear_control_gradient(problem, gain)
    error = np.linalg.norm(estimate - exact) / np.linalg.norm(exact)
    assert np.linalg.norm(exact - exact.T) / np.linalg.norm(exact) > 1.0  # a transpose is caught
    assert np.linalg.norm(exact + exact) / np.linalg.norm(exact) == 2.0  # so is a sign error
    assert error < 0.2


def test_short_training_linear_control():
    """d = 2 from K = 0: the start costs 23% above optimum with gain error 1; 1000 steps (t = 20) come within 1% of
    the optimal cost and 20% of the optimal gain.

    Euler with dt = 0.02 shifts the optimal gain by ~1.4%; the remaining tolerance is the SGD noise.
    """
    ex = lqr_nd(dim=2, particles=64, dt=0.02, lr=3.0, dtype=torch.float32)
    start = ex.evaluate(ex.theta)
    assert start["gain_error"] == pytest.approx(1.0) and start["cost"] > 1.2 * ex.reference["cost"]
    state, _ = ft.run(ex.sde, ft.init(ex.sde, ex.theta, ex.x0, ex.particles), 1000, ex.dt, ex.lr, noise=0)
    learned = ex.evaluate(state.theta)
    assert set(learned) == set(ex.reference)
    assert learned["cost"] < 1.01 * ex.reference["cost"]
    assert learned["gain_error"] < 0.2


def test_mlp_control_builds_and_evaluates():
    ex = lqr_nd(dim=2, control="mlp", hidden=8, dtype=torch.float32)
    state = ft.init(ex.sde, ex.theta, ex.x0, 4)
    state = ft.step(ex.sde, state, torch.zeros(4, 2), ex.dt, ex.lr)
    assert torch.isfinite(state.x).all()
    with pytest.raises(ValueError, match="control must be"):
        lqr_nd(dim=2, control="quadratic")
    with pytest.raises(ValueError, match="LQR shapes"):
        lqr_problem(LQR(np.eye(2), np.eye(2), np.eye(3), np.eye(2), np.eye(2)))
