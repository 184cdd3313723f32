"""A block of steps is one kernel call, with its learning rates, checks and records inside: what it gives equals
the eager block (the same function, stepped in Python), a failed check names its own step, members freeze."""

import collections
import math

import pytest
import torch

import fwdtrain as ft
from fwdtrain.compile import graphs, kernels

COMPILED = ft.Compile(True, chunk=128)


def calls(monkeypatch) -> collections.Counter:
    """Counts of the compiled kernels' calls and of the eager blocks (``graphs.run_block``)."""
    counter: collections.Counter = collections.Counter()
    original_call, original_block = kernels.Kernel.__call__, graphs.run_block

    def kernel_call(self, *args, **kwargs):
        counter["kernel"] += 1
        return original_call(self, *args, **kwargs)

    def eager_block(*args, **kwargs):
        counter["eager"] += 1
        return original_block(*args, **kwargs)

    monkeypatch.setattr(kernels.Kernel, "__call__", kernel_call)
    monkeypatch.setattr(graphs, "run_block", eager_block)
    return counter


def seed_problem():
    ex = ft.examples.lqr_1d(dtype=torch.float32, hidden=4, particles=3)
    return ex.sde, ft.init(ex.sde, ex.theta, ex.x0, 3)


def two_segments(compile):
    """250 steps, then 70 more from the Run: records every 20 and at both ends (off the grid)."""
    sde, state = seed_problem()
    options = {"save": ft.SaveAt(20), "checks": ft.Checks(30, bound=1e6), "compile": compile}
    first = ft.run(sde, state, 250, 0.01, 0.3, 0, **options)
    return first, ft.run(sde, first, 70, 0.01, 0.3, 1, **options)


