"""Ensembles (fwdtrain.ensemble): E members in one vmapped run equal E separate runs."""

import pytest
import torch

import fwdtrain as ft
from fwdtrain import ensemble as en
from fwdtrain.core._tree import leaves

f64 = torch.float64
DT = 0.01


def same(a, b) -> bool:
    """Bitwise equality of two pytrees of tensors (same structure)."""
    la, lb = leaves(a), leaves(b)
    return len(la) == len(lb) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(la, lb))


def records(history):
    """The per-record part of a History: step, t, cost, grad_norm, theta, average_cost."""
    return (history.step, history.t, history.cost, history.grad_norm, history.theta, history.average_cost)


def gain_sde():
    """dX = (-X + k X) dt + (0.8 + 0.2 tanh(k X)) dW, cost X^2 + (k X)^2: elementwise, no matrix products."""
    return ft.SDE(
        drift=lambda th, x: -x + th["k"] * x,
        diffusion=lambda th, x: 0.8 + 0.2 * torch.tanh(th["k"] * x),
        cost=lambda th, x: (x * x + (th["k"] * x) ** 2).sum(),
    )


def gain_state(ks, particles=4):
    sde = gain_sde()
    theta = {"k": torch.tensor(ks, dtype=f64).reshape(len(ks), 1)}
    return sde, en.init(sde, theta, torch.ones(1, dtype=f64), particles, stacked=True)


def lqr(seeds, hidden=4, dtype=f64, particles=4):
    """lqr-1d members, theta0 from each seed. hidden=4: every matrix product sums at most 4 terms."""
    exs = [ft.examples.lqr_1d(particles=particles, dtype=dtype, seed=s, hidden=hidden) for s in seeds]
    sde = exs[0].sde
    singles = [ft.init(sde, ex.theta, ex.x0, particles) for ex in exs]
    return sde, singles, en.stack(singles)


def single(sde, start, steps, lr, noise, mode="auto", check_every=100, **options):
    return ft.run(
        sde,
        start,
        steps,
        DT,
        lr,
        noise,
        save=ft.SaveAt(10),
        solver=ft.Euler(mode=mode),
        checks=ft.Checks(check_every),
        **options,
    )


def test_forward_mode_ensemble_is_bitwise_the_separate_runs():
    sde, state = gain_state([0.5, -0.2, 0.1])
    lrs = torch.tensor([0.3, 1.0, 3.0], dtype=f64)
    final, history = ft.run(
        en.Ensemble(sde, en.size(state)),
        state,
        45,
        DT,
        lrs,
        noise=5,
        save=ft.SaveAt(10),
        solver=ft.Euler(mode="forward"),
    )
    assert history.cost.shape == (5, 3) and history.theta["k"].shape == (5, 3, 1)
    assert history.diverged.tolist() == [False] * 3 and history.frozen_at.tolist() == [-1] * 3
    for e in range(3):
        alone, alone_history = single(sde, en.member(state, e), 45, lrs[e], 5 + e, mode="forward")
        assert same(en.member(final, e), alone)
        assert same(records(en.member_history(history, e)), records(alone_history))


def test_lqr_ensemble_with_per_member_schedules_equals_the_separate_runs_to_an_ulp():
    """The network's 4-term matrix products run batched (bmm) in the ensemble, unbatched (mm) alone:
    the same numbers to ~1 ulp (float64), the same seeds, schedules and step counts exactly."""
    sde, singles, state = lqr([0, 1, 2])
    lr = en.PerMember(
        ft.schedules.inverse_time,
        {"scale": torch.tensor([5.0, 10.0, 20.0], dtype=f64), "offset": torch.full((3,), 20.0, dtype=f64)},
    )
    final, history = ft.run(en.Ensemble(sde, en.size(state)), state, 30, DT, lr, noise=[7, 3, 9], save=ft.SaveAt(10))
    for e, (scale, seed) in enumerate(zip((5.0, 10.0, 20.0), (7, 3, 9))):
        alone, alone_history = single(sde, singles[e], 30, ft.schedules.inverse_time(scale, 20.0), seed)
        for got, want in zip(
            leaves((en.member(final, e), records(en.member_history(history, e)))),
            leaves((alone, records(alone_history))),
            strict=True,
        ):
            assert got.shape == want.shape and got.dtype == want.dtype
            torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-15)
        assert torch.equal(en.member_history(history, e).step, alone_history.step)


