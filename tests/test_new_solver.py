"""A solver added from outside the library is one class: Platen's derivative-free order-1 scheme for
diagonal noise, written here over ``Dual`` numbers, runs through ``step``, ``run`` (eager and compiled),
``stationary_cost`` and the command line's registry, with the exact sensitivity of its discrete chain.

    Xbar = X + mu h + sigma sqrt(h)
    X'   = X + mu h + sigma dW + (sigma(Xbar) - sigma(X)) (dW^2 - h) / (2 sqrt(h))

(Kloeden & Platen, eq. 11.1.7): Milstein's correction with sigma sigma' replaced by a difference quotient.
"""

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from conftest import diagonal_2d
from test_solvers import DT, X0, _gbm_errors, _noise, _order
from torch.func import grad, jacfwd, jacrev

import fwdtrain as ft
from fwdtrain.core.solvers import NAMES, SOLVERS, Solver, as_solver, noise

F64 = torch.float64


@dataclass(frozen=True, repr=False)
class Platen(Solver):
    """Platen's explicit order-1 scheme for diagonal noise (sigma of shape (d,))."""

    name: ClassVar[str] = "platen-test"
    summary: ClassVar[str] = "Platen's derivative-free order-1 scheme (a test's solver)"
    stages: ClassVar[int] = 2

    def check_shape(self, sigma, noise_type):
        if sigma.ndim != 1 and noise_type != "additive":
            raise ValueError(f"Platen takes diagonal noise, a (d,) diffusion; got {tuple(sigma.shape)}")

    def scheme(self, evaluate, x, dw, dt):
        at = evaluate(x, NAMES)
        root = dt**0.5
        support = x + at["mu"].times(dt) + at["sigma"].times(root)
        spread = evaluate(support, ("sigma",))["sigma"] - at["sigma"]
        correction = spread.times((dw * dw - dt) / (2 * root))
        return x + at["mu"].times(dt) + noise(at["sigma"], dw) + correction, at


def _steps(sde, theta, dws, lr, solver):
    state = ft.init(sde, theta, X0, particles=dws.shape[1])
    for dw in dws:
        state = ft.step(sde, state, dw, DT, lr, solver=solver)
    return state


def test_it_registers_itself_and_is_named_in_the_errors():
    assert SOLVERS["platen-test"] is Platen
    assert as_solver("platen-test") == Platen()
    with pytest.raises(TypeError, match="Platen\\(\\)"):
        as_solver(object())
    from fwdtrain.cli.parser import build_parser

    assert "platen-test" in _solver_choices(build_parser())


def _solver_choices(parser):
    for action in parser._actions:
        if hasattr(action, "choices") and isinstance(action.choices, dict):  # subcommands
            for sub in action.choices.values():
                for option in sub._actions:
                    if "--solver" in option.option_strings:
                        return option.choices
    return ()


@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_its_x_tilde_is_the_jacobian_of_its_chain(mode):
    sde, theta = diagonal_2d()
    dws = _noise(sde, theta, 20, 3)
    state = _steps(sde, theta, dws, 0.0, Platen(mode=mode))
    assert max(float(leaf.abs().max()) for leaf in state.x_tilde.values()) > 0.05
    for transform in (jacfwd, jacrev):
        jacobian = transform(lambda th: _steps(sde, th, dws, 0.0, Platen(mode=mode)).x)(theta)
        for name in theta:
            torch.testing.assert_close(jacobian[name], state.x_tilde[name], rtol=0, atol=1e-10)


def test_its_forward_gradient_equals_backpropagation_through_its_chain():
    sde, theta = diagonal_2d()
    dws = _noise(sde, theta, 15, 3)

    def path_cost(th):
        state, total, forward = ft.init(sde, th, X0, particles=3), 0.0, None
        for dw in dws:
            state, info = ft.step_with_info(sde, state, dw, DT, 0.0, solver=Platen())
            total = total + DT * info.cost
            step = {name: DT * g for name, g in info.gradient.items()}
            forward = step if forward is None else {name: forward[name] + step[name] for name in step}
        return total, forward

    backward, forward = grad(path_cost, has_aux=True)(theta)
    assert max(float(g.abs().max()) for g in backward.values()) > 1e-3
    for name in theta:
        torch.testing.assert_close(backward[name], forward[name], rtol=0, atol=1e-12)


def test_it_has_strong_order_one_for_x_and_x_tilde():
    hs, errors = _gbm_errors(Platen(), levels=(3, 4, 5, 6, 7))
    for column, what in enumerate(("X", "dX/dmu", "dX/ds")):
        order = _order(hs, errors[:, column])
        assert 0.85 < order < 1.2, f"strong order of {what} is {order:.2f}"


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a fallback to eager fails the test
def test_run_eager_equals_run_compiled_and_continues_like_one_run():
    sde, theta = diagonal_2d()
    state = ft.init(sde, theta, X0, particles=3)
    options = dict(solver=Platen(), save=ft.SaveAt(10), checks=ft.Checks(10))
    eager, eager_history = ft.run(sde, state, 24, DT, 0.5, 7, compile=False, **options)
    quick = ft.Compile(True, compiler="dynamo", backend="eager")
    compiled, compiled_history = ft.run(sde, state, 24, DT, 0.5, 7, compile=quick, **options)
    for actual, expected in zip(
        ft.core._tree.leaves((compiled, compiled_history.theta)),
        ft.core._tree.leaves((eager, eager_history.theta)),
        strict=True,
    ):
        torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)
    half, history = ft.run(sde, state, 12, DT, 0.5, 7, compile=False, **options)
    rest, _ = ft.run(sde, (half, history), 12, DT, 0.5, compile=False, **options)
    torch.testing.assert_close(rest.x, eager.x, rtol=0, atol=0)


def test_stationary_cost_with_it_agrees_with_milstein_on_the_same_noise():
    sde, theta = diagonal_2d()
    options = dict(particles=64, dt=0.01, steps=600, burn_in=100, seed=5, compile=False)
    platen = ft.stationary_cost(sde, theta, X0, solver=Platen(), **options)
    milstein = ft.stationary_cost(sde, theta, X0, solver=ft.Milstein(), **options)
    assert platen.stderr > 0
    assert abs(platen.mean - milstein.mean) < 0.05 * platen.stderr + 1e-3 * abs(milstein.mean)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a fallback to eager fails the test
def test_stationary_cost_with_it_compiled_equals_eager():
    sde, theta = diagonal_2d()
    options = dict(particles=8, dt=0.01, steps=300, burn_in=50, seed=2, solver=Platen())
    eager = ft.stationary_cost(sde, theta, X0, compile=False, **options)
    compiled = ft.stationary_cost(
        sde, theta, X0, compile=ft.Compile(True, compiler="dynamo", backend="eager"), **options
    )
    assert compiled.mean == pytest.approx(eager.mean, rel=1e-12)
    assert compiled.stderr == pytest.approx(eager.stderr, rel=1e-9)


def test_it_refuses_general_noise_before_the_first_step():
    from conftest import nonlinear_2d

    sde, theta = nonlinear_2d()
    state = ft.init(sde, theta, X0, particles=2)
    with pytest.raises(ValueError, match="Platen takes diagonal noise"):
        ft.run(sde, state, 5, DT, 0.1, solver=Platen(), compile=False)
