"""The user's own torch.func transforms over fwdtrain's pure functions: correct derivatives, never a silent zero.

Every check compares against something computed without the transform: the sensitivity x_tilde
(the derivative the algorithm propagates), central differences, or a Python loop.
"""

import warnings

import pytest
import torch
from conftest import diagonal_2d, nonlinear_2d
from torch.func import grad, jacfwd, jacrev, jvp, vjp, vmap

import fwdtrain as ft
from fwdtrain import calibration, sgdct
from fwdtrain.core import _checks
from fwdtrain.core.evaluate import average_cost

F64 = torch.float64
DT = 0.01
X0 = torch.tensor([0.3, -0.2], dtype=F64)
PROBLEMS = {"full": nonlinear_2d, "diagonal": diagonal_2d}


def _noise(sde, theta, steps, particles, seed=0):
    m = ft.core.state.noise_dim(sde, theta, X0.expand(particles, -1))
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((steps, particles, m), generator=generator, dtype=F64) * DT**0.5


def _run(sde, theta, dws, lr, mode="auto"):
    """init + K steps: a pure function of theta0, the noise and lr."""
    state = ft.init(sde, theta, X0, particles=dws.shape[1])
    for dw in dws:
        state = ft.step(sde, state, dw, DT, lr, mode=mode)
    return state


def _central(f, theta, eps=1e-6):
    """Central differences of a scalar f with respect to every entry of every leaf of theta."""
    out = {}
    for name, leaf in theta.items():
        flat = torch.zeros(leaf.numel(), dtype=F64)
        for j in range(leaf.numel()):
            e = torch.zeros(leaf.numel(), dtype=F64)
            e[j] = eps
            plus = {**theta, name: leaf + e.reshape(leaf.shape)}
            minus = {**theta, name: leaf - e.reshape(leaf.shape)}
            flat[j] = (f(plus) - f(minus)) / (2 * eps)
        out[name] = flat.reshape(leaf.shape)
    return out


def _final_cost(sde, dws):
    """The cost the meta-gradients below differentiate: particle-mean c at the final state."""

    def cost(state):
        return vmap(lambda x: sde.cost(state.theta, x))(state.x).mean()

    return cost


@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_jacobian_of_particles_is_x_tilde(problem, mode):
    sde, theta = PROBLEMS[problem]()
    dws = _noise(sde, theta, 25, 3)
    state = _run(sde, theta, dws, 0.0, mode)
    assert max(float(leaf.abs().max()) for leaf in state.x_tilde.values()) > 0.05  # not a trivial zero
    for transform in (jacfwd, jacrev):
        jacobian = transform(lambda th: _run(sde, th, dws, 0.0, mode).x)(theta)
        for name in theta:
            torch.testing.assert_close(jacobian[name], state.x_tilde[name], rtol=0, atol=1e-10)


def test_jvp_and_vjp_agree_with_jacfwd():
    sde, theta = nonlinear_2d()
    dws = _noise(sde, theta, 10, 2)
    f = lambda th: _run(sde, th, dws, 0.3).x
    jacobian = jacfwd(f)(theta)
    direction = {
        name: torch.linspace(-1, 1, leaf.numel(), dtype=F64).reshape(leaf.shape) for name, leaf in theta.items()
    }
    expected = sum(torch.tensordot(jacobian[name], direction[name], dims=leaf.ndim) for name, leaf in theta.items())
    _, tangent = jvp(f, (theta,), (direction,))
    torch.testing.assert_close(tangent, expected, rtol=0, atol=1e-12)
    cotangent = torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=F64)
    _, pullback = vjp(f, theta)
    (pulled,) = pullback(cotangent)
    for name, _leaf in theta.items():
        torch.testing.assert_close(pulled[name], torch.tensordot(cotangent, jacobian[name], dims=2), rtol=0, atol=1e-12)


