"""Solvers: each one's sensitivity is the exact derivative of its discrete chain, each has the order its
theory gives, and each refuses the noise it cannot integrate, before the first step.

The exactness checks differentiate K steps at lr = 0 with the user's own transforms (jacfwd, jacrev,
grad) and compare with the x_tilde the solver propagated (float64, 1e-10). The order checks measure
fwdtrain's own steps: weak order from the exact stationary variance of the linear chain a solver makes
of an Ornstein-Uhlenbeck process; strong order on geometric Brownian motion, whose solution and
parameter derivatives have closed forms.
"""

import math

import numpy as np
import pytest
import torch
from conftest import additive_2d, diagonal_2d, nonlinear_2d, one_noise_2d
from torch.func import grad, jacfwd, jacrev, vmap

import fwdtrain as ft
from fwdtrain.core.state import noise_dim

F64 = torch.float64
DT = 0.02
X0 = torch.tensor([0.3, -0.2], dtype=F64)


CASES = {
    "euler-general": (ft.Euler, nonlinear_2d),
    "euler-diagonal": (ft.Euler, diagonal_2d),
    "heun-additive": (ft.Heun, additive_2d),
    "milstein-diagonal": (ft.Milstein, diagonal_2d),
    "milstein-one-noise": (ft.Milstein, one_noise_2d),
}


def _noise(sde, theta, steps, particles, seed=0):
    m = noise_dim(sde, theta, X0.expand(particles, -1))
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((steps, particles, m), generator=generator, dtype=F64) * DT**0.5


def _run(sde, theta, dws, lr, solver, mode="auto"):
    state = ft.init(sde, theta, X0, particles=dws.shape[1])
    for dw in dws:
        state = ft.step(sde, state, dw, DT, lr, solver=solver(mode=mode))
    return state


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_x_tilde_is_the_jacobian_of_the_discrete_chain(case, mode):
    solver, problem = CASES[case]
    sde, theta = problem()
    dws = _noise(sde, theta, 20, 3)
    state = _run(sde, theta, dws, 0.0, solver, mode)
    assert max(float(leaf.abs().max()) for leaf in state.x_tilde.values()) > 0.05  # not a trivial zero
    for transform in (jacfwd, jacrev):
        jacobian = transform(lambda th: _run(sde, th, dws, 0.0, solver, mode).x)(theta)
        for name in theta:
            torch.testing.assert_close(jacobian[name], state.x_tilde[name], rtol=0, atol=1e-10)


