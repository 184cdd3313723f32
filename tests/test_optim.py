"""fwdtrain.optim: numbers against torch.optim and euler.descend, and composability with torch.func."""

import pytest
import torch
from torch.func import grad, jacfwd, vmap

from fwdtrain import optim
from fwdtrain.core.step import descend

F64 = torch.float64


def _theta(dtype=F64):
    return {"w": torch.tensor([[0.5, -1.0], [2.0, 0.25]], dtype=dtype), "b": torch.tensor([0.3, -0.7], dtype=dtype)}


def _gradients(n, dtype=F64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        {"w": torch.randn(2, 2, generator=gen, dtype=dtype), "b": torch.randn(2, generator=gen, dtype=dtype)}
        for _ in range(n)
    ]


def _run(transformation, theta, gradients, rate):
    state = transformation.init(theta)
    for g in gradients:
        updates, state = transformation.update(g, state, theta, rate)
        theta = optim.apply_updates(theta, updates)
    return theta, state


def _run_torch(make, theta, gradients):
    params = {k: torch.nn.Parameter(v.clone()) for k, v in theta.items()}
    opt = make(list(params.values()))
    for g in gradients:
        for k, p in params.items():
            p.grad = g[k].clone()
        opt.step()
    return {k: p.detach() for k, p in params.items()}


ALPHA, H = 0.3, 0.01


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (lambda: optim.momentum(0.9), lambda p: torch.optim.SGD(p, lr=ALPHA * H, momentum=0.9)),
        (
            lambda: optim.momentum(0.8, nesterov=True),
            lambda p: torch.optim.SGD(p, lr=ALPHA * H, momentum=0.8, nesterov=True),
        ),
        (lambda: optim.adam(), lambda p: torch.optim.Adam(p, lr=ALPHA * H)),
        (lambda: optim.adam(0.8, 0.95, 1e-6), lambda p: torch.optim.Adam(p, lr=ALPHA * H, betas=(0.8, 0.95), eps=1e-6)),
        (lambda: optim.rmsprop(), lambda p: torch.optim.RMSprop(p, lr=ALPHA * H)),
        (
            lambda: optim.rmsprop(0.9, centered=True, momentum=0.5),
            lambda p: torch.optim.RMSprop(p, lr=ALPHA * H, alpha=0.9, centered=True, momentum=0.5),
        ),
    ],
    ids=["heavy-ball", "nesterov", "adam", "adam-options", "rmsprop", "rmsprop-centred-momentum"],
)
def test_matches_torch_optim(ours, theirs):
    theta, gradients = _theta(), _gradients(25)
    mine, _ = _run(ours(), theta, gradients, torch.tensor(ALPHA, dtype=F64) * H)
    reference = _run_torch(theirs, theta, gradients)
    for k in theta:
        torch.testing.assert_close(mine[k], reference[k], rtol=0, atol=1e-12)
        assert not torch.equal(mine[k], theta[k])


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_sgd_is_descend_bitwise(dtype):
    theta = dict(_theta(dtype), c=torch.tensor(1.7, dtype=torch.float32))  # a 0-d float32 leaf
    gradients = [
        dict(g, c=torch.tensor(0.1 * (i + 1), dtype=torch.float32)) for i, g in enumerate(_gradients(5, dtype))
    ]
    alpha, dt = torch.tensor(0.37, dtype=F64), 0.013  # float64 alpha, as a schedule returns it
    sgd = optim.sgd()
    state, expected, mine = sgd.init(theta), theta, theta
    for g in gradients:
        expected = descend(expected, g, alpha, dt)
        updates, state = sgd.update(g, state, mine, alpha * dt)
        mine = optim.apply_updates(mine, updates)
        for k in theta:
            assert mine[k].dtype == theta[k].dtype
            assert torch.equal(mine[k], expected[k]), k


def test_clip_caps_global_norm_and_keeps_small_gradients():
    clip = optim.clip_by_global_norm(1.5)
    big = {"w": torch.full((2, 2), 3.0, dtype=F64), "b": torch.tensor([4.0, -1.0], dtype=F64)}
    clipped, _ = clip.update(big, clip.init(big), big, 0.1)
    norm = sum(v.square().sum() for v in clipped.values()).sqrt()
    torch.testing.assert_close(norm, torch.tensor(1.5, dtype=F64), rtol=1e-14, atol=0)
    torch.testing.assert_close(clipped["w"] / clipped["b"][0], big["w"] / big["b"][0])  # direction kept
    big_norm = sum(v.square().sum() for v in big.values()).sqrt()
    for below in (1.49, 1e-3):  # just under the cap, and far under it: unchanged, bitwise
        small = {k: v * (below / big_norm) for k, v in big.items()}
        same, _ = clip.update(small, clip.init(small), small, 0.1)
        assert all(torch.equal(same[k], small[k]) for k in small)


def test_chain_composes_in_order():
    # clip then heavy ball: the trace accumulates clipped gradients; the other order does not.
    theta, gradients = _theta(), [{k: 10 * v for k, v in g.items()} for g in _gradients(4)]
    first = optim.chain(optim.clip_by_global_norm(1.0), optim.momentum(0.5))
    mine, state = _run(first, theta, gradients, 0.1)
    expected, trace = theta, {k: torch.zeros_like(v) for k, v in theta.items()}
    for g in gradients:
        n = sum(v.square().sum() for v in g.values()).sqrt()
        trace = {k: 0.5 * trace[k] + g[k] * (1.0 / n) for k in g}
        expected = {k: expected[k] - 0.1 * trace[k] for k in g}
    for k in theta:
        torch.testing.assert_close(mine[k], expected[k], rtol=1e-13, atol=1e-13)
    assert isinstance(state, tuple) and isinstance(state[1][0], optim.MomentumState)
    reversed_, _ = _run(optim.chain(optim.momentum(0.5), optim.clip_by_global_norm(1.0)), theta, gradients, 0.1)
    assert not torch.allclose(reversed_["w"], mine["w"])


