"""The compiled loop's fast path: a block's checks and records observed inside its kernel, one call per block,
giving what the ordinary path (one kernel call per event, checks and records in Python) gives."""

import collections
import math

import pytest
import torch

import fwdtrain as ft
from fwdtrain.compile import kernels
from fwdtrain.driver import loop

COMPILED = ft.Compile(True, chunk=128)


def calls(monkeypatch) -> collections.Counter:
    """Counts of the observed kernel's calls and of the ordinary loop kernel's calls."""
    counter: collections.Counter = collections.Counter()
    for owner, name in ((kernels.ObservedKernel, "observe_call"), (kernels.LoopKernel, "__call__")):
        original = getattr(owner, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            counter[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(owner, name, counted)
    return counter


def ordinary(monkeypatch) -> None:
    """Every block on the ordinary path (no block can hold its events)."""
    monkeypatch.setattr(loop, "MAX_STOPS", 0)


def seed_problem():
    ex = ft.examples.lqr_1d(dtype=torch.float32, hidden=4, particles=3)
    return ex.sde, ft.init(ex.sde, ex.theta, ex.x0, 3)


def two_segments():
    """250 steps, then 70 more from the Run: records every 20 and at both ends (off the grid), checks every 30."""
    sde, state = seed_problem()
    options = {"save": ft.SaveAt(20), "checks": ft.Checks(30, bound=1e6), "compile": COMPILED}
    first = ft.run(sde, state, 250, 0.01, 0.3, 0, **options)
    return first, ft.run(sde, first, 70, 0.01, 0.3, 1, **options)


def test_a_block_observes_its_events_in_one_call_and_records_what_the_ordinary_path_records(monkeypatch):
    counted = calls(monkeypatch)
    fast_first, fast = two_segments()
    assert counted["observe_call"] == 3 and counted["__call__"] == 0  # blocks of 128, 122 and 70 steps
    with monkeypatch.context() as patch:
        ordinary(patch)
        slow_first, slow = two_segments()
    assert counted["observe_call"] == 3 and counted["__call__"] > 20  # one call per event
    assert fast_first.history.step.tolist() == [*range(20, 250, 20), 250]
    assert fast.history.step.tolist() == [*range(20, 250, 20), 250, *range(260, 321, 20)]
    for got, want in ((fast_first, slow_first), (fast, slow)):
        for name in ("step", "t", "cost", "average_cost"):
            assert torch.equal(getattr(got.history, name), getattr(want.history, name)), name
        torch.testing.assert_close(got.history.grad_norm, want.history.grad_norm, rtol=1e-5, atol=0)
        for key in want.history.theta:
            assert torch.equal(got.history.theta[key], want.history.theta[key])
        for a, b in zip(ft.core._tree.leaves(got.state), ft.core._tree.leaves(want.state), strict=True):
            assert torch.equal(a, b)
        assert torch.equal(got.history.carry["cost_total"], want.history.carry["cost_total"])
        assert got.history.carry["window_start"] == want.history.carry["window_start"]


def cubic_problem():
    """dX = theta X^3 dt + dW blows up in a few steps from x = 2."""
    sde = ft.SDE(
        drift=lambda th, x: th["a"] * x**3, diffusion=lambda th, x: torch.ones_like(x), cost=lambda th, x: (x * x).sum()
    )
    x0 = torch.full((1,), 2.0, dtype=torch.float64)
    return sde, ft.init(sde, {"a": torch.tensor(1.0, dtype=torch.float64)}, x0, 2)


def diverged(**options) -> ft.DivergenceError:
    sde, state = cubic_problem()
    with pytest.raises(ft.DivergenceError) as caught:
        ft.run(sde, state, 1000, 0.1, 0.0, save=ft.SaveAt(2), checks=ft.Checks(4), **options)
    return caught.value


def test_a_block_that_diverges_is_stepped_again_event_by_event_and_raises_the_same_error(monkeypatch):
    counted = calls(monkeypatch)
    fast = diverged(compile=ft.Compile(True, chunk=64))
    assert counted["observe_call"] == 1 and counted["__call__"] > 0  # observed, failed, stepped again
    with monkeypatch.context() as patch:
        ordinary(patch)
        slow = diverged(compile=ft.Compile(True, chunk=64))
    eager = diverged(compile=False)
    for error in (fast, slow):
        assert (error.step, error.last_finite_step) == (eager.step, eager.last_finite_step)
        assert str(error) == str(eager)
        assert torch.equal(error.state.x, eager.state.x) and torch.equal(error.history.step, eager.history.step)


def test_a_learning_rate_that_turns_infinite_mid_block_raises_at_the_step_that_reaches_it(monkeypatch):
    sde, state = seed_problem()

    def lr(t):  # inf for 0.8 <= t < 1.5: from step 80's on (a run's ends are checked before it starts)
        t = torch.as_tensor(t)
        return 0.1 / ((t < 0.795) | (t > 1.5)).to(torch.float32)

    def error() -> ft.DivergenceError:
        with pytest.raises(ft.DivergenceError, match="a learning rate must be finite") as caught:
            ft.run(sde, state, 200, 0.01, lr, 0, save=ft.SaveAt(20), checks=ft.Checks(10), compile=COMPILED)
        return caught.value

    counted = calls(monkeypatch)
    fast = error()
    assert counted["observe_call"] == 0  # the block's rates were not finite: stepped event by event
    with monkeypatch.context() as patch:
        ordinary(patch)
        slow = error()
    assert fast.step == slow.step == 80 and str(fast) == str(slow)  # alpha(t_80) is inf: state 79 kept
    assert fast.last_finite_step == 79 and fast.history.steps == 79
    assert torch.equal(fast.state.x, slow.state.x)
    assert math.isfinite(float(fast.state.x.abs().max()))


def test_hooks_members_and_a_record_function_of_ones_own_take_the_ordinary_path(monkeypatch):
    counted = calls(monkeypatch)
    sde, state = seed_problem()
    ft.run(sde, state, 40, 0.01, 0.3, save=ft.SaveAt(20, record=lambda s: s.theta), compile=COMPILED)
    ft.run(sde, state, 40, 0.01, 0.3, hooks=(ft.driver.Callback(lambda n, s: None, 20),), compile=COMPILED)
    assert counted["observe_call"] == 0 and counted["__call__"] > 0


def test_auto_takes_the_fast_path_from_the_step_after_its_counted_one(monkeypatch):
    """compile="auto" that chooses to compile steps the rest of its first block, and every later block, through
    the observed loop (the ordinary loop kernel is never called, so never compiled), and gives what the
    compiled run gives."""
    from fwdtrain.compile import route

    counted = calls(monkeypatch)
    monkeypatch.setattr(route, "choose", lambda *args: route.Route(True, "asked to by the test"))
    sde, state = seed_problem()
    options = {"save": ft.SaveAt(20), "checks": ft.Checks(30, bound=1e6)}
    auto = ft.driver.setup(sde, state, 250, 0.01, 0.3, 0, compile=ft.Compile("auto", chunk=128), **options)
    result = ft.driver.execute(auto)
    assert counted["__call__"] == 0 and counted["observe_call"] == 2  # the rest of block one, then block two
    assert result.history.route == "compiled" and auto.route.reason == "asked to by the test"
    compiled = ft.run(sde, state, 250, 0.01, 0.3, 0, compile=COMPILED, **options)
    got = result.history
    assert got.step.tolist() == compiled.history.step.tolist()
    for key in compiled.history.theta:  # the first steps were eager: equal to rounding, not bit for bit
        torch.testing.assert_close(got.theta[key], compiled.history.theta[key], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(result.state.theta, compiled.state.theta, rtol=1e-5, atol=1e-6)