@pytest.mark.parametrize("case", CASES)
def test_forward_propagation_equals_backpropagation_through_the_chain(case):
    """At lr = 0: sum_n h G_n = d/dtheta0 sum_n h mean_i c(X_n^i, theta), for the solver's own chain."""
    solver, problem = CASES[case]
    sde, theta = problem()
    dws = _noise(sde, theta, 15, 3)

    def path_cost(th):
        state, total, forward = ft.init(sde, th, X0, particles=3), 0.0, None
        for dw in dws:
            state, info = ft.step_with_info(sde, state, dw, DT, 0.0, solver=solver())
            total = total + DT * info.cost
            gradient = {name: DT * g for name, g in info.gradient.items()}
            forward = gradient if forward is None else {name: forward[name] + gradient[name] for name in gradient}
        return total, forward

    backward, forward = grad(path_cost, has_aux=True)(theta)
    assert max(float(g.abs().max()) for g in backward.values()) > 1e-3
    for name in theta:
        torch.testing.assert_close(backward[name], forward[name], rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", ["heun-additive", "milstein-diagonal"])
def test_vmap_over_runs_equals_a_loop_and_grad_through_training_equals_central_differences(case):
    solver, problem = CASES[case]
    sde, theta = problem()
    dws = _noise(sde, theta, 6, 2)
    thetas = {name: torch.stack([leaf, leaf * 1.1]) for name, leaf in theta.items()}
    states = vmap(lambda th: _run(sde, th, dws, 0.3, solver))(thetas)
    for r in range(2):
        one = _run(sde, {name: leaf[r] for name, leaf in thetas.items()}, dws, 0.3, solver)
        torch.testing.assert_close(states.x[r], one.x, rtol=0, atol=1e-13)
        for name in theta:
            torch.testing.assert_close(states.x_tilde[name][r], one.x_tilde[name], rtol=0, atol=1e-13)

    def final_cost(th):
        state = _run(sde, th, dws, 0.3, solver)
        return vmap(lambda x: sde.cost(state.theta, x))(state.x).mean()

    gradient = grad(final_cost)(theta)
    eps = 1e-6
    for name, leaf in theta.items():
        bump = torch.zeros_like(leaf).flatten()
        bump[0] = eps
        bump = bump.reshape(leaf.shape)
        central = (final_cost({**theta, name: leaf + bump}) - final_cost({**theta, name: leaf - bump})) / (2 * eps)
        torch.testing.assert_close(gradient[name].flatten()[0], central, rtol=1e-6, atol=1e-9)


def test_euler_is_the_default_and_milstein_is_euler_for_additive_noise():
    for sigma in (torch.tensor([0.5, 0.2], dtype=F64), torch.tensor([[0.5, 0.1], [0.0, 0.2]], dtype=F64)):
        sde = ft.SDE(
            lambda th, x: th["a"] @ x + 0.3 * torch.sin(x),
            lambda th, x, sigma=sigma: sigma,
            lambda th, x: (x**2).sum() + th["a"].square().sum(),
            noise_type="additive",
        )
        theta = {"a": torch.tensor([[-1.0, 0.3], [0.2, -0.8]], dtype=F64)}
        dws = _noise(sde, theta, 10, 3)
        default = _run(sde, theta, dws, 0.2, lambda mode: None)
        for solver in (ft.Euler, ft.Milstein):
            other = _run(sde, theta, dws, 0.2, solver)
            assert torch.equal(other.x, default.x) and torch.equal(other.theta["a"], default.theta["a"])
            assert torch.equal(other.x_tilde["a"], default.x_tilde["a"])
        heun = _run(sde, theta, dws, 0.2, ft.Heun)
        assert not torch.allclose(heun.x, default.x, rtol=0, atol=1e-6)  # another scheme, not Euler again


def test_heun_refuses_a_diffusion_that_depends_on_x_before_any_step():
    sde, theta = diagonal_2d()
    state = ft.init(sde, theta, X0, particles=2)
    dw = torch.zeros(2, 2, dtype=F64)
    with pytest.raises(ValueError, match=r"Heun\(\) needs a diffusion that does not depend on x.*Milstein\(\)"):
        ft.step(sde, state, dw, DT, 0.1, solver=ft.Heun())
    with pytest.raises(ValueError, match="does not depend on x"):
        ft.run(sde, state, 10, DT, 0.1, solver="heun", compile=False)
    # theta-dependent sigma is Heun's domain; so is a declared additive one
    additive, theta_a = additive_2d()
    ft.step(additive, ft.init(additive, theta_a, X0, 2), dw, DT, 0.1, solver=ft.Heun())


def test_milstein_refuses_general_noise_and_names_the_alternative():
    sde, theta = nonlinear_2d()
    state = ft.init(sde, theta, X0, particles=2)
    before = {name: leaf.clone() for name, leaf in state.theta.items()}
    with pytest.raises(ValueError, match=r"Levy areas: use Euler\(\)"):
        ft.run(sde, state, 10, DT, 0.1, solver=ft.Milstein(), compile=False)
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
        ft.step(sde, state, torch.zeros(2, 3, dtype=F64), DT, 0.1, solver=ft.Milstein())
    assert all(torch.equal(state.theta[name], before[name]) for name in before)


def test_solver_names_and_bad_solvers():
    assert ft.core.solvers.as_solver("Heun") == ft.Heun()
    with pytest.raises(ValueError, match=r"unknown solver 'rk4'; choose one of \['euler', 'heun', 'milstein'"):
        ft.core.solvers.as_solver("rk4")
    with pytest.raises(TypeError, match="solver must be a fwdtrain solver"):
        ft.core.solvers.as_solver(object())
    with pytest.raises(ValueError, match="must be 'auto', 'reverse' or 'forward'"):
        ft.Heun(mode="backward")


# Weak order: an OU process dX = -kappa X dt + s dW. Each scheme's chain is X' = a(h) X + b(h) dW, read off
# fwdtrain's own step (X = 1, dW = 0 gives a; X = 0, dW = 1 gives b); its stationary variance is
# b^2 h / (1 - a^2) against the exact s^2 / (2 kappa).
KAPPA, S = 1.5, 0.8
STEPS_H = (0.4, 0.2, 0.1, 0.05)


def _ou():
    theta = {"kappa": torch.tensor(KAPPA, dtype=F64), "s": torch.tensor(S, dtype=F64)}
    return ft.SDE(
        lambda th, x: -th["kappa"] * x, lambda th, x: th["s"] * torch.ones_like(x), lambda th, x: x.sum() ** 2
    ), theta


def _stationary_variance(solver, h):
    sde, theta = _ou()
    state = ft.init(sde, theta, torch.ones(1, dtype=F64), particles=2)
    state = state._replace(x=torch.tensor([[1.0], [0.0]], dtype=F64))
    moved = ft.step(sde, state, torch.tensor([[0.0], [1.0]], dtype=F64), h, 0.0, solver=solver)
    a, b = float(moved.x[0, 0]), float(moved.x[1, 0])
    return b * b * h / (1 - a * a)


def _order(hs, errors):
    return float(np.polyfit(np.log(hs), np.log(errors), 1)[0])


@pytest.mark.parametrize(
    ("solver", "low", "high"), [(ft.Euler(), 0.8, 1.2), (ft.Milstein(), 0.8, 1.2), (ft.Heun(), 1.7, 2.3)]
)
def test_weak_order_from_the_exact_stationary_variance(solver, low, high):
    exact = S * S / (2 * KAPPA)
    bias = [abs(_stationary_variance(solver, h) / exact - 1) for h in STEPS_H]
    assert low < _order(STEPS_H, bias) < high
    if isinstance(solver, ft.Euler):  # the leading term: relative bias ~ kappa h / 2
        assert bias[-1] == pytest.approx(KAPPA * 0.05 / 2, rel=0.1)
    if isinstance(solver, ft.Heun):  # ~ kappa^2 h^2 / 4
        assert bias[-1] == pytest.approx(KAPPA**2 * 0.05**2 / 4, rel=0.2)


# Strong order: geometric Brownian motion dX = mu X dt + s X dW, X_T = X_0 exp((mu - s^2/2) T + s W_T),
# dX_T/dmu = T X_T and dX_T/ds = (W_T - s T) X_T, on the same Brownian paths at every h.
MU, SIGMA, T, PATHS = 0.3, 0.6, 1.0, 4000


def _gbm_errors(solver, levels):
    theta = {"mu": torch.tensor(MU, dtype=F64), "s": torch.tensor(SIGMA, dtype=F64)}
    sde = ft.SDE(lambda th, x: th["mu"] * x, lambda th, x: th["s"] * x, lambda th, x: x.sum())
    finest = 2 ** max(levels)
    generator = torch.Generator().manual_seed(1)
    fine = torch.randn(finest, PATHS, 1, generator=generator, dtype=F64) * (T / finest) ** 0.5
    w_t = fine.sum(0)
    x_t = torch.exp((MU - SIGMA**2 / 2) * T + SIGMA * w_t)
    errors = []
    for level in levels:
        steps = 2**level
        dws = fine.reshape(steps, finest // steps, PATHS, 1).sum(1)
        state = ft.init(sde, theta, torch.ones(1, dtype=F64), PATHS)
        for dw in dws:
            state = ft.step(sde, state, dw, T / steps, 0.0, solver=solver)
        errors.append(
            (
                float((state.x - x_t).square().mean().sqrt()),
                float((state.x_tilde["mu"] - T * x_t).square().mean().sqrt()),
                float((state.x_tilde["s"] - (w_t - SIGMA * T) * x_t).square().mean().sqrt()),
            )
        )
    return [2.0**-level for level in levels], np.array(errors)


@pytest.mark.parametrize(("solver", "low", "high"), [(ft.Euler(), 0.35, 0.75), (ft.Milstein(), 0.85, 1.2)])
def test_strong_order_for_x_and_x_tilde_on_geometric_brownian_motion(solver, low, high):
    hs, errors = _gbm_errors(solver, levels=(3, 4, 5, 6, 7))
    for column, what in enumerate(("X", "dX/dmu", "dX/ds")):
        order = _order(hs, errors[:, column])
        assert low < order < high, f"{solver!r}: strong order of {what} is {order:.2f}"


def test_heun_lands_closer_to_the_lqr_optimum_than_euler_at_five_times_the_step():
    """The closed forms of the issue: the stationary cost of u = -k X under each chain, minimised over k."""
    sde = ft.ControlledSDE(
        control=lambda th, x: -th["k"] * x,
        drift=lambda x, u: -x + u,
        diffusion=lambda x, u: torch.ones_like(x),
        cost=lambda x, u: (x.square() + u.square()).sum(),
    )
    k_star = math.sqrt(2) - 1

    def optimum(solver, h):
        def stationary_cost(k):
            theta = {"k": torch.tensor(k, dtype=F64)}
            state = ft.init(sde, theta, torch.ones(1, dtype=F64), particles=2)
            state = state._replace(x=torch.tensor([[1.0], [0.0]], dtype=F64))
            moved = ft.step(sde, state, torch.tensor([[0.0], [1.0]], dtype=F64), h, 0.0, solver=solver)
            a, b = float(moved.x[0, 0]), float(moved.x[1, 0])
            return (1 + k * k) * b * b * h / (1 - a * a)

        ks = np.linspace(0.40, 0.42, 201)  # both optima lie within, on a grid of 1e-4
        return ks[int(np.argmin([stationary_cost(k) for k in ks]))]

    euler = abs(optimum(ft.Euler(), 0.01) / k_star - 1)
    heun = abs(optimum(ft.Heun(), 0.05) / k_star - 1)
    assert euler == pytest.approx(0.0071, abs=0.0005)
    assert heun < 0.004 and heun < euler / 2


def _compiled_against_eager(solver, compile):
    sde, theta = diagonal_2d() if isinstance(solver, ft.Milstein) else additive_2d()
    state = ft.init(sde, theta, X0, particles=3)
    options = dict(solver=solver, save=ft.SaveAt(10), checks=ft.Checks(10))
    eager, eager_history = ft.run(sde, state, 24, DT, 0.5, 7, compile=False, **options)
    compiled, compiled_history = ft.run(sde, state, 24, DT, 0.5, 7, compile=compile, **options)
    for actual, expected in zip(
        ft.core._tree.leaves((compiled, compiled_history.theta)),
        ft.core._tree.leaves((eager, eager_history.theta)),
        strict=True,
    ):
        torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a fallback to eager fails the test
@pytest.mark.parametrize("solver", [ft.Heun(), ft.Milstein()])
def test_each_solver_on_the_quick_compile_route_equals_eager(solver):
    _compiled_against_eager(solver, ft.Compile(True, compiler="dynamo", backend="eager"))


@pytest.mark.slow
@pytest.mark.filterwarnings("error::RuntimeWarning")  # a fallback to eager fails the test
@pytest.mark.parametrize("solver", [ft.Heun(), ft.Milstein()])
def test_each_solver_in_the_trace_once_kernel_equals_eager(solver):
    _compiled_against_eager(solver, True)
