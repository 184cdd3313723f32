"""Compiled and fused steps against eager ``advance``: same states (float64, same noise), no recompiles.

torch.compile (inductor) takes tens of seconds per graph on a small CPU, so there are
two inductor graphs here, both of a 1 -> 4 -> 1 network: one step, and two fused steps.
"""

import math

import pytest
import torch
import torch._dynamo

import fwdtrain as ft
from fwdtrain._tree import leaves
from fwdtrain.compiled import compile_advance, compile_steps
from fwdtrain.euler import advance

DT = 0.01
PARTICLES = 3


@pytest.fixture
def problem():
    ex = ft.examples.lqr_1d(dtype=torch.float64, hidden=4)
    state = ft.init(ex.sde, ex.theta, torch.tensor([[0.8], [-0.2], [1.5]], dtype=torch.float64))
    noise = torch.randn(6, PARTICLES, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    return ex.sde, state, noise * math.sqrt(DT)


def assert_trees_close(actual, expected):
    for a, e in zip(leaves(actual), leaves(expected), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a fallback to eager fails the test
def test_compiled_step_equals_eager_and_never_recompiles(problem):
    sde, state, noise = problem
    one_step = compile_advance(sde, DT, "reverse")
    schedule = ft.schedules.inverse_time(2.0)
    compiled, eager = state, state
    compiled, _ = one_step(compiled, noise[0], schedule(compiled.t))  # warm-up: the one compilation
    eager, _ = advance(sde, eager, noise[0], DT, schedule(eager.t), "reverse")
    torch._dynamo.utils.counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for dw in noise[1:]:  # t and alpha change every step: new data, not new graphs
            compiled, compiled_info = one_step(compiled, dw, schedule(compiled.t))
            eager, eager_info = advance(sde, eager, dw, DT, schedule(eager.t), "reverse")
        compiled, _ = one_step(compiled, noise[0], 0.25)  # a plain number for alpha as well
        eager, _ = advance(sde, eager, noise[0], DT, torch.tensor(0.25, dtype=torch.float64), "reverse")
    assert sum(torch._dynamo.utils.counters["recompiles"].values()) == 0
    assert_trees_close(compiled, eager)
    assert_trees_close(compiled_info, eager_info)
    assert float(compiled.t) == pytest.approx(7 * DT)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_fused_steps_equal_eager_steps(problem):
    sde, state, noise = problem
    lr = ft.schedules.piecewise_constant([0.5, 0.1], [0.015])  # the switch falls inside the chunk
    fused = compile_steps(sde, DT, lr, "reverse", 2)
    compiled, info = fused(state, noise[:2])
    compiled, info = fused(compiled, noise[2:4])
    eager, costs, gradients = state, [], []
    for dw in noise[:4]:
        eager, step_info = advance(sde, eager, dw, DT, lr(eager.t), "reverse")
        costs.append(step_info.cost)
        gradients.append(step_info.gradient)
    assert_trees_close(compiled, eager)
    torch.testing.assert_close(info.cost, torch.stack(costs[2:]), rtol=1e-10, atol=1e-12)
    for name, g in info.gradient.items():
        torch.testing.assert_close(g, torch.stack([step[name] for step in gradients[2:]]), rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="noise must have shape"):
        fused(compiled, noise[:3])


def _failing_backend(graph_module, example_inputs):
    raise RuntimeError("no compiler here")


def test_compile_failure_falls_back_to_eager_with_a_warning(problem):
    sde, state, noise = problem
    one_step = compile_advance(sde, DT, "reverse", backend=_failing_backend)
    with pytest.warns(RuntimeWarning, match="running it eagerly"):
        fallback, _ = one_step(state, noise[0], 0.3)
    expected, _ = advance(sde, state, noise[0], DT, torch.tensor(0.3, dtype=torch.float64), "reverse")
    assert_trees_close(fallback, expected)


def test_mode_must_be_resolved():
    ex = ft.examples.lqr_1d(dtype=torch.float64, hidden=4)
    with pytest.raises(ValueError, match="mode must be 'reverse' or 'forward'"):
        compile_advance(ex.sde, DT, "auto")


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_run_with_compile_and_fuse_equals_eager_run():
    """run(fuse=4): fused calls between events, single compiled steps to reach them (record_every=10)."""
    ex = ft.examples.lqr_1d(dtype=torch.float64, hidden=4, particles=PARTICLES)
    state = ft.init(ex.sde, ex.theta, ex.x0, particles=PARTICLES)
    options = dict(record_every=10, check_every=10, seed=3, mode="reverse")
    eager, eager_history = ft.run(ex.sde, state, 26, DT, ex.lr, **options)
    fused, fused_history = ft.run(ex.sde, state, 26, DT, ex.lr, fuse=4, **options)
    assert_trees_close(fused, eager)
    for name in ("step", "t", "cost", "grad_norm", "average_cost", "theta"):
        assert_trees_close(getattr(fused_history, name), getattr(eager_history, name))


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_step_with_compile_equals_eager_step(problem):
    sde, state, noise = problem
    compiled, eager = state, state
    for dw in noise[:3]:
        compiled = ft.step(sde, compiled, dw, DT, ft.schedules.inverse_time(1.0), mode="reverse", compile=True)
        eager = ft.step(sde, eager, dw, DT, ft.schedules.inverse_time(1.0), mode="reverse")
    assert_trees_close(compiled, eager)
    assert all(leaf.grad_fn is None for leaf in leaves(compiled))