@pytest.mark.parametrize("problem", PROBLEMS)
def test_grad_wrt_theta0_through_training_equals_central_differences(problem):
    sde, theta = PROBLEMS[problem]()
    dws = _noise(sde, theta, 15, 2)
    cost = _final_cost(sde, dws)
    f = lambda th: cost(_run(sde, th, dws, 0.5))
    gradient = grad(f)(theta)
    reference = _central(f, theta)
    assert any(float(g.abs().max()) > 1e-3 for g in gradient.values())
    for name in theta:
        torch.testing.assert_close(gradient[name], reference[name], rtol=1e-6, atol=1e-8)


def _lr_cases():
    """(name, lr0, lr built from a 0-d tensor): the learning rate as a tensor and as schedule parameters."""
    return {
        "tensor": (0.4, lambda a: a),
        "constant": (0.4, lambda a: ft.schedules.constant(a)),
        "inverse_time scale": (0.4, lambda a: ft.schedules.inverse_time(a, 0.5)),
        "inverse_time offset": (0.5, lambda a: ft.schedules.inverse_time(0.4, a)),
        "piecewise value": (0.2, lambda a: ft.schedules.piecewise_constant([0.4, a], [0.1])),
    }


@pytest.mark.parametrize("case", list(_lr_cases()))
def test_meta_gradient_wrt_learning_rate_equals_central_differences(case):
    value, make = _lr_cases()[case]
    sde, theta = nonlinear_2d()
    dws = _noise(sde, theta, 25, 2)
    cost = _final_cost(sde, dws)
    f = lambda a: cost(_run(sde, theta, dws, make(a)))
    a = torch.tensor(value, dtype=F64)
    eps = 1e-6
    reference = (f(a + eps) - f(a - eps)) / (2 * eps)
    gradient = grad(f)(a)
    assert abs(float(reference)) > 1e-4  # a real dependence, so a zero would fail
    torch.testing.assert_close(gradient, reference, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_forward_propagation_equals_backpropagation_through_time(mode):
    """At lr = 0: sum_n h G_n = d/dtheta0 sum_n h mean_i c(X_n^i, theta), an identity of the Euler chain."""
    sde, theta = nonlinear_2d()
    dws = _noise(sde, theta, 20, 3)

    def path_cost(th):
        state, total, forward = ft.init(sde, th, X0, particles=3), 0.0, None
        for dw in dws:
            state, info = ft.step_with_info(sde, state, dw, DT, 0.0, mode=mode)
            total = total + DT * info.cost
            gradient = {name: DT * g for name, g in info.gradient.items()}
            forward = gradient if forward is None else {name: forward[name] + gradient[name] for name in gradient}
        return total, forward

    backward, forward = grad(path_cost, has_aux=True)(theta)
    for name in theta:
        torch.testing.assert_close(backward[name], forward[name], rtol=0, atol=1e-12)


def test_grad_wrt_x0_and_noise():
    sde, theta = diagonal_2d()
    dws = _noise(sde, theta, 10, 2)

    def f(x0, noise):
        state = ft.init(sde, theta, x0, particles=2)
        for dw in noise:
            state = ft.step(sde, state, dw, DT, 0.2)
        return state.x.square().sum() + sum(leaf.sum() for leaf in state.theta.values())

    g_x0, g_noise = grad(f, argnums=(0, 1))(X0, dws)
    eps = 1e-6
    e = torch.tensor([eps, 0.0], dtype=F64)
    torch.testing.assert_close(g_x0[0], (f(X0 + e, dws) - f(X0 - e, dws)) / (2 * eps), rtol=1e-6, atol=1e-9)
    bump = torch.zeros_like(dws)
    bump[3, 1, 0] = eps
    torch.testing.assert_close(
        g_noise[3, 1, 0], (f(X0, dws + bump) - f(X0, dws - bump)) / (2 * eps), rtol=1e-6, atol=1e-9
    )


def test_vmap_over_runs_equals_a_loop():
    sde, theta = nonlinear_2d()
    dws = _noise(sde, theta, 8, 2)
    thetas = {name: torch.stack([leaf, leaf * 1.1, leaf * 0.9]) for name, leaf in theta.items()}
    lrs = torch.tensor([0.0, 0.3, 1.0], dtype=F64)
    states = vmap(lambda th: ft.init(sde, th, X0, particles=2))(thetas)
    for dw in dws:
        states = vmap(lambda s, lr: ft.step(sde, s, dw, DT, lr))(states, lrs)  # vmap over ft.step, the user's loop
    for r in range(3):
        one = _run(sde, {name: leaf[r] for name, leaf in thetas.items()}, dws, float(lrs[r]))
        torch.testing.assert_close(states.x[r], one.x, rtol=0, atol=1e-13)
        for name in theta:
            torch.testing.assert_close(states.theta[name][r], one.theta[name], rtol=0, atol=1e-13)
            torch.testing.assert_close(states.x_tilde[name][r], one.x_tilde[name], rtol=0, atol=1e-13)


def test_vmap_over_schedule_parameters():
    sde, theta = diagonal_2d()
    dws = _noise(sde, theta, 6, 2)
    scales = torch.tensor([0.1, 2.0], dtype=F64)
    final = vmap(lambda c: _run(sde, theta, dws, ft.schedules.inverse_time(c)).theta)(scales)
    for r in range(2):
        one = _run(sde, theta, dws, ft.schedules.inverse_time(float(scales[r]))).theta
        for name in theta:
            torch.testing.assert_close(final[name][r], one[name], rtol=0, atol=1e-13)


def test_linearise_under_grad():
    sde, theta = nonlinear_2d()
    x_tilde = {name: torch.full((2, *leaf.shape), 0.1, dtype=F64) for name, leaf in theta.items()}
    f = lambda th: ft.core.sensitivity.linearise(sde.coefficients, th, X0, x_tilde).total.cost["w"]
    reference = _central(f, theta)
    for name, g in grad(f)(theta).items():
        torch.testing.assert_close(g, reference[name], rtol=1e-6, atol=1e-8)


def _calibration_problem():
    problem = calibration.calibration(
        lambda th, x: -th["k"] * x,
        lambda th, x: th["s"] * torch.ones_like(x),
        lambda th, x: torch.stack([x[0], x[0] ** 2]),
        torch.tensor([0.1, 0.5], dtype=F64),
    )
    return problem, {"k": torch.tensor([1.0], dtype=F64), "s": torch.tensor([0.8], dtype=F64)}


def test_calibration_step_under_grad_and_vmap():
    problem, theta = _calibration_problem()
    generator = torch.Generator().manual_seed(1)
    dws = torch.randn((6, 4, 1), generator=generator, dtype=F64) * DT**0.5
    x0 = torch.tensor([0.5], dtype=F64)

    def f(th, lr=2.0):
        state = calibration.init(problem, th, x0, particles=4)
        for dw in dws:
            state = calibration.step(problem, state, dw, DT, lr)
        return state.theta["k"].sum() + state.x.sum()

    gradient = grad(f)(theta)
    reference = _central(f, theta)
    for name in theta:
        torch.testing.assert_close(gradient[name], reference[name], rtol=1e-6, atol=1e-9)
    lrs = torch.tensor([0.0, 2.0, 5.0], dtype=F64)
    torch.testing.assert_close(
        vmap(lambda lr: f(theta, lr))(lrs), torch.stack([f(theta, float(a)) for a in lrs]), rtol=0, atol=1e-13
    )


def test_sgdct_step_under_grad_and_vmap():
    sde = ft.SDE(lambda th, x: -th["k"] * x, lambda th, x: torch.ones_like(x) * 0.5, lambda th, x: x.sum() * 0)
    theta = {"k": torch.tensor([0.7], dtype=F64)}
    generator = torch.Generator().manual_seed(2)
    path = torch.randn((8, 1), generator=generator, dtype=F64) * 0.1

    def f(th, lr=0.5):
        state, x = sgdct.init(th), torch.tensor([1.0], dtype=F64)
        for dx in path:
            state = sgdct.step(sde, state, x, dx, DT, lr)
            x = x + dx
        return state.theta["k"].sum()

    gradient = grad(f)(theta)["k"]
    torch.testing.assert_close(gradient, _central(f, theta)["k"], rtol=1e-6, atol=1e-9)
    lrs = torch.tensor([0.0, 0.5, 2.0], dtype=F64)
    torch.testing.assert_close(
        vmap(lambda lr: f(theta, lr))(lrs), torch.stack([f(theta, float(a)) for a in lrs]), rtol=0, atol=1e-13
    )


def test_compiled_kernel_runs_eagerly_under_transforms():
    """Dynamo cannot trace a transform's tensors from outside: the compiled function runs its eager twin,
    with the same derivatives and no fallback warning (compilation stays on for plain calls)."""
    sde, theta = diagonal_2d()
    dws = _noise(sde, theta, 3, 2)
    problem = ft.problems.CostForm(sde, ft.Euler(mode="forward"))
    start = ft.init(sde, theta, X0, particles=2)
    plan = problem.plan(start)
    alpha = torch.tensor(0.1, dtype=F64)
    one_step = ft.compile.function_kernel(
        lambda s, d, a: problem.advance(s, d, DT, a, plan),
        (start, dws[0], alpha),
        key=(problem, plan, DT),
        options=ft.Compile(True, compiler="dynamo", backend="eager"),
    )

    def f(th, advance):
        state = ft.init(sde, th, X0, particles=2)
        for dw in dws:
            state = advance(state, dw)
        return state.x

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        compiled = jacfwd(lambda th: f(th, lambda s, dw: one_step(s, dw, 0.1)[0]))(theta)
        stepped = jacfwd(lambda th: f(th, lambda s, dw: ft.step(sde, s, dw, DT, 0.1, mode="forward", compile=True)))(
            theta
        )
        batched = vmap(lambda lr: one_step(ft.init(sde, theta, X0, particles=2), dws[0], lr)[0].x)(
            torch.tensor([0.0, 0.1], dtype=F64)
        )
    eager = jacfwd(lambda th: f(th, lambda s, dw: ft.step(sde, s, dw, DT, 0.1, mode="forward")))(theta)
    for name in theta:
        torch.testing.assert_close(compiled[name], eager[name], rtol=0, atol=1e-14)
        torch.testing.assert_close(stepped[name], eager[name], rtol=0, atol=1e-14)
    assert batched.shape == (2, 2, 2)


def test_average_cost_is_differentiable_and_stationary_cost_refuses_transforms():
    sde, theta = diagonal_2d()
    dws = _noise(sde, theta, 30, 4)
    f = lambda th: average_cost(sde, th, X0, dws, DT, burn_in=5).mean()
    reference = _central(f, theta)
    for name, g in grad(f)(theta).items():
        torch.testing.assert_close(g, reference[name], rtol=1e-6, atol=1e-9)
    for transform, name in ((grad, "grad"), (vmap, "vmap")):
        with pytest.raises(TypeError, match=f"stationary_cost cannot run inside torch.func.{name}.*average_cost"):
            arg = theta if transform is grad else {k: v.expand(2, -1) for k, v in theta.items()}
            transform(lambda th: torch.as_tensor(ft.stationary_cost(sde, th, X0, steps=3, burn_in=0).mean))(arg)


def test_is_concrete_and_value_checks_skipped_under_transforms():
    x = torch.ones(2)
    seen = []
    vmap(lambda v: seen.append(_checks.is_concrete(v)) or v)(torch.ones(3, 2))
    grad(lambda v: seen.append(_checks.is_concrete(v)) or v.sum())(x)
    assert seen == [False, False] and _checks.is_concrete(x) and _checks.is_concrete(1.0)
    sde, theta = diagonal_2d()
    # value checks read numbers, which vmap cannot: skipped (these used to crash with a data-dependent error)
    stacked = {name: torch.stack([leaf, leaf]) for name, leaf in theta.items()}
    states = vmap(lambda th: ft.init(sde, th, X0, particles=2))(stacked)
    assert states.x.shape == (2, 2, 2)
    # the structural checks still run under the transform
    with pytest.raises(TypeError, match="dtype torch.float32"):
        vmap(lambda th: ft.init(sde, th, X0.float(), particles=2))(stacked)
    with pytest.raises(ValueError, match="0-d tensor"):
        vmap(lambda a: ft.step(sde, states, torch.zeros(2, 2, dtype=F64), DT, a))(torch.zeros(2, 3, dtype=F64))
    with pytest.raises(ValueError, match="returned a torch.float64 tensor of shape \\(3,\\)"):
        vmap(
            lambda a: ft.step(
                sde, ft.init(sde, theta, X0), torch.zeros(1, 2, dtype=F64), DT, lambda t: a * torch.ones(3, dtype=F64)
            )
        )(torch.zeros(2, dtype=F64))


def test_plain_calls_stay_graph_free():
    sde, theta = nonlinear_2d()
    dws = _noise(sde, theta, 2, 2)
    state = _run(sde, theta, dws, ft.schedules.inverse_time(torch.tensor(0.5, dtype=F64)))
    assert all(leaf.grad_fn is None and not leaf.requires_grad for leaf in torch.utils._pytree.tree_leaves(state))


def _controlled(outputs):
    """A ControlledSDE, control 2 -> 4 -> ``outputs`` (tanh), diagonal diffusion depending on x and u.
    route="auto" takes the structure-aware route for one control output, the generic one for two."""
    g = torch.Generator().manual_seed(3)
    theta = {
        "w1": 0.5 * torch.randn(4, 2, generator=g, dtype=F64),
        "b1": 0.1 * torch.randn(4, generator=g, dtype=F64),
        "w2": 0.5 * torch.randn(outputs, 4, generator=g, dtype=F64),
    }
    sde = ft.ControlledSDE(
        control=lambda th, x: th["w2"] @ torch.tanh(th["w1"] @ x + th["b1"]),
        drift=lambda x, u: torch.stack([-x[0] + u[0], -0.5 * x[1] + 0.2 * u[-1]]),
        diffusion=lambda x, u: torch.stack([0.3 + 0.1 * torch.tanh(u[0] + x[1]), 0.4 + 0.05 * u[-1] * x[0]]),
        cost=lambda x, u: (x**2).sum() + (u**2).sum(),
    )
    return sde, theta


@pytest.mark.parametrize("outputs, structured", [(1, True), (2, False)])
@pytest.mark.parametrize("mode", ["reverse", "auto"])
def test_either_automatic_route_composes_with_the_users_transforms(outputs, structured, mode):
    """jacfwd/jacrev of the particles equal x_tilde and vmap over runs equals a loop, whichever route
    ``route="auto"`` took (the route decision reads shapes only)."""
    sde, theta = _controlled(outputs)
    assert (sde.plan_at(theta, X0, "reverse").route == "structured") is structured
    dws = _noise(sde, theta, 20, 3)
    state = _run(sde, theta, dws, 0.0, mode)
    assert max(float(leaf.abs().max()) for leaf in state.x_tilde.values()) > 0.05
    for transform in (jacfwd, jacrev):
        jacobian = transform(lambda th: _run(sde, th, dws, 0.0, mode).x)(theta)
        for name in theta:
            torch.testing.assert_close(jacobian[name], state.x_tilde[name], rtol=0, atol=1e-10)
    lrs = torch.tensor([0.0, 0.5, 2.0], dtype=F64)
    batched = vmap(lambda lr: _run(sde, theta, dws, lr, mode))(lrs)
    for i, lr in enumerate(lrs):
        alone = _run(sde, theta, dws, lr, mode)
        for name in theta:
            torch.testing.assert_close(batched.theta[name][i], alone.theta[name], rtol=1e-12, atol=1e-14)
