"""Calibration of stationary distributions: the two-group gradient is unbiased and needs the diffusion
sensitivity; training recovers the OU closed form and the double well's parameters."""

import warnings

import pytest
import torch

import fwdtrain as ft
from fwdtrain import calibration as cal
from fwdtrain.core._tree import leaves, tree_map
from fwdtrain.examples.calibration import double_well_calibration, double_well_moments, ou_calibration

KAPPA = 1.0


def _ou(dtype=torch.float64):
    return cal.calibration(
        drift=lambda th, x: KAPPA * (th["mean"] - x),
        diffusion=lambda th, x: th["scale"] * torch.ones_like(x),
        observables=lambda th, x: torch.cat([x, x.square()]),
        targets=torch.tensor([1.0, 1.5], dtype=dtype),
    )


def _exact_gradient(mean, scale):
    """grad of (E X - 1)^2 + (E X^2 - 1.5)^2 with E X = mean, E X^2 = scale^2 / (2 kappa) + mean^2."""
    e1, e2 = mean - 1.0, scale**2 / (2 * KAPPA) + mean**2 - 1.5
    return {"mean": 2 * (e1 + e2 * 2 * mean), "scale": 2 * e2 * scale / KAPPA}


@pytest.mark.slow
def test_gradient_matches_closed_form():
    """theta frozen at (mean, scale) = (0.5, 0.8): the time mean of G estimates (-2.86, -1.49).

    The scale enters only the diffusion: without the diffusion-sensitivity term its gradient is 0, and a
    sign error flips both; the tolerance (0.25 on the mean's, 0.2 on the scale's gradient) is 2-3 Monte
    Carlo standard errors (128 particles, t = 12)."""
    problem = _ou()
    theta = {"mean": torch.tensor(0.5, dtype=torch.float64), "scale": torch.tensor(0.8, dtype=torch.float64)}
    state = cal.init(problem, theta, torch.full((128, 1), 0.5, dtype=torch.float64))
    state, _ = ft.run(problem, state, 400, 0.01, 0.0, noise=1)  # burn in (OU and Xtilde mix at rate 1)
    generator = torch.Generator().manual_seed(2)
    totals, steps = {"mean": 0.0, "scale": 0.0}, 1200
    for _ in range(steps):
        dw = torch.randn(128, 1, generator=generator, dtype=torch.float64) * 0.1
        state, info = cal.step_with_info(problem, state, dw, 0.01, 0.0)
        for name in totals:
            totals[name] += float(info.gradient[name]) / steps
    exact = _exact_gradient(0.5, 0.8)
    assert abs(totals["mean"] - exact["mean"]) < 0.25
    assert abs(totals["scale"] - exact["scale"]) < 0.2 and abs(exact["scale"]) > 1.0