def test_a_block_is_one_kernel_call_and_records_what_the_eager_block_records(monkeypatch):
    counted = calls(monkeypatch)
    fast_first, fast = two_segments(COMPILED)
    assert counted["kernel"] == 3 and counted["eager"] <= 1  # blocks of 128, 122 and 70 (a loaded one is checked)
    before = counted["eager"]
    slow_first, slow = two_segments(False)
    assert counted["eager"] - before == 2  # one block of each segment (the default chunk: 1,024 steps)
    assert fast_first.history.step.tolist() == [*range(20, 250, 20), 250]
    assert fast.history.step.tolist() == [*range(20, 250, 20), 250, *range(260, 321, 20)]
    for got, want in ((fast_first, slow_first), (fast, slow)):
        for name in ("step", "t"):
            assert torch.equal(getattr(got.history, name), getattr(want.history, name)), name
        for name in ("cost", "average_cost", "grad_norm"):
            torch.testing.assert_close(getattr(got.history, name), getattr(want.history, name), rtol=1e-5, atol=1e-7)
        for key in want.history.theta:
            torch.testing.assert_close(got.history.theta[key], want.history.theta[key], rtol=1e-5, atol=1e-7)
        for a, b in zip(ft.core._tree.leaves(got.state), ft.core._tree.leaves(want.state), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
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
        ft.run(sde, state, 1000, 0.1, 0.0, save=ft.SaveAt(2), **options)
    return caught.value


def test_a_block_that_diverges_stops_at_that_step_and_keeps_the_one_before(monkeypatch):
    counted = calls(monkeypatch)
    fast = diverged(compile=ft.Compile(True, chunk=64))
    assert counted["kernel"] == 1  # the block, which hands back its carry at the last passed check
    eager = diverged(compile=False)
    assert fast.last_finite_step == fast.step - 1 and fast.history.steps == fast.step - 1
    assert (fast.step, fast.last_finite_step) == (eager.step, eager.last_finite_step)
    assert str(fast) == str(eager)
    assert torch.equal(fast.state.x, eager.state.x) and torch.equal(fast.history.step, eager.history.step)
    assert math.isfinite(float(fast.state.x.abs().max()))
    # the state kept is the one before the failing step: one more step from it is not finite
    sde, _ = cubic_problem()
    dw = ft.noise.BrownianNoise(tuple(fast.state.x.shape), 0.1, seed=0, dtype=torch.float64).draw(fast.step)[-1]
    after = ft.step(sde, fast.state, dw, 0.1, 0.0)
    assert not bool(torch.isfinite(after.x).all())


def test_a_failed_stage_that_the_eager_steps_pass_goes_on_from_them(monkeypatch):
    """A compiled stage may blow up where the eager steps, which differ from it by rounding, do not (a run at the
    edge of diverging parts ways): the loop steps the stage again eagerly, and where every step passes, the run
    goes on from there, its record taken, as if the stage had passed. Here the first block says it failed at once."""
    from fwdtrain.driver import block

    original, said = block.Block.__call__, []

    def fails_first(self, carry, dw, start, count, alive):
        if not said:
            said.append(carry.n)
            return block.Outcome(carry, None, stage_end=carry.n + 20)  # the first stage: the record grid
        return original(self, carry, dw, start, count, alive)

    sde, state = seed_problem()
    options = {"save": ft.SaveAt(20), "checks": ft.Checks(30), "compile": False}
    want = ft.run(sde, state, 100, 0.01, 0.3, 0, **options)
    monkeypatch.setattr(block.Block, "__call__", fails_first)
    got = ft.run(sde, state, 100, 0.01, 0.3, 0, **options)
    assert said == [0]
    assert got.history.step.tolist() == want.history.step.tolist() == [20, 40, 60, 80, 100]
    for name in ("t", "cost", "average_cost", "grad_norm"):
        torch.testing.assert_close(getattr(got.history, name), getattr(want.history, name), rtol=1e-6, atol=1e-9)
    for a, b in zip(ft.core._tree.leaves(got.state), ft.core._tree.leaves(want.state), strict=True):
        assert torch.equal(a, b)


def test_a_learning_rate_that_turns_infinite_mid_block_raises_at_the_step_that_reaches_it(monkeypatch):
    sde, state = seed_problem()

    def lr(t):  # inf for 0.8 <= t < 1.5: from step 80's on (a run's ends are checked before it starts)
        t = torch.as_tensor(t)
        return 0.1 / ((t < 0.795) | (t > 1.5)).to(torch.float32)

    def error(compile) -> ft.DivergenceError:
        with pytest.raises(ft.DivergenceError, match="a learning rate must be finite") as caught:
            ft.run(sde, state, 200, 0.01, lr, 0, save=ft.SaveAt(20), compile=compile)
        return caught.value

    counted = calls(monkeypatch)
    fast = error(COMPILED)
    assert counted["kernel"] == 1  # the rates are known before the block: it stops before step 80
    slow = error(False)
    assert fast.step == slow.step == 80 and str(fast) == str(slow)  # alpha(t_80) is inf: state 79 kept
    assert fast.last_finite_step == 79 and fast.history.steps == 79
    torch.testing.assert_close(fast.state.x, slow.state.x)
    assert math.isfinite(float(fast.state.x.abs().max()))


def test_hooks_end_blocks_at_their_turns_and_a_record_function_of_ones_own_runs_inside(monkeypatch):
    counted = calls(monkeypatch)
    sde, state = seed_problem()
    seen = []
    own = ft.run(sde, state, 40, 0.01, 0.3, save=ft.SaveAt(20, record=lambda s: s.x.mean()), compile=COMPILED)
    assert counted["kernel"] == 1 and own.history.theta.shape == (2,)
    ft.run(sde, state, 40, 0.01, 0.3, hooks=(ft.driver.Callback(lambda n, s: seen.append(n), 10),), compile=COMPILED)
    assert counted["kernel"] == 5 and seen == [10, 20, 30, 40]  # one block per turn of the callback


def test_a_tiered_run_steps_eager_blocks_until_its_switch_then_one_kernel_call_a_block(monkeypatch, tmp_path):
    """The default: eager blocks (``graphs.run_block``) while the kernel compiles in another process, then, from the
    first block after it is ready (step 100 here), one kernel call per block; to rounding the compiled run."""
    from test_run_policy import WaitForCompile, fake_compiler

    fake_compiler(monkeypatch, tmp_path)
    counted = calls(monkeypatch)
    sde, state = seed_problem()
    options = {"save": ft.SaveAt(20), "checks": ft.Checks(30, bound=1e6)}
    tiered = ft.Compile(chunk=128, after=200)
    result = ft.run(sde, state, 250, 0.01, 0.3, 0, compile=tiered, hooks=WaitForCompile(100), **options)
    assert counted["eager"] == 1 and counted["kernel"] == 3  # the block to 100; then to 128 (a chunk), 200, 250
    assert int(result.history.compiled_from) == 100
    compiled = ft.run(sde, state, 250, 0.01, 0.3, 0, compile=False, **options)
    got = result.history
    assert got.step.tolist() == compiled.history.step.tolist()
    for key in compiled.history.theta:
        torch.testing.assert_close(got.theta[key], compiled.history.theta[key], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(result.state.theta, compiled.state.theta, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("unroll", [1, 3])
def test_the_block_loop_module_run_eagerly_is_run_block(unroll):
    """``graphs.BlockLoop`` (what AOTInductor compiles), run eagerly with plain functions, gives ``run_block``: the
    steps to the last passed check, the records on the grid, the carry there (also where a later check failed),
    with its steps one at a time or ``unroll`` at a time."""

    def body(x, total, dw, alive):
        new = x + dw
        return new, total + new.sum()

    def check(x, total, alive):
        return (x.abs().amax() < 6.5) & alive

    def observe(x, total):
        return x.sum(), total

    x, total = torch.zeros(3, dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    dw = torch.ones(16, 3, dtype=torch.float64)
    for check_every in (4, 2):
        grids = graphs.Grids(9, 2, 5, 3, check_every)  # steps 6 .. 14 from n0 = 5, records at 6, 9, 12
        module = graphs.BlockLoop(body, check, observe, 1, capacity=5, unroll=unroll)
        flat = module(*(torch.tensor(v) for v in grids), torch.tensor(True), dw, x, total)
        want = graphs.run_block(body, check, observe, 5, grids, (dw,), torch.tensor(True), (x, total))
        assert int(flat[0]) == int(want.done) and bool(flat[1]) == bool(want.ok) and int(flat[2]) == int(want.rows)
        assert all(torch.equal(got, kept) for got, kept in zip(flat[3:5], want.carry, strict=True))  # the last good
        rows = int(want.rows) + 1  # the row after the last kept one is written too (the failed stage's)
        for got, expected in zip(flat[5:], want.tables, strict=True):
            assert torch.equal(got[:rows], expected[:rows])
        # x = 7 (step 12) fails; stages end at the checks (every 4: 8, 12; every 2: 6, 8, 10, 12) and records (9)
        assert (int(want.done), bool(want.ok), int(want.rows)) == ((4, False, 2) if check_every == 4 else (5, False, 2))
        assert torch.equal(want.carry[0], torch.full((3,), float(want.done), dtype=torch.float64))
