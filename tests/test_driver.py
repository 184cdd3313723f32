import dataclasses
import io
import sys

import pytest
import torch

import fwdtrain as ft
from fwdtrain.core._tree import leaves, tree_map
from fwdtrain.driver.hooks import progress_enabled as _progress_enabled

DT = 0.01


def linear_problem(dtype=torch.float64, particles=4, k=0.2):
    """dX = (-X + u) dt + dW, u = -k X, cost X^2 + u^2: one parameter, cheap steps."""
    sde = ft.ControlledSDE(
        control=lambda th, x: -th["k"] * x,
        drift=lambda x, u: -x + u,
        diffusion=lambda x, u: torch.ones_like(x),
        cost=lambda x, u: (x * x + u * u).sum(),
    )
    theta = {"k": torch.tensor(k, dtype=dtype)}
    return sde, ft.init(sde, theta, torch.ones(1, dtype=dtype), particles)


def same(a, b):
    la, lb = leaves(a), leaves(b)
    return len(la) == len(lb) and all(torch.equal(x, y) for x, y in zip(la, lb))


def tensors(history):
    return history[:6]


def test_chunk_size_and_seed_reproducibility():
    sde, state = linear_problem()
    lr = ft.schedules.constant(0.5)
    runs = [
        ft.run(sde, state, 130, DT, lr, noise=7, save=ft.SaveAt(25), compile=ft.Compile("auto", chunk=c))
        for c in (1, 7, 64, 1000)
    ]
    for final, history in runs[1:]:
        assert same(final, runs[0][0]) and same(tensors(history), tensors(runs[0][1]))
    other, _ = ft.run(sde, state, 10, DT, lr, noise=8)
    first, _ = ft.run(sde, state, 10, DT, lr, noise=7)
    assert not torch.equal(other.x, first.x)


def test_run_is_the_loop_over_step_with_its_noise():
    sde, state = linear_problem()
    lr = ft.schedules.inverse_time(1.0, 1.0)
    dw = ft.noise.BrownianNoise((4, 1), DT, seed=5, dtype=torch.float64).draw(60)
    final, history = ft.run(sde, state, 60, DT, lr, noise=dw, save=ft.SaveAt(20))
    s, costs, grads = state, [], []
    for n in range(60):
        s, info = ft.step_with_info(sde, s, dw[n], DT, lr)
        costs.append(info.cost)
        grads.append(info.gradient["k"].abs())
    assert same(final, s)
    assert history.step.tolist() == [20, 40, 60]
    assert torch.equal(history.grad_norm, torch.stack([grads[19], grads[39], grads[59]]))
    windows = torch.stack([torch.stack(costs[n - 20 : n]).mean() for n in (20, 40, 60)])
    torch.testing.assert_close(history.cost, windows, rtol=1e-12, atol=0)
    means = torch.stack([torch.stack(costs[:n]).mean() for n in (20, 40, 60)])
    torch.testing.assert_close(history.average_cost, means, rtol=1e-12, atol=0)
    assert history.theta["k"].shape == (3,) and history.theta["k"][-1] == s.theta["k"]
    # the same increments from a function of the step index
    again, _ = ft.run(
        sde,
        state,
        60,
        DT,
        lr,
        noise=lambda start, count: dw[start : start + count],
        compile=ft.Compile("auto", chunk=7),
    )
    assert same(again, final)


def test_continuing_with_the_history_equals_one_run():
    sde, state = linear_problem()
    lr = ft.schedules.constant(0.5)
    whole, whole_history = ft.run(sde, state, 130, DT, lr, noise=2, save=ft.SaveAt(20))
    half, half_history = ft.run(sde, state, 60, DT, lr, noise=2, save=ft.SaveAt(20))
    rest, rest_history = ft.run(sde, (half, half_history), 70, DT, lr, noise=999, save=ft.SaveAt(20))
    assert same(rest, whole)
    assert same(tensors(rest_history), tensors(whole_history))
    increments = ft.noise.BrownianNoise((4, 1), DT, seed=4, dtype=torch.float64).draw(130)
    first, first_history = ft.run(sde, state, 60, DT, lr, noise=increments, save=ft.SaveAt(20))
    second, _ = ft.run(sde, (first, first_history), 70, DT, lr, noise=increments)  # rows 60.. are used
    assert same(second, ft.run(sde, state, 130, DT, lr, noise=increments)[0])
    with pytest.raises(ValueError, match="user-supplied noise"):
        ft.run(sde, (first, first_history), 10, DT, lr)
    with pytest.raises(ValueError, match="history ends at t"):
        ft.run(sde, (state, half_history), 10, DT, lr)
    with pytest.raises(ValueError, match="noise source is at step 0"):
        ft.run(sde, (half, half_history), 10, DT, lr, noise=ft.noise.BrownianNoise((4, 1), DT, dtype=torch.float64))


