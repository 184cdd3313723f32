"""The loop around the steps: subnormals flushed while it steps, the learning rates of a compiled block made
once, the divergence check and the records' gradient norm as fused reductions, the kernels' inductor options."""

import math

import pytest
import torch

import fwdtrain as ft
from fwdtrain import _compat
from fwdtrain.compile import kernels
from fwdtrain.core._tree import norm, peak, squared_norm

DT = 0.01
QUICK = ft.Compile(True, compiler="dynamo", backend="eager")
TINY = 1e-39  # a float32 subnormal


def decaying_problem(x0: float = TINY, particles: int = 2):
    """dX = (-X + u) dt, u = -k X, in float32 with no noise: X decays from x0."""
    sde = ft.ControlledSDE(
        control=lambda th, x: -th["k"] * x,
        drift=lambda x, u: -x + u,
        diffusion=lambda x, u: torch.zeros_like(x),
        cost=lambda x, u: (x * x + u * u).sum(),
    )
    theta = {"k": torch.tensor(0.5)}
    return sde, ft.init(sde, theta, torch.full((1,), x0), particles)


def test_subnormals_flushed_sets_and_restores_the_mode():
    assert not _compat.flushing_subnormals()
    with _compat.subnormals_flushed():
        assert _compat.flushing_subnormals()
        assert (torch.full((1,), TINY) * 1.0)[0] == 0
        with _compat.subnormals_flushed():  # already on: left on by the inner block
            assert _compat.flushing_subnormals()
        assert _compat.flushing_subnormals()
    assert not _compat.flushing_subnormals()
    assert (torch.full((1,), TINY) * 1.0)[0] != 0
    with _compat.subnormals_flushed(False):
        assert not _compat.flushing_subnormals()


@pytest.mark.parametrize("compile", [False, QUICK], ids=["eager", "compiled"])
def test_a_run_steps_with_subnormals_flushed_unless_asked_not_to(compile):
    sde, state = decaying_problem()
    seen = []
    hook = ft.driver.Callback(lambda n, s: seen.append(_compat.flushing_subnormals()), every=5)
    flushed, _ = ft.run(sde, state, 10, DT, 0.0, compile=compile, hooks=hook)
    assert seen == [True, True] and not _compat.flushing_subnormals()  # the caller's mode is back
    assert torch.equal(flushed.x, torch.zeros_like(flushed.x))  # a subnormal x is read as zero
    options = (compile if isinstance(compile, ft.Compile) else ft.Compile(False))._replace(flush_subnormals=False)
    seen.clear()
    kept, _ = ft.run(sde, state, 10, DT, 0.0, compile=options, hooks=hook)
    assert seen == [False, False]
    assert bool((kept.x > 0).all()) and bool((kept.x < TINY).all())  # IEEE: still subnormal, decayed


def test_flushing_changes_nothing_above_the_subnormals():
    sde, state = decaying_problem(x0=1.0)
    flushed, history = ft.run(sde, state, 50, DT, 0.1, compile=False)
    kept, kept_history = ft.run(sde, state, 50, DT, 0.1, compile=ft.Compile(False, flush_subnormals=False))
    assert torch.equal(flushed.x, kept.x) and torch.equal(flushed.theta["k"], kept.theta["k"])
    assert torch.equal(history.cost, kept_history.cost)


def test_flush_subnormals_must_be_a_bool():
    sde, state = decaying_problem()
    with pytest.raises(TypeError, match="flush_subnormals"):
        ft.run(sde, state, 5, DT, 0.1, compile=ft.Compile(False, flush_subnormals=1))


def test_a_compiled_block_never_asks_the_schedule_past_the_drawn_steps():
    sde, state = decaying_problem(x0=1.0)
    end = 37 * DT
    asked = []

    def schedule(t):
        asked.append(float(torch.as_tensor(t).max()))
        if float(torch.as_tensor(t).max()) > end + DT / 2:
            raise IndexError(f"no learning rate past t = {end}")
        return 0.1 / (1 + torch.as_tensor(t))

    compiled, history = ft.run(sde, state, 37, DT, schedule, save=ft.SaveAt(10), compile=QUICK)
    eager, eager_history = ft.run(sde, state, 37, DT, schedule, save=ft.SaveAt(10), compile=False)
    assert max(asked) <= end + DT / 2
    assert torch.equal(compiled.theta["k"], eager.theta["k"]) and torch.equal(history.cost, eager_history.cost)


def test_a_compiled_block_makes_its_rates_once():
    sde, state = decaying_problem(x0=1.0)
    calls = []

    def schedule(t):
        calls.append(torch.as_tensor(t).numel())
        return 0.1 / (1 + torch.as_tensor(t))

    options = QUICK._replace(chunk=64)
    ft.run(sde, state, 64, DT, schedule, save=ft.SaveAt(8), checks=ft.Checks(8), compile=options)
    block_calls = [n for n in calls if n > 1]  # the block's clocks at once (single clocks: the start, the marker)
    assert len(block_calls) == 1 and block_calls[0] == 65  # the block's 64 clocks and that of its last state


def test_peak_is_the_largest_magnitude_and_propagates_nan():
    values = [torch.tensor([1.0, -3.0]), torch.zeros(0), torch.tensor([[2.0]], dtype=torch.float64)]
    assert peak(values) == 3.0
    assert peak([*values, torch.tensor([-7], dtype=torch.int64)]) == 7
    assert math.isnan(float(peak([*values, torch.tensor([float("nan")])])))
    assert math.isinf(float(peak([torch.tensor([-float("inf"), 1.0])])))


def test_the_records_gradient_norm_equals_the_norm_over_every_leaf():
    gradient = {"a": torch.randn(3, 4, generator=torch.Generator().manual_seed(0)), "b": torch.tensor([2.0])}
    assert torch.allclose(norm(gradient), squared_norm(gradient).sqrt(), rtol=1e-6, atol=0)


def test_kernels_fuse_concatenations_only_for_a_tiny_state():
    tiny = kernels.inductor_options({"x": torch.zeros(100)})
    wide = kernels.inductor_options({"x": torch.zeros(kernels.FUSED_CAT_UP_TO + 1)})
    assert tiny["force_pointwise_cat"] is True and "force_pointwise_cat" not in wide
    assert tiny["cpp.threads"] == wide["cpp.threads"] == 1
