import pytest

"""The seed's problem trains to the known optimum: slope -(sqrt(2) - 1), stationary cost sqrt(2) - 1."""

import math

import torch

import fwdtrain as ft

OPTIMUM = math.sqrt(2) - 1


@pytest.mark.slow
def test_seed_problem_trains_to_the_lqr_optimum():
    ex = ft.examples.lqr_1d(seed=0)
    state = ft.init(ex.sde, ex.theta, ex.x0, particles=ex.particles)
    before = ex.evaluate(state.theta)
    state, history = ft.run(ex.sde, state, ex.steps, ex.dt, ex.lr, noise=0, save=ft.SaveAt(500))
    after = ex.evaluate(state.theta)  # a separate simulation with theta frozen (lr = 0)
    assert abs(before["slope"] + OPTIMUM) > 0.3 * OPTIMUM  # it starts far from the optimum
    assert abs(after["slope"] / -OPTIMUM - 1) < 0.10, after
    assert abs(after["cost"] / OPTIMUM - 1) < 0.05, after
    assert ex.reference == {"slope": -OPTIMUM, "cost": OPTIMUM}
    assert torch.isfinite(history.cost).all() and history.cost[-5:].mean() < history.cost[:2].mean()


def test_linear_control_cost_formula():
    grid = [ft.examples.linear_control_cost(k / 1000) for k in range(2000)]
    assert ft.examples.linear_control_cost(OPTIMUM) <= min(grid)
    assert abs(grid.index(min(grid)) / 1000 - OPTIMUM) < 1e-3
    assert abs(ft.examples.linear_control_cost(OPTIMUM) - OPTIMUM) < 1e-12
