"""The optimisers of ``fwdtrain.optim`` in training: the state carries opt_state and the running average,
the rule is bound to the problem side, and everything stays bitwise, resumable and transformable.

Every check compares against something computed another way: the plain update (``fwdtrain.core.step.descend``),
a run without a checkpoint, a direct mean of recorded iterates, central differences or a Python loop.
"""

import json

import pytest
import torch
from conftest import diagonal_2d, nonlinear_2d
from torch.func import grad, vmap

import fwdtrain as ft
from fwdtrain import calibration, cli, examples, optim, sgdct
from fwdtrain.core._tree import leaves, squared_norm
from fwdtrain.core.step import descend
from fwdtrain.examples import linear_slope

F64 = torch.float64
DT = 0.01
X0 = torch.tensor([0.3, -0.2], dtype=F64)


def _noise(sde, theta, steps, particles, seed=0):
    m = ft.core.state.noise_dim(sde, theta, X0.expand(particles, -1))
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((steps, particles, m), generator=generator, dtype=F64) * DT**0.5


def _equal(a, b) -> bool:
    la, lb = leaves(a), leaves(b)
    return len(la) == len(lb) and all(torch.equal(x, y) for x, y in zip(la, lb))


# ---------------------------------------------------------------- sgd is today's update, bitwise


def test_default_and_sgd_rule_leave_results_bitwise_unchanged():
    sde, theta = nonlinear_2d()
    dws = _noise(sde, theta, 30, 4)
    lr = ft.schedules.inverse_time(2.0, 5.0)
    plain = ft.init(sde, theta, X0, particles=4)
    ruled = ft.init(sde, theta, X0, particles=4, optimizer=optim.sgd())
    assert plain.opt_state == () and plain.average == () and ruled.opt_state == optim.EmptyState()
    reference = plain
    for dw in dws:  # the pre-change update written out: euler_update + descend
        value, total = ft.core.sensitivity.linearise_particles(
            sde, reference.theta, reference.x, reference.x_tilde, "reverse"
        )
        x = reference.x + value.mu * DT + torch.einsum("ndm,nm->nd", value.sigma, dw)
        x_tilde = {
            k: reference.x_tilde[k] + total.mu[k] * DT + torch.einsum("ndm...,nm->nd...", total.sigma[k], dw)
            for k in reference.x_tilde
        }
        g = {k: v.mean(0) for k, v in total.cost.items()}
        reference = ft.State(x, x_tilde, descend(reference.theta, g, lr(reference.t), DT), reference.t + DT)
        plain = ft.step(sde, plain, dw, DT, lr, mode="reverse")
        ruled = ft.step(sde, ruled, dw, DT, lr, mode="reverse", optimizer=optim.sgd())
    assert _equal(plain, reference)
    assert _equal(ruled._replace(opt_state=()), reference)


def test_run_with_sgd_rule_equals_run_without(lqr64):
    ex = lqr64
    a, ha = ft.run(ex.sde, ft.init(ex.sde, ex.theta, ex.x0, 4), 50, ex.dt, ex.lr, noise=3, save=ft.SaveAt(10))
    b, hb = ft.run(
        ex.sde,
        ft.init(ex.sde, ex.theta, ex.x0, 4, optimizer=optim.sgd()),
        50,
        ex.dt,
        ex.lr,
        optimizer=optim.sgd(),
        noise=3,
        save=ft.SaveAt(10),
    )
    steps_only = lambda h: h._replace(carry={k: v for k, v in h.carry.items() if not k.startswith("route_")})
    assert _equal(a.theta, b.theta) and _equal(steps_only(ha), steps_only(hb)) and ha.theta_average is None


# ---------------------------------------------------------------- mismatch: a clear error before any step


@pytest.mark.parametrize(
    "made, stepped",
    [(optim.adam(), None), (None, optim.adam()), (optim.adam(), optim.sgd()), (optim.momentum(), optim.adam())],
)
def test_mismatched_opt_state_is_refused_before_stepping(made, stepped, lqr64):
    ex = lqr64
    state = ft.init(ex.sde, ex.theta, ex.x0, 4, optimizer=made)
    dw = torch.zeros(4, 1, dtype=F64)
    with pytest.raises(ValueError, match="opt_state does not fit the optimizer.*fwdtrain.init"):
        ft.step(ex.sde, state, dw, ex.dt, 0.1, optimizer=stepped)
    calls = []
    with pytest.raises(ValueError, match="opt_state does not fit"):
        ft.run(
            ex.sde,
            state,
            10,
            ex.dt,
            0.1,
            optimizer=stepped,
            hooks=(ft.driver.Callback(lambda n, s: calls.append(n), 1),),
        )
    assert calls == []