def test_running_average_from_t0():
    theta, gradients = _theta(), _gradients(12)
    h, t0 = 0.25, 1.0
    adam = optim.adam()
    state, average, t, iterates = adam.init(theta), optim.average_init(theta), torch.tensor(0.0, dtype=F64), []
    for g in gradients:
        average = optim.average_update(average, theta, t, average_from=t0)
        if float(t) >= t0:
            iterates.append(theta)
        updates, state = adam.update(g, state, theta, 0.1 * h)
        theta, t = optim.apply_updates(theta, updates), t + h
    assert int(average.count) == len(iterates) == 8
    for k in theta:
        direct = torch.stack([it[k] for it in iterates]).mean(0)
        torch.testing.assert_close(average.mean[k], direct, rtol=1e-14, atol=1e-14)


def test_running_average_under_vmap():
    # Two runs with different clocks: only the one past t0 averages.
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=F64)
    t = torch.tensor([0.5, 2.0], dtype=F64)

    def two_steps(x, t):
        avg = optim.average_update(optim.average_init({"x": x}), {"x": x}, t, average_from=1.0)
        return optim.average_update(avg, {"x": 3 * x}, t + 1, average_from=1.0)

    avg = vmap(two_steps)(x, t)
    assert avg.count.tolist() == [1, 2]
    torch.testing.assert_close(avg.mean["x"], torch.stack([3 * x[0], 2 * x[1]]))


def _quadratic():
    a = torch.tensor([[2.0, 0.3], [0.3, 1.0]], dtype=F64)
    b = torch.tensor([1.0, -0.5], dtype=F64)
    return (lambda th: 0.5 * th @ a @ th - b @ th), (lambda th: a @ th - b)


@pytest.mark.parametrize(
    "make",
    [optim.adam, lambda: optim.chain(optim.clip_by_global_norm(1.0), optim.rmsprop())],
    ids=["adam", "clip-rmsprop"],
)
def test_grad_through_updates_matches_central_differences(make):
    loss, gradient = _quadratic()
    tr, steps, h = make(), 6, 0.1

    def final_loss(theta0, alpha):
        theta, state = {"x": theta0}, tr.init({"x": theta0})
        for _ in range(steps):
            updates, state = tr.update({"x": gradient(theta["x"])}, state, theta, alpha * h)
            theta = optim.apply_updates(theta, updates)
        return loss(theta["x"])

    theta0, alpha, eps = torch.tensor([1.5, -2.0], dtype=F64), torch.tensor(0.8, dtype=F64), 1e-6
    d_theta = grad(final_loss, argnums=0)(theta0, alpha)
    d_alpha = grad(final_loss, argnums=1)(theta0, alpha)
    torch.testing.assert_close(jacfwd(final_loss, argnums=1)(theta0, alpha), d_alpha, rtol=1e-12, atol=1e-14)
    fd_theta = torch.stack(
        [
            (final_loss(theta0 + eps * e, alpha) - final_loss(theta0 - eps * e, alpha)) / (2 * eps)
            for e in torch.eye(2, dtype=F64)
        ]
    )
    fd_alpha = (final_loss(theta0, alpha + eps) - final_loss(theta0, alpha - eps)) / (2 * eps)
    assert d_alpha.abs() > 1e-3 and d_theta.abs().min() > 1e-3  # a non-trivial check
    torch.testing.assert_close(d_theta, fd_theta, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(d_alpha, fd_alpha, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("nesterov", [False, True])
def test_vmap_over_runs_equals_loop(nesterov):
    _, gradient = _quadratic()
    tr = optim.momentum(0.7, nesterov=nesterov)

    def run(theta0, alpha):
        theta = {"x": theta0}
        state = tr.init(theta)
        for _ in range(5):
            updates, state = tr.update({"x": gradient(theta["x"])}, state, theta, alpha * 0.1)
            theta = optim.apply_updates(theta, updates)
        return theta["x"], state

    theta0 = torch.tensor([[1.0, 2.0], [-1.0, 0.5], [0.0, 3.0]], dtype=F64)
    alphas = torch.tensor([0.5, 1.0, 2.0], dtype=F64)
    batched, batched_state = vmap(run)(theta0, alphas)
    for i in range(3):
        single, single_state = run(theta0[i], alphas[i])
        torch.testing.assert_close(batched[i], single, rtol=1e-15, atol=1e-15)
        torch.testing.assert_close(batched_state[0].trace["x"][i], single_state[0].trace["x"])


def test_optimizer_names_and_errors():
    assert set(optim.OPTIMIZERS) == {"sgd", "momentum", "adam", "rmsprop"}
    assert isinstance(optim.optimizer("adam", b1=0.8), optim.GradientTransformation)
    with pytest.raises(ValueError, match="unknown optimizer 'adamw'.*'adam'"):
        optim.optimizer("adamw")
    with pytest.raises(ValueError, match="'sgd' takes options none, got \\['momentum'\\]"):
        optim.optimizer("sgd", momentum=0.9)
    with pytest.raises(ValueError, match="momentum must be in"):
        optim.momentum(1.0)
    with pytest.raises(ValueError, match="nesterov"):
        optim.momentum(0.0, nesterov=True)
    with pytest.raises(ValueError, match="b1, b2"):
        optim.adam(b2=1.0)
    with pytest.raises(ValueError, match="max_norm"):
        optim.clip_by_global_norm(0.0)
    with pytest.raises(ValueError, match="position 1"):
        optim.chain(optim.sgd(), object())