def test_a_wide_network_agrees_to_rounding():
    """With 16 hidden units a batched matmul (bmm) sums 16 terms in another order than the single run's
    mm: the members agree with the separate runs to a few ulp per step, not bitwise."""
    sde, singles, state = lqr([0, 1], hidden=16, dtype=torch.float32)
    final, _ = ft.run(en.Ensemble(sde, en.size(state)), state, 20, DT, 0.5, noise=0, save=ft.SaveAt(10))
    for e in range(2):
        alone, _ = single(sde, singles[e], 20, 0.5, e)
        for a, b in zip(leaves(en.member(final, e)), leaves(alone)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_resume_and_checkpoint_are_bitwise(tmp_path):
    sde, _, state = lqr([0, 1, 2])
    lrs = [0.5, 1.0, 2.0]
    whole = ft.run(en.Ensemble(sde, en.size(state)), state, 40, DT, lrs, noise=1, save=ft.SaveAt(10))
    half, half_history = ft.run(
        en.Ensemble(sde, en.size(state)),
        state,
        20,
        DT,
        lrs,
        noise=1,
        save=ft.SaveAt(10),
        hooks=(ft.Checkpointing(tmp_path / "e.pt"),),
    )
    resumed = ft.run(en.Ensemble(sde, 3), (half, half_history), 20, DT, lrs, noise=1, save=ft.SaveAt(10))
    assert same(whole[0], resumed[0]) and same(records(whole[1]), records(resumed[1]))
    loaded = ft.load(tmp_path / "e.pt")
    assert same(loaded.state, half) and same(records(loaded.history), records(half_history))
    assert torch.equal(loaded.history.diverged, half_history.diverged)
    again = ft.run(en.Ensemble(sde, 3), (loaded.state, loaded.history), 20, DT, lrs, noise=1, save=ft.SaveAt(10))
    assert same(whole[0], again[0]) and same(records(whole[1]), records(again[1]))
    ft.save(tmp_path / "bad.pt", half._replace(t=half.t[:2]), half_history)
    with pytest.raises(ft.CheckpointError, match="one clock per member"):
        ft.load(tmp_path / "bad.pt")
    # a member's own history continues it alone, as the run with its seed
    member_state, _ = single(sde, (en.member(half, 1), en.member_history(half_history, 1)), 20, 1.0, 2)
    assert same(member_state, en.member(whole[0], 1))


def test_a_diverging_member_is_frozen_and_flagged_the_others_go_on(tmp_path):
    sde, state = gain_state([0.5, 0.5, 0.1])
    lrs = torch.tensor([0.3, 1e4, 3.0], dtype=f64)
    seen = []
    final, history = ft.run(
        en.Ensemble(sde, en.size(state)),
        state,
        200,
        DT,
        lrs,
        noise=0,
        save=ft.SaveAt(10),
        checks=ft.Checks(10),
        solver=ft.Euler(mode="forward"),
        hooks=(ft.driver.Callback(lambda n, s: seen.append((n, s)), 5), ft.Progress(10, True)),
    )
    assert len(seen) == 40 and all(bool(torch.isfinite(s.x).all()) for n, s in seen if n % 10 == 0)  # shown frozen
    with pytest.raises(ft.DivergenceError) as caught:
        single(sde, en.member(state, 1), 200, lrs[1], 1, mode="forward", check_every=10)
    error = caught.value
    assert history.diverged.tolist() == [False, True, False]
    assert history.frozen_at.tolist() == [-1, error.last_finite_step, -1]
    assert same(en.member(final, 1), error.state)  # frozen at its last checked finite state
    frozen = history.step > error.last_finite_step
    assert torch.isnan(history.cost[frozen, 1]).all() and not torch.isnan(history.cost[~frozen, 1]).any()
    grid = error.history.step % 10 == 0  # the records up to the freeze (on the grid) are those of the run alone
    kept = int(grid.sum())
    alone_records = tuple(ft.core._tree.tree_map(lambda leaf: leaf[grid], records(error.history)))
    assert same(records(ft.core.history.records(en.member_history(history, 1), 0, kept)), alone_records)
    for e in (0, 2):  # bitwise the runs alone
        alone, alone_history = single(sde, en.member(state, e), 200, lrs[e], e, mode="forward", check_every=10)
        assert same(en.member(final, e), alone)
        assert same(records(en.member_history(history, e)), records(alone_history))
    # a checkpoint written during the run holds the frozen member frozen, and the flags
    from fwdtrain.driver import setup

    assert error.last_finite_step < 100
    loop = setup(
        en.Ensemble(sde, 3),
        state,
        200,
        DT,
        lrs,
        0,
        solver=ft.Euler(mode="forward"),
        save=ft.SaveAt(10),
        checks=ft.Checks(10),
        hooks=(ft.Checkpointing(tmp_path / "d.pt", every=100),),
    )
    loop.advance_to(150)
    saved = ft.load(tmp_path / "d.pt")
    assert saved.history.diverged.tolist() == [False, True, False] and saved.history.steps == 100
    assert same(en.member(saved.state, 1), error.state)
    resumed, _ = ft.run(
        en.Ensemble(sde, 3),
        (saved.state, saved.history),
        100,
        DT,
        lrs,
        noise=0,
        save=ft.SaveAt(10),
        checks=ft.Checks(10),
        solver=ft.Euler(mode="forward"),
    )
    assert same(resumed, final)


def test_all_members_diverged_raises_with_the_frozen_states():
    sde, state = gain_state([0.5, 0.5])
    with pytest.raises(ft.DivergenceError) as caught:
        ft.run(
            en.Ensemble(sde, en.size(state)),
            state,
            300,
            DT,
            [1e4, 2e4],
            noise=0,
            save=ft.SaveAt(10),
            checks=ft.Checks(10),
        )
    assert caught.value.history.diverged.tolist() == [True, True]
    assert torch.isfinite(caught.value.state.x).all()


def test_compiled_and_fused_equal_eager():
    sde, _, state = lqr([0, 1])
    lrs = [0.5, 2.0]
    eager = ft.run(
        en.Ensemble(sde, en.size(state)),
        state,
        24,
        DT,
        lrs,
        noise=3,
        save=ft.SaveAt(12),
        solver=ft.Euler(mode="reverse"),
    )
    for options in ({"compile": "eager"}, {"compile": ft.Compile(True, compiler="dynamo", backend="eager", chunk=8)}):
        compiled = ft.run(en.Ensemble(sde, en.size(state)), state, 24, DT, lrs, noise=3, save=ft.SaveAt(12), **options)
        assert same(compiled[0], eager[0]) and same(records(compiled[1]), records(eager[1])), options


def test_compiled_kernels_take_the_ensemble():
    sde, _, state = lqr([0, 1])
    ensemble = en.Ensemble(sde, 2)
    dw = torch.randn(4, 2, 4, 1, dtype=f64, generator=torch.Generator().manual_seed(0)) * DT**0.5
    alpha = torch.tensor([0.5, 2.0], dtype=f64)
    plan = ensemble.plan(state)
    one_step = ft.compile.function_kernel(
        lambda s, d, a: ensemble.advance(s, d, DT, a, plan),
        (state, dw[0], alpha),
        key=(ensemble, plan, DT),
        options=ft.Compile(True, compiler="dynamo", backend="eager"),
    )
    expected = state
    for k in range(4):
        expected, _ = ensemble.advance(expected, dw[k], DT, alpha, plan)
    stepped = state
    for k in range(4):
        stepped, _ = one_step(stepped, dw[k], alpha)
    assert same(stepped, expected)


def test_user_noise_tensor_has_a_member_axis():
    sde, state = gain_state([0.5, -0.2])
    noise = torch.randn(12, 2, 4, 1, dtype=f64, generator=torch.Generator().manual_seed(1)) * DT**0.5
    final, _ = ft.run(
        en.Ensemble(sde, en.size(state)),
        state,
        12,
        DT,
        0.5,
        noise=noise,
        save=ft.SaveAt(6),
        solver=ft.Euler(mode="forward"),
    )
    for e in range(2):
        alone, _ = single(sde, en.member(state, e), 12, 0.5, noise[:, e], mode="forward")
        assert same(en.member(final, e), alone)


def test_helpers_and_errors_before_any_step():
    sde, singles, state = lqr([0, 1, 2])
    assert en.size(state) == 3 and same(en.unstack(state), singles)
    shared = en.init(sde, singles[0].theta, torch.ones(1, dtype=f64), 4, members=2)
    assert en.size(shared) == 2 and same(en.member(shared, 1), singles[0])
    with pytest.raises(ValueError, match="members"):
        en.init(sde, singles[0].theta, torch.ones(1, dtype=f64), 4, members=0)
    with pytest.raises(ValueError, match="at least one member"):
        en.stack([])
    with pytest.raises(ValueError, match="ensemble has size 4"):
        ft.run(en.Ensemble(sde, 4), state, 1, DT, 0.1)
    with pytest.raises(ValueError, match="ensemble size E"):
        ft.run(en.Ensemble(sde, 0), state, 1, DT, 0.1)
    with pytest.raises(ValueError, match="leading member axis"):
        ft.run(en.Ensemble(sde, 3), state._replace(t=torch.zeros(2, dtype=f64)), 1, DT, 0.1)
    with pytest.raises(ValueError, match="3 entries"):
        ft.run(en.Ensemble(sde, en.size(state)), state, 1, DT, [0.1, 0.2])
    with pytest.raises(ValueError, match="3 members"):
        ft.run(
            en.Ensemble(sde, en.size(state)),
            state,
            1,
            DT,
            en.PerMember(ft.schedules.constant, {"value": torch.ones(2)}),
        )
    with pytest.raises(ValueError, match="noise= gives 2 seeds for an ensemble of 3 members"):
        ft.run(en.Ensemble(sde, en.size(state)), state, 1, DT, 0.1, noise=[1, 2])
    with pytest.raises(ValueError, match="non-finite entries.*members \\[1\\]"):
        bad = state._replace(x=state.x.clone().index_fill_(0, torch.tensor([1]), float("nan")))
        ft.run(en.Ensemble(sde, 3), bad, 1, DT, 0.1)


@pytest.mark.slow
def test_inductor_compiles_the_vmapped_step():
    """One real inductor compile (~20 s cold): no fallback to eager, the same numbers as eager."""
    import warnings

    sde, _, state = lqr([0, 1])
    eager = ft.run(
        en.Ensemble(sde, en.size(state)),
        state,
        8,
        DT,
        [0.5, 2.0],
        noise=3,
        save=ft.SaveAt(8),
        solver=ft.Euler(mode="reverse"),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a failed compile warns and runs eagerly
        compiled = ft.run(
            en.Ensemble(sde, en.size(state)), state, 8, DT, [0.5, 2.0], compile=True, noise=3, save=ft.SaveAt(8)
        )
    assert (compiled.history.route, eager.history.route) == ("compiled", "eager")
    same = lambda run: (run.state, run.history._replace(compiled=None, compiled_from=None))  # the numbers
    for a, b in zip(leaves(same(compiled)), leaves(same(eager))):
        if a.is_floating_point():
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
        else:
            assert torch.equal(a, b)


def test_ensemble_with_adam_and_averaging_equals_the_separate_runs():
    """The optimiser state and the Polyak average travel per member (one rule for all)."""
    exs = [ft.examples.lqr_1d(particles=4, dtype=f64, seed=s, hidden=4) for s in (0, 1)]
    sde, rule = exs[0].sde, ft.optim.adam()
    singles = [ft.init(sde, ex.theta, ex.x0, 4, optimizer=rule, average_from=0.1) for ex in exs]
    final, history = ft.run(
        en.Ensemble(sde, 2), en.stack(singles), 30, DT, 0.05, optimizer=rule, noise=4, save=ft.SaveAt(10)
    )
    assert history.theta_average is not None
    for e in range(2):
        alone, alone_history = single(sde, singles[e], 30, 0.05, 4 + e, optimizer=rule)
        assert torch.allclose(
            en.member(final, e).average.mean["weight0"], alone.average.mean["weight0"], rtol=1e-12, atol=1e-14
        )
        for got, want in zip(leaves(en.member(final, e)), leaves(alone)):
            assert torch.allclose(got, want, rtol=1e-12, atol=1e-14)
        assert torch.allclose(
            en.member_history(history, e).theta_average["weight0"],
            alone_history.theta_average["weight0"],
            rtol=1e-12,
            atol=1e-14,
        )


@pytest.mark.slow
@pytest.mark.filterwarnings("error::RuntimeWarning")  # a fallback to another route fails the test
def test_a_compiled_block_freezes_a_diverging_member_where_the_eager_block_does():
    """The block's kernel (AOTInductor) with members: the member that diverges is found at the same step and
    frozen at the same state as on the eager route, and the others run on as they do there."""
    sde, state = gain_state([0.5, 0.5, 0.1])
    lrs = torch.tensor([0.3, 1e4, 3.0], dtype=f64)
    runs = {
        compile: ft.run(
            en.Ensemble(sde, en.size(state)),
            state,
            200,
            DT,
            lrs,
            noise=0,
            save=ft.SaveAt(10),
            solver=ft.Euler(mode="forward"),
            compile=ft.Compile(compile, chunk=64),
        )
        for compile in (False, True)
    }
    (eager, eager_history), (compiled, compiled_history) = runs[False], runs[True]
    assert compiled_history.diverged.tolist() == eager_history.diverged.tolist() == [False, True, False]
    assert compiled_history.frozen_at.tolist() == eager_history.frozen_at.tolist()
    assert compiled_history.step.tolist() == eager_history.step.tolist()
    for a, b in zip(leaves(compiled), leaves(eager), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, equal_nan=True)
    torch.testing.assert_close(compiled_history.cost, eager_history.cost, rtol=1e-10, atol=1e-12, equal_nan=True)