def cubic_problem(dtype=torch.float64):
    """dX = theta X^3 dt + dW blows up in a few steps from x = 2."""
    sde = ft.SDE(
        drift=lambda th, x: th["a"] * x**3, diffusion=lambda th, x: torch.ones_like(x), cost=lambda th, x: (x * x).sum()
    )
    return sde, ft.init(sde, {"a": torch.tensor(1.0, dtype=dtype)}, torch.full((1,), 2.0, dtype=dtype), 2)


def test_divergence_stops_with_the_last_finite_state():
    sde, state = cubic_problem()
    with pytest.raises(ft.DivergenceError) as caught:
        ft.run(sde, state, 1000, 0.1, 0.0, save=ft.SaveAt(2), checks=ft.Checks(4))
    error = caught.value
    assert error.last_finite_step < error.step <= error.last_finite_step + 4 and error.step < 40
    assert all(bool(torch.isfinite(leaf).all()) for leaf in leaves(error.state))
    assert error.history.steps == error.last_finite_step
    assert f"at step {error.step}" in str(error) and "last checked state" in str(error)
    replay, _ = ft.run(sde, state, error.last_finite_step, 0.1, 0.0)
    assert same(replay, error.state)  # it is the true state at that step, and nothing after it leaked in


def test_user_bound_stops_the_run():
    sde, state = linear_problem(k=-3.0)  # u = 3x: dX = 2X dt + dW, unstable
    with pytest.raises(ft.DivergenceError, match="bound=5.0") as caught:
        ft.run(sde, state, 2000, DT, 0.0, checks=ft.Checks(10, bound=5.0))
    assert caught.value.state.x.abs().max() <= 5 and caught.value.step < 2000


def test_keyboard_interrupt_returns_and_saves_the_last_state(tmp_path):
    sde, state = linear_problem()
    lr = ft.schedules.constant(0.5)
    path = tmp_path / "run.pt"

    def stop(n, s):
        if n == 50:
            raise KeyboardInterrupt

    final, history = ft.run(
        sde, state, 130, DT, lr, save=ft.SaveAt(20), hooks=(ft.driver.Callback(stop, 25), ft.Checkpointing(path))
    )
    assert history.interrupted and history.steps == 50 and history.step.tolist() == [20, 40, 50]
    torch.testing.assert_close(final.t, torch.tensor(50 * DT, dtype=torch.float64))
    saved = ft.load(path)
    assert same(saved.state, final) and saved.history.interrupted
    resumed, resumed_history = ft.run(sde, (saved.state, saved.history), 80, DT, lr, save=ft.SaveAt(20))
    whole, whole_history = ft.run(sde, state, 130, DT, lr, save=ft.SaveAt(20))
    assert same(resumed, whole) and not resumed_history.interrupted
    # every record on the grid is bitwise the same (the window of the cost spans the interruption)
    keep = [i for i, n in enumerate(resumed_history.step.tolist()) if n != 50]
    assert same(tree_map(lambda x: x[keep], tensors(resumed_history)), tensors(whole_history))


def test_progress_bar_off_when_not_a_terminal(capsys):
    class Pipe(io.StringIO):
        def isatty(self):
            return False

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert not _progress_enabled(None, Pipe()) and _progress_enabled(None, Terminal())
    assert _progress_enabled(True, Pipe()) and not _progress_enabled(False, Terminal())
    sde, state = linear_problem()
    ft.run(sde, state, 20, DT, 0.1, hooks=(ft.Progress(256, None),))  # pytest's captured stderr is not a terminal
    assert capsys.readouterr().err == ""
    ft.run(sde, state, 20, DT, 0.1, hooks=(ft.Progress(5, True),))
    assert "20" in capsys.readouterr().err