def test_opt_state_of_another_theta_shape_is_refused(lqr64):
    ex = lqr64
    state = ft.init(ex.sde, ex.theta, ex.x0, 4, optimizer=optim.adam())
    other = {k: torch.zeros(3, dtype=F64) for k in ex.theta}
    state = state._replace(opt_state=optim.adam().init(other))
    with pytest.raises(ValueError, match="does not fit"):
        ft.run(ex.sde, state, 5, ex.dt, 0.1, optimizer=optim.adam())


def test_optimizer_must_be_a_transformation(lqr64):
    with pytest.raises(TypeError, match="GradientTransformation"):
        ft.init(lqr64.sde, lqr64.theta, lqr64.x0, 4, optimizer="adam")


# ---------------------------------------------------------------- checkpoints and resume


def test_adam_state_roundtrips_and_resume_is_bitwise(lqr64, tmp_path):
    ex, rule = lqr64, optim.chain(optim.clip_by_global_norm(1.0), optim.adam())
    start = ft.init(ex.sde, ex.theta, ex.x0, 4, optimizer=rule, average_from=0.2)
    whole, hw = ft.run(ex.sde, start, 60, ex.dt, 0.05, optimizer=rule, noise=1, save=ft.SaveAt(10))
    half, hh = ft.run(ex.sde, start, 30, ex.dt, 0.05, optimizer=rule, noise=1, save=ft.SaveAt(10))
    ft.save(tmp_path / "ck.pt", half, hh)
    ck = ft.load(tmp_path / "ck.pt")
    assert _equal(ck.state, half) and type(ck.state.opt_state[1][0]) is optim.AdamState
    assert isinstance(ck.state.average, optim.Average) and torch.equal(ck.state.average.start, half.average.start)
    rest, hr = ft.run(ex.sde, (ck.state, ck.history), 30, ex.dt, 0.05, optimizer=rule, save=ft.SaveAt(10))
    assert _equal(rest, whole) and _equal(hr, hw)
    assert hr.theta_average["weight0"].shape[0] == len(hr.step)


def test_old_checkpoint_without_the_new_fields_loads(lqr64, tmp_path):
    from fwdtrain.driver import checkpoint

    ex = lqr64
    state, history = ft.run(ex.sde, ft.init(ex.sde, ex.theta, ex.x0, 4), 20, ex.dt, 0.1, save=ft.SaveAt(10))
    content = {
        "state": {k: v for k, v in state._asdict().items() if k in ("x", "x_tilde", "theta", "t")},
        "history": {k: v for k, v in history._asdict().items() if k != "theta_average"},
        "metadata": {},
    }
    content = checkpoint._plain(content, "content")
    torch.save(
        {
            "format": checkpoint.FORMAT,
            "version": checkpoint.VERSION,
            "digest": checkpoint._digest(content),
            "content": content,
        },
        tmp_path / "old.pt",
    )
    ck = ft.load(tmp_path / "old.pt")
    assert ck.state.opt_state == () and ck.state.average == () and ck.history.theta_average is None
    assert _equal(ck.state, state)


# ---------------------------------------------------------------- Polyak-Ruppert averaging


