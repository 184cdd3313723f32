"""``stationary_cost`` runs through ``run``'s loop: its estimate is the time average of a frozen-theta run,
compiled or not, and paths that blow up raise instead of giving a NaN estimate."""

import pytest
import torch

import fwdtrain as ft
from fwdtrain.core.evaluate import average_cost
from fwdtrain.core.noise import BrownianNoise
from fwdtrain.problems.frozen import FrozenCost, FrozenPaths

F64 = torch.float64


def _ou():
    sde = ft.SDE(lambda th, x: -th["k"] * x, lambda th, x: torch.ones_like(x), lambda th, x: (x * x).sum())
    return sde, {"k": torch.tensor(1.0, dtype=F64)}


def test_it_equals_the_pure_average_cost_on_the_runs_own_noise():
    sde, theta = _ou()
    x0 = torch.zeros(1, dtype=F64)
    estimate = ft.stationary_cost(sde, theta, x0, particles=16, dt=0.05, steps=200, burn_in=40, seed=4, compile=False)
    dw = BrownianNoise((16, 1), 0.05, seed=4, dtype=F64).draw(200)
    per_particle = average_cost(sde, theta, x0, dw, 0.05, burn_in=40)
    assert estimate.mean == pytest.approx(float(per_particle.mean()), rel=1e-12)
    assert estimate.stderr == pytest.approx(float(per_particle.std() / 16**0.5), rel=1e-9)


def test_stationary_cost_of_diverging_paths_raises_instead_of_returning_nan():
    sde = ft.SDE(lambda th, x: th["k"] * x**3, lambda th, x: torch.ones_like(x), lambda th, x: (x * x).sum())
    theta = {"k": torch.tensor(5.0, dtype=F64)}
    with pytest.raises(ft.errors.DivergenceError, match="stationary_cost: the paths became non-finite"):
        ft.stationary_cost(sde, theta, torch.ones(1, dtype=F64), particles=10, dt=0.1, steps=400, burn_in=10)


@pytest.mark.slow
@pytest.mark.filterwarnings("error::RuntimeWarning")  # a fallback from the trace-once kernel fails the test
def test_the_trace_once_kernel_of_the_frozen_step_equals_eager():
    sde, theta = _ou()
    x0 = torch.zeros(1, dtype=F64)
    options = dict(particles=16, dt=0.05, steps=300, burn_in=40, seed=4)
    eager = ft.stationary_cost(sde, theta, x0, compile=False, **options)
    compiled = ft.stationary_cost(sde, theta, x0, compile=True, **options)
    assert compiled.mean == pytest.approx(eager.mean, rel=1e-10)
    assert compiled.stderr == pytest.approx(eager.stderr, rel=1e-8)


def test_a_frozen_cost_run_carries_paths_and_sums_and_refuses_a_state():
    """The frozen evaluation has a state of its own kind: x, the float64 cost sums, theta, t (no sensitivity
    slot holding sums); ``run`` continues it from its Run and refuses a ``State`` by name."""
    sde, theta = _ou()
    problem = FrozenCost(sde, burn_in=5)
    start = problem.start(theta, torch.zeros(1, dtype=F64), 8)
    assert isinstance(start, FrozenPaths) and start.sums.dtype == F64 and start.average is None
    first = ft.run(problem, start, 10, 0.05, 0.0, 3, compile=False)
    both = ft.run(problem, first, 10, 0.05, 0.0, 3, compile=False)
    dw = BrownianNoise((8, 1), 0.05, seed=3, dtype=F64).draw(20)
    x, sums = start.x, torch.zeros(8, dtype=F64)
    for n in range(20):
        sums = sums + ((x * x).sum(-1) if n >= 5 else 0)
        x = x - theta["k"] * x * 0.05 + dw[n]
    torch.testing.assert_close(both.state.sums, sums, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(both.state.x, x, rtol=1e-12, atol=1e-12)
    assert torch.equal(both.state.theta["k"], theta["k"])
    with pytest.raises(TypeError, match="starts from a FrozenPaths"):
        ft.run(problem, ft.init(sde, theta, torch.zeros(1, dtype=F64), 8), 10, 0.05, 0.0)