def test_progress_without_tqdm_falls_back_to_a_plain_line(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # import fails as if tqdm were missing
    sde, state = linear_problem()
    ft.run(sde, state, 20, DT, 0.1, hooks=(ft.Progress(10, True),))
    err = capsys.readouterr().err
    assert "step 20/20" in err and "steps/s" in err and "cost" in err


def test_record_reduce_callback_and_numpy():
    sde, state = linear_problem()
    seen = []
    final, history = ft.run(
        sde,
        state,
        30,
        DT,
        0.5,
        save=ft.SaveAt(10, record=lambda s: s.x.mean()),
        hooks=(
            ft.driver.Callback(lambda n, s: seen.append(n), 15),
            ft.driver.GradientHook(lambda g: tree_map(torch.zeros_like, g)),
        ),
    )
    assert torch.equal(final.theta["k"], state.theta["k"])  # the reduce hook fed the update
    assert seen == [15, 30] and history.theta.shape == (3,)
    assert all(isinstance(leaf, torch.Tensor) for leaf in leaves(history))  # a pytree of tensors, like State
    arrays = history.numpy()
    assert arrays["step"].tolist() == [10, 20, 30] and arrays["average_cost"].dtype.name == "float64"


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"steps": -1}, ValueError, "steps"),
        ({"save": ft.SaveAt(0)}, ValueError, r"SaveAt\(every"),
        ({"save": 100}, TypeError, "fwdtrain.SaveAt"),
        ({"compile": ft.Compile(chunk=0)}, ValueError, "chunk"),
        ({"compile": "yes please"}, ValueError, "torch.compile"),
        ({"checks": ft.Checks(10, bound=-1.0)}, ValueError, "bound"),
        ({"hooks": (lambda n, s: None,)}, TypeError, "hooks must be"),
        ({"dt": 0.0}, ValueError, "dt"),
        ({"lr": -1.0}, ValueError, "lr"),
        ({"noise": torch.zeros(10, 3, 1, dtype=torch.float64)}, ValueError, "shape"),
        ({"noise": ft.noise.BrownianNoise((4, 1), 0.5, dtype=torch.float64)}, ValueError, "does not fit"),
        ({"start": (1, 2)}, TypeError, "start"),
        ({"solver": "rk4"}, ValueError, "unknown solver"),
    ],
)
def test_bad_arguments_fail_before_any_step(kwargs, error, match):
    sde, state = linear_problem()
    args = {"steps": 5, "dt": DT, "lr": 0.1, "start": state, **kwargs}
    calls = []
    hooks = args.pop("hooks", (ft.driver.Callback(lambda n, s: calls.append(n), 1),))
    with pytest.raises(error, match=match):
        ft.run(sde, args.pop("start"), args.pop("steps"), args.pop("dt"), args.pop("lr"), hooks=hooks, **args)
    assert calls == []
    with pytest.raises(TypeError, match="Callback"):
        ft.driver.Callback(3)
    with pytest.raises(ValueError, match="every"):
        ft.Progress(0)


def _lqr_state(particles=3):
    ex = ft.examples.lqr_1d(particles=particles, dtype=torch.float64, hidden=4)
    return ex.sde, ft.init(ex.sde, ex.theta, ex.x0, particles)


def test_the_loop_advances_in_pieces_to_the_same_bits():
    """setup + Loop.advance_to(k) + advance_to(end) is run: the loop is resumable at any step."""
    from fwdtrain.driver import setup
    from fwdtrain.driver.block import Carry

    sde, state = _lqr_state()
    final, history = ft.run(sde, state, 57, DT, 0.5, noise=3, save=ft.SaveAt(10))
    loop = setup(sde, state, 57, DT, 0.5, 3, save=ft.SaveAt(10))
    for stop in (1, 13, 13, 40, 100):
        carry = loop.advance_to(stop)
        assert isinstance(carry, Carry) and carry.n == min(stop, 57)
    loop.record_now()
    pieces = loop.history()
    assert all(torch.equal(a, b) for a, b in zip(leaves((final, history[:6])), leaves((loop.carry.state, pieces[:6]))))


@dataclasses.dataclass(frozen=True)
class _Decay(ft.problems.Trainable):
    """A new kind of problem, unknown to the driver: theta <- theta - alpha h (theta - dw), x the running dw."""

    def check(self, state, dt, lr):
        pass

    def plan(self, state, mode="auto"):
        return "reverse"

    def noise_shape(self, state):
        return tuple(state.x.shape)

    def propagate(self, state, dw, dt, plan):
        gradient = {"a": state.theta["a"] - dw.mean()}
        return state._replace(x=dw), ft.core.step.StepInfo(gradient["a"].square(), gradient)

    def record(self, state):
        return state.theta["a"]


def test_any_trainable_runs_through_the_driver():
    state = ft.State(
        torch.zeros(2, 1, dtype=torch.float64),
        (),
        {"a": torch.tensor(1.0, dtype=torch.float64)},
        torch.zeros((), dtype=torch.float64),
    )
    noise = torch.full((20, 2, 1), 0.5, dtype=torch.float64)
    final, history = ft.run(_Decay(), state, 20, 0.1, 1.0, noise=noise, save=ft.SaveAt(5))
    expected = 0.5 + 0.5 * 0.9**20
    assert float(final.theta["a"]) == pytest.approx(expected) and history.theta.shape == (4,)
    with pytest.raises(TypeError, match="expected a problem to train"):
        ft.run(object(), state, 1, 0.1, 1.0)