def test_running_average_equals_direct_mean_of_recorded_iterates(lqr64):
    ex, t0 = lqr64, 0.25
    state = ft.init(ex.sde, ex.theta, ex.x0, 4, optimizer=optim.momentum(0.5), average_from=t0)
    final, history = ft.run(ex.sde, state, 60, ex.dt, 0.2, optimizer=optim.momentum(0.5), noise=2, save=ft.SaveAt(1))
    chosen = history.t >= t0
    assert int(final.average.count) == int(chosen.sum()) == 36
    for name, leaf in history.theta.items():
        direct = leaf[chosen].mean(0)
        torch.testing.assert_close(final.average.mean[name], direct, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(history.theta_average[name][-1], direct, rtol=1e-12, atol=1e-14)
    assert history.numpy()["theta_average"]["weight0"].shape[0] == 60


def test_average_before_t0_stays_empty(lqr64):
    ex = lqr64
    state = ft.init(ex.sde, ex.theta, ex.x0, 4, average_from=100.0)
    final, _ = ft.run(ex.sde, state, 10, ex.dt, 0.2, save=ft.SaveAt(5))
    assert int(final.average.count) == 0 and all(bool((leaf == 0).all()) for leaf in leaves(final.average.mean))


# ---------------------------------------------------------------- clipping


def test_clipping_caps_the_global_norm_of_the_step(lqr64):
    ex, cap, rate = lqr64, 1e-3, 0.3
    rule = optim.chain(optim.clip_by_global_norm(cap), optim.sgd())
    state = ft.init(ex.sde, ex.theta, torch.full((1,), 5.0, dtype=F64), 4, optimizer=rule)
    dw = torch.zeros(4, 1, dtype=F64)
    new, info = ft.step_with_info(ex.sde, state, dw, ex.dt, rate, optimizer=rule)
    assert float(squared_norm(info.gradient).sqrt()) > 10 * cap  # the raw gradient is far above the cap
    moved = squared_norm({k: new.theta[k] - state.theta[k] for k in state.theta}).sqrt()
    assert float(moved) == pytest.approx(rate * ex.dt * cap, rel=1e-9)


# ---------------------------------------------------------------- transforms


def test_grad_through_adam_steps_equals_central_differences():
    sde, theta = diagonal_2d()
    dws = _noise(sde, theta, 8, 3, seed=4)
    rule = optim.adam(b1=0.8, b2=0.9)

    def final_cost(theta0):
        state = ft.init(sde, theta0, X0, particles=3, optimizer=rule, average_from=0.03)
        for dw in dws:
            state = ft.step(sde, state, dw, DT, 0.5, optimizer=rule)
        return vmap(lambda x: sde.cost(state.theta, x))(state.x).mean() + state.average.mean["k"].sum()

    derivative = grad(final_cost)(theta)
    eps = 1e-6
    for name, leaf in theta.items():
        for j in range(leaf.numel()):
            e = torch.zeros_like(leaf).reshape(-1)
            e[j] = eps
            e = e.reshape(leaf.shape)
            fd = (final_cost({**theta, name: leaf + e}) - final_cost({**theta, name: leaf - e})) / (2 * eps)
            torch.testing.assert_close(derivative[name].reshape(-1)[j], fd, rtol=1e-6, atol=1e-8)


def test_vmap_over_runs_with_momentum_equals_a_loop():
    sde, theta = nonlinear_2d()
    dws = _noise(sde, theta, 10, 3, seed=5)
    rule = optim.momentum(0.9, nesterov=True)
    lrs = torch.tensor([0.0, 0.5, 2.0], dtype=F64)
    states = vmap(lambda lr: ft.init(sde, theta, X0, particles=3, optimizer=rule, average_from=0.05))(lrs)
    train = vmap(lambda s, dw, lr: ft.step(sde, s, dw, DT, lr, optimizer=rule), in_dims=(0, None, 0))
    for dw in dws:
        states = train(states, dw, lrs)
    for i, lr in enumerate(lrs):
        state = ft.init(sde, theta, X0, particles=3, optimizer=rule, average_from=0.05)
        for dw in dws:
            state = ft.step(sde, state, dw, DT, lr, optimizer=rule)
        one = ft.core._tree.tree_map(lambda leaf: leaf[i], states)
        for a, b in zip(leaves(one), leaves(state)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_compiled_kernels_with_an_optimizer_equal_eager(lqr64):
    ex, rule = lqr64, optim.rmsprop(momentum=0.5)
    dws = torch.randn(8, 4, 1, generator=torch.Generator().manual_seed(6), dtype=F64) * ex.dt**0.5
    start = ft.init(ex.sde, ex.theta, ex.x0, 4, optimizer=rule, average_from=0.0)
    eager = start
    for dw in dws:
        eager = ft.step(ex.sde, eager, dw, ex.dt, 0.3, mode="reverse", optimizer=rule)
    quick = ft.Compile(
        True, compiler="dynamo", backend="eager"
    )  # the compiled kernels' plumbing, traced by dynamo only (quick)
    c, _ = ft.run(
        ex.sde,
        start,
        8,
        ex.dt,
        0.3,
        noise=dws,
        optimizer=rule,
        compile=quick,
        save=ft.SaveAt(8),
        solver=ft.Euler(mode="reverse"),
    )
    for x, y in zip(leaves(c), leaves(eager)):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------- other problems


def test_calibration_and_sgdct_take_an_optimizer():
    problem = examples.ou_calibration(particles=4, steps=10, dtype=F64)
    rule = optim.adam()
    cal = problem.problem.with_optimizer(rule)
    state = calibration.init(cal, problem.theta, problem.x0, 4, average_from=0.0)
    assert type(state.opt_state[0]) is optim.AdamState
    final, history = ft.run(cal, state, 10, problem.dt, 0.01, save=ft.SaveAt(5))
    assert int(final.opt_state[0].count) == 10 and history.theta_average is not None
    with pytest.raises(ValueError, match="does not fit"):
        ft.run(problem.problem, state, 3, problem.dt, 0.01)

    ou = examples.sgdct_ou(particles=2, steps=20, dtype=F64)
    increments = ou.data(0, 20)
    base = ou.initial_state()
    plain, _ = ft.run(ou.trainable, base, 20, ou.dt, ou.lr, noise=increments)
    ruled, _ = ft.run(
        ou.trainable,
        ft.core.state.with_optimizer(base, optim.sgd()),
        20,
        ou.dt,
        ou.lr,
        noise=increments,
        optimizer=optim.sgd(),
    )
    for a, b in zip(leaves(plain.theta), leaves(ruled.theta)):  # G = -direction: the same descent, to rounding
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    moved, _ = ft.run(
        ou.trainable,
        ft.core.state.with_optimizer(base, optim.adam()),
        20,
        ou.dt,
        ou.lr,
        noise=increments,
        optimizer=optim.adam(),
    )
    assert not _equal(moved.theta, plain.theta) and isinstance(sgdct.DriftEstimation(ou.sde), ft.problems.Trainable)


# ---------------------------------------------------------------- command line


def _tiny(*, particles=3, dt=0.01, steps=40, lr=0.5, seed=0, dtype=F64):
    ex = examples.lqr_1d(particles=particles, dt=dt, steps=steps, lr=lr, seed=seed, dtype=dtype, hidden=4)
    return ex._replace(
        name="tiny",
        lr=ft.schedules.constant(lr),
        evaluate=lambda theta: {"slope": linear_slope(ex.sde.control, theta), "cost": 0.5},
    )


def test_cli_optimizer_clip_average_and_resume(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(examples.REGISTRY, "tiny", _tiny)
    flags = ["--optimizer", "adam", "--clip", "2", "--average-from", "0.105", "--lr", "0.05", "--no-plot"]
    first, resumed, whole = tmp_path / "a.pt", tmp_path / "b.pt", tmp_path / "c.pt"
    assert cli.main(["tiny", "--steps", "20", "--checkpoint", str(first), "--json", *flags]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["optimizer"] == "adam" and out["clip"] == 2.0 and out["averaged_iterates"] == 10
    assert "averaged" in out["metrics"]["slope"] and "averaged_relative_error" in out["metrics"]["cost"]
    assert cli.main(["tiny", "--resume", str(first), "--steps", "40", "--checkpoint", str(resumed), "--no-plot"]) == 0
    table = capsys.readouterr().out
    assert "adam, clip 2" in table and "averaged" in table and "iterates with t >= 0.105" in table
    assert cli.main(["tiny", "--steps", "40", "--checkpoint", str(whole), "--json", *flags]) == 0
    capsys.readouterr()
    a, b = ft.load(resumed), ft.load(whole)
    assert _equal(a.state, b.state)  # the resumed history has one more record: the end of the first run
    assert _equal(a.history.theta_average["weight0"][-1], b.history.theta_average["weight0"][-1])
    assert cli.main(["tiny", "--resume", str(first), "--optimizer", "momentum", "--no-plot"]) == 2
    assert "differs from the resumed run's adam" in capsys.readouterr().err
    assert cli.main(["tiny", "--optimizer", "lion", "--no-plot"]) == 2