def test_split_estimator_is_unbiased_where_one_group_is_not():
    """Static toy: X = theta + Z exactly (Xtilde = 1), phi = x^2, target 0, so
    grad J = 2 E[x^2] E[2 x] = 4 theta (theta^2 + 1), while the one-group product (phi - m) D phi has mean
    4 E[x^3] = 4 (theta^3 + 3 theta), 46% too large at theta = 0.5. The library's step on two particles
    returns the split estimate phi_1 Dphi_2 + phi_2 Dphi_1 (checked exactly); its mean over 10^5 independent
    pairs is within 2% (about 4 standard errors) of grad J."""
    value = 0.5
    problem = cal.calibration(
        lambda th, x: 0 * x,
        lambda th, x: 0 * x + 1.0,
        lambda th, x: x.square(),
        targets=torch.tensor([0.0], dtype=torch.float64),
    )
    theta = {"c": torch.tensor(value, dtype=torch.float64)}
    x = value + torch.randn(200_000, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    two = ft.State(x[:2], {"c": torch.ones(2, 1, dtype=torch.float64)}, theta, torch.zeros((), dtype=torch.float64))
    _, info = cal.step_with_info(problem, two, torch.zeros(2, 1, dtype=torch.float64), 0.01, 0.0)
    phi, d_phi = x[:, 0].square(), 2 * x[:, 0]
    assert float(info.gradient["c"]) == pytest.approx(float(phi[0] * d_phi[1] + phi[1] * d_phi[0]))
    split = (phi[0::2] * d_phi[1::2] + phi[1::2] * d_phi[0::2]).mean()
    exact = 4 * value * (value**2 + 1)
    one_group = 4 * (value**3 + 3 * value)
    assert float(split) == pytest.approx(exact, rel=0.02)
    assert float((phi * d_phi).mean() * 2) == pytest.approx(one_group, rel=0.02)
    assert abs(one_group - exact) > 0.4 * exact


@pytest.mark.slow
def test_ou_training_reaches_closed_form():
    """From (mean, scale) = (0, 0.5), i.e. 100% and 50% off (variance 75% off), a short run (t = 30) gets
    within 10% of the closed-form mean = 1 and scale = 1 and 20% of the variance 0.5 (= 2 x the scale's
    relative error). The SGD noise at t = 30 is ~5% on the scale; benchmarks/validate.py runs to 2%."""
    ex = ou_calibration(particles=128, dtype=torch.float32)
    state, history = ft.run(ex.trainable, ex.initial_state(), 3000, ex.dt, ex.lr, 0)
    learned = ex.evaluate(state.theta)
    assert set(learned) == set(ex.reference)
    for name, tolerance in (("mean", 0.1), ("scale", 0.1), ("variance", 0.2)):
        assert abs(learned[name] - ex.reference[name]) < tolerance * ex.reference[name], (name, learned)
    assert history.cost.shape == history.t.shape and history.theta["mean"].shape == history.t.shape


def test_double_well_moments_quadrature():
    """The quadrature moments agree with the Gaussian limit (b -> 0 is not allowed; a < 0 with large |a|
    is close to N(0, s^2 / (2 |a|))) and with symmetry scaling."""
    m2, m4 = double_well_moments(-20.0, 1e-4, 1.0)
    assert m2 == pytest.approx(1 / 40, rel=1e-3) and m4 == pytest.approx(3 / 1600, rel=1e-3)
    with pytest.raises(ValueError, match="b > 0"):
        double_well_moments(1.0, 0.0)


def test_errors():
    problem = _ou()
    theta = {"mean": torch.tensor(0.5, dtype=torch.float64), "scale": torch.tensor(0.8, dtype=torch.float64)}
    with pytest.raises(ValueError, match="even number"):
        cal.init(problem, theta, torch.zeros(3, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="targets"):
        cal.calibration(lambda th, x: x, lambda th, x: x, lambda th, x: x, targets=torch.zeros(()))
    with pytest.raises(ValueError, match="observables returned"):
        cal.init(
            cal.calibration(
                problem.sde.drift, problem.sde.diffusion, lambda th, x: x, targets=torch.zeros(2, dtype=torch.float64)
            ),
            theta,
            torch.zeros(2, 1, dtype=torch.float64),
        )


@pytest.mark.slow
def test_double_well_gradient_matches_quadrature():
    """theta frozen at (a, b) = (0.5, 1.5): the time mean of G estimates 2 sum_j (E phi_j - m_j) dE phi_j/dtheta,
    here computed from quadrature moments and central differences of them (no simulation). Tolerance 25% of
    |grad J| in norm (the error with this seed is 2%); a sign error is 200% off, and since phi does not
    depend on theta, a sensitivity that is not propagated gives G = 0, 100% off."""
    ex = double_well_calibration(dtype=torch.float64)
    targets = double_well_moments(1.0, 1.0)
    point, eps = (0.5, 1.5), 1e-5
    errors = [m - t for m, t in zip(double_well_moments(*point), targets)]
    exact = []
    for i in range(2):
        up, down = list(point), list(point)
        up[i] += eps
        down[i] -= eps
        dm = [(u - d) / (2 * eps) for u, d in zip(double_well_moments(*up), double_well_moments(*down))]
        exact.append(2 * sum(e * g for e, g in zip(errors, dm)))
    problem = cal.calibration(
        ex.sde.drift,
        ex.sde.diffusion,
        lambda th, x: torch.cat([x**2, x**4]),
        targets=torch.tensor(targets, dtype=torch.float64),
    )
    theta = {"a": torch.tensor(point[0], dtype=torch.float64), "b": torch.tensor(point[1], dtype=torch.float64)}
    state = cal.init(problem, theta, torch.zeros(1, dtype=torch.float64), 128)
    state, _ = ft.run(problem, state, 300, 0.01, 0.0, noise=3)
    generator = torch.Generator().manual_seed(4)
    estimate = torch.zeros(2, dtype=torch.float64)
    steps = 1000
    for _ in range(steps):
        dw = torch.randn(128, 1, generator=generator, dtype=torch.float64) * 0.1
        state, info = cal.step_with_info(problem, state, dw, 0.01, 0.0)
        estimate += torch.stack([info.gradient["a"], info.gradient["b"]]) / steps
    exact = torch.tensor(exact, dtype=torch.float64)
    assert float((estimate - exact).norm() / exact.norm()) < 0.25


def test_trains_through_the_driver():
    """``cal.run`` is ``fwdtrain.run`` on a Calibration: the same bits for any noise chunk, a run resumed
    from its history equals the uninterrupted one, the recorded cost is the mean two-group objective of
    ``step_with_info`` with the same noise, ``reduce`` reaches the gradient, and the calibration's own
    checks (even N) and the driver's apply before any step."""
    problem = _ou()
    theta = {"mean": torch.tensor(0.5, dtype=torch.float64), "scale": torch.tensor(0.8, dtype=torch.float64)}
    state = cal.init(problem, theta, torch.full((8, 1), 0.5, dtype=torch.float64))
    options = {"save": ft.SaveAt(30)}
    whole, history = ft.run(problem, state, 90, 0.01, 0.1, noise=5, compile=ft.Compile("auto", chunk=7), **options)
    alias, _ = ft.run(problem, state, 90, 0.01, 0.1, noise=5, **options)
    half, first = ft.run(problem, state, 60, 0.01, 0.1, noise=5, **options)
    resumed, continued = ft.run(problem, (half, first), 30, 0.01, 0.1, **options)
    for other in (alias, resumed):
        assert all(torch.equal(a, b) for a, b in zip(leaves(whole), leaves(other)))
    assert torch.equal(continued.cost, history.cost) and torch.equal(continued.step, history.step)

    noise = ft.noise.BrownianNoise((8, 1), 0.01, seed=5, dtype=torch.float64).draw(90)
    by_hand, objectives = state, []
    for dw in noise:
        by_hand, info = cal.step_with_info(problem, by_hand, dw, 0.01, 0.1)
        objectives.append(float(info.objective))
    assert all(torch.equal(a, b) for a, b in zip(leaves(whole), leaves(by_hand)))
    assert history.cost.tolist() == pytest.approx([sum(objectives[i : i + 30]) / 30 for i in (0, 30, 60)], rel=1e-12)

    frozen, _ = ft.run(
        problem,
        state,
        20,
        0.01,
        0.1,
        hooks=(ft.driver.GradientHook(lambda g: tree_map(torch.zeros_like, g)),),
        **options,
    )
    assert all(torch.equal(frozen.theta[k], state.theta[k]) for k in theta)
    odd = ft.init(problem.sde, theta, torch.zeros(3, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="even number"):
        ft.run(problem, odd, 10, 0.01, 0.1)
    # 0.2: compile and fuse take a calibration too (dynamo-traced here, quick), equal to the eager run;
    # compiled without falling back (a fallback warns)
    eager, eager_history = ft.run(problem, state, 90, 0.01, 0.1, noise=5, solver=ft.Euler(mode="reverse"), **options)
    for compiled in ({"compile": "eager"}, {"compile": ft.Compile(True, compiler="dynamo", backend="eager", chunk=30)}):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            fast, fast_history = ft.run(
                problem, state, 90, 0.01, 0.1, noise=5, solver=ft.Euler(mode="reverse"), **compiled, **options
            )
        for a, b in zip(leaves((eager, eager_history.cost)), leaves((fast, fast_history.cost))):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
