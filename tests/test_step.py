"""The pure step: purity, particles via vmap, reproducibility, constant memory."""

import gc
import math

import pytest
import torch
from conftest import nonlinear_2d

import fwdtrain as ft
from fwdtrain.core._tree import leaves, tree_map
from fwdtrain.core.sensitivity import linearise

DT = 0.01


def _random_state(sde, theta, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(n, 2, generator=g, dtype=torch.float64)
    state = ft.init(sde, theta, x0)
    return state._replace(
        x_tilde=tree_map(lambda leaf: torch.randn(leaf.shape, generator=g, dtype=leaf.dtype), state.x_tilde)
    )


def test_step_does_not_modify_its_inputs_and_returns_no_graph():
    sde, theta = nonlinear_2d()
    state = _random_state(sde, theta, 3)
    before = tree_map(torch.clone, state)
    dw = torch.randn(3, 3, dtype=torch.float64)
    dw_before = dw.clone()
    new = ft.step(sde, state, dw, DT, 0.5)
    for old, kept in zip(leaves(before), leaves(state)):
        assert torch.equal(old, kept)
    assert torch.equal(dw, dw_before)
    for leaf in leaves(new):
        assert leaf.grad_fn is None and not leaf.requires_grad
    for old, out in zip(leaves(state), leaves(new)):
        assert out.data_ptr() != old.data_ptr()  # nothing aliased: no in-place update possible


def test_step_is_pure_under_grad_mode_and_repeatable():
    sde, theta = nonlinear_2d()
    state = _random_state(sde, theta, 2)
    dw = torch.randn(2, 3, dtype=torch.float64)
    with torch.enable_grad():
        a = ft.step(sde, state, dw, DT, 0.5)
    b = ft.step(sde, state, dw, DT, 0.5)
    for left, right in zip(leaves(a), leaves(b)):
        assert torch.equal(left, right)
        assert left.grad_fn is None


def test_vmapped_particles_equal_separate_runs_with_frozen_theta():
    sde, theta = nonlinear_2d()
    n = 5
    state = _random_state(sde, theta, n)
    noise = torch.randn(30, n, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * math.sqrt(DT)
    batched = state
    singles = [
        ft.State(state.x[i : i + 1], tree_map(lambda leaf: leaf[i : i + 1], state.x_tilde), state.theta, state.t)
        for i in range(n)
    ]
    for dw in noise:
        batched = ft.step(sde, batched, dw, DT, 0.0)
        singles = [ft.step(sde, s, dw[i : i + 1], DT, 0.0) for i, s in enumerate(singles)]
    torch.testing.assert_close(batched.x, torch.cat([s.x for s in singles]), rtol=1e-13, atol=1e-13)
    for name in theta:
        torch.testing.assert_close(
            batched.x_tilde[name], torch.cat([s.x_tilde[name] for s in singles]), rtol=1e-13, atol=1e-13
        )


def test_vmapped_step_equals_loop_over_particles_with_training():
    """With lr > 0 the update uses the particle mean of G: compare with a Python loop over particles."""
    sde, theta = nonlinear_2d()
    n, lr = 4, 0.7
    state = _random_state(sde, theta, n)
    dw = torch.randn(n, 3, dtype=torch.float64) * math.sqrt(DT)
    new = ft.step(sde, state, dw, DT, lr)
    per_particle = [
        linearise(sde.coefficients, state.theta, state.x[i], tree_map(lambda leaf: leaf[i], state.x_tilde))
        for i in range(n)
    ]
    x = torch.stack([state.x[i] + lin.value.mu * DT + lin.value.sigma @ dw[i] for i, lin in enumerate(per_particle)])
    torch.testing.assert_close(new.x, x)
    for name, leaf in theta.items():
        grad = torch.stack([lin.total.cost[name] for lin in per_particle]).mean(0)
        torch.testing.assert_close(new.theta[name], leaf - lr * DT * grad)
        x_tilde = torch.stack(
            [
                state.x_tilde[name][i]
                + lin.total.mu[name] * DT
                + torch.tensordot(dw[i], lin.total.sigma[name].movedim(1, 0), dims=1)
                for i, lin in enumerate(per_particle)
            ]
        )
        torch.testing.assert_close(new.x_tilde[name], x_tilde)
    torch.testing.assert_close(new.t, state.t + DT)


def test_schedule_is_evaluated_at_time_n():
    sde, theta = nonlinear_2d()
    state = _random_state(sde, theta, 2)._replace(t=torch.tensor(49.995, dtype=torch.float64))
    dw = torch.zeros(2, 3, dtype=torch.float64)
    with_schedule = ft.step(sde, state, dw, DT, ft.schedules.staged(1.0))  # t_n = 49.995 < 50: alpha = 1
    with_number = ft.step(sde, state, dw, DT, 1.0)
    for a, b in zip(leaves(with_schedule.theta), leaves(with_number.theta)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_is_kept(dtype):
    ex = ft.examples.lqr_1d(dtype=dtype, particles=3)
    state = ft.init(ex.sde, ex.theta, ex.x0, particles=3)
    new = ft.step(ex.sde, state, torch.zeros(3, 1, dtype=dtype), ex.dt, 0.1)
    assert all(leaf.dtype == dtype for leaf in leaves((new.x, new.x_tilde, new.theta)))
    assert new.t.dtype == torch.float64  # the clock is float64 so that it does not drift


def test_scalar_parameters_keep_their_dtype_under_a_float64_clock():
    sde = ft.SDE(
        lambda th, x: -th["k"] * x, lambda th, x: torch.ones_like(x), lambda th, x: (x**2).sum() + th["k"] ** 2
    )
    state = ft.init(sde, {"k": torch.tensor(1.0)}, torch.ones(1), particles=2)
    new = ft.step(sde, state, torch.ones(2, 1) * 0.1, DT, ft.schedules.inverse_time(1.0))
    assert new.theta["k"].dtype == torch.float32 and new.theta["k"].shape == ()
    assert not torch.equal(new.theta["k"], state.theta["k"])


def test_float32_clock_does_not_drift():
    ex = ft.examples.lqr_1d(particles=1)
    state = ft.init(ex.sde, ex.theta, ex.x0)
    state, _ = ft.run(ex.sde, state, 3000, 0.01, 0.0, save=ft.SaveAt(3000))
    assert abs(float(state.t) - 30.0) < 1e-9


def test_run_is_reproducible_from_a_seed():
    ex = ft.examples.lqr_1d(particles=8)
    state = ft.init(ex.sde, ex.theta, ex.x0, particles=8)
    a, ha = ft.run(ex.sde, state, 150, ex.dt, ex.lr, noise=7, save=ft.SaveAt(50))
    b, hb = ft.run(ex.sde, state, 150, ex.dt, ex.lr, noise=7, save=ft.SaveAt(50))
    c, _ = ft.run(ex.sde, state, 150, ex.dt, ex.lr, noise=8, save=ft.SaveAt(50))
    for left, right in zip(leaves((a, ha)), leaves((b, hb))):
        assert torch.equal(left, right)
    assert not torch.equal(a.x, c.x)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.slow
def test_memory_is_flat_over_20000_steps():
    """20,000 steps through the driver's loop over the step kernel: no graph, no growing allocation."""
    sde = ft.SDE(lambda th, x: -th["k"] * x, lambda th, x: torch.ones_like(x), lambda th, x: (x**2).sum())
    theta = {"k": torch.tensor([1.0])}
    state = ft.init(sde, theta, torch.ones(1), particles=4)
    state, _ = ft.run(sde, state, 500, DT, 0.01, compile=False, save=ft.SaveAt(500))  # warm-up: allocator, dispatch
    gc.collect()
    rss0, objects0 = _rss_bytes(), len(gc.get_objects())
    state, _ = ft.run(sde, state, 20_000, DT, 0.01, compile=False, save=ft.SaveAt(20_000))  # the eager loop
    gc.collect()
    grown = _rss_bytes() - rss0
    assert grown < 8 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over 20,000 steps"
    assert len(gc.get_objects()) - objects0 < 1000
    assert state.x_tilde["k"].grad_fn is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_compiled_loops_clocks_round_as_the_steps_own_t_plus_dt(dtype):
    """``block.clocks`` precomputes t_k for a block of compiled steps (their learning rates alpha(t_k)); each
    must equal, bitwise, the clock the step itself reaches by adding dt k times in t's dtype."""
    from fwdtrain.driver.block import clocks

    generator = torch.Generator().manual_seed(0)
    for shape, dt, count in [((), 0.01, 257), ((3,), 1 / 3, 100), ((2, 2), 7e-4, 64), ((), 0.05, 1)]:
        t = (torch.rand(shape, generator=generator, dtype=torch.float64) * 1000).to(dtype)
        rows = [t]
        for _ in range(count - 1):
            rows.append(rows[-1] + dt)
        assert torch.equal(clocks(t, dt, count), torch.stack(rows))


def test_the_old_module_name_of_the_step_warns_and_gives_the_same_names():
    import importlib
    import sys

    import fwdtrain.core.step as step_module

    sys.modules.pop("fwdtrain.core.kernel", None)
    with pytest.warns(DeprecationWarning, match=r"fwdtrain.core.kernel is fwdtrain.core.step"):
        old = importlib.import_module("fwdtrain.core.kernel")
    assert old.StepInfo is step_module.StepInfo and old.__all__ == step_module.__all__
