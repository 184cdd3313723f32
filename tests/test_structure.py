"""The structure-aware route for ControlledSDE and declared noise types (fwdtrain.sensitivity, fwdtrain.problem)."""

import pytest
import torch
from test_sensitivity import _check_against_finite_differences
from torch.func import jacfwd

import fwdtrain as ft
import fwdtrain._compat
from fwdtrain.core._tree import leaves, tree_map
from fwdtrain.core.problem import check_noise_type
from fwdtrain.core.sensitivity import Plan, control_rows, linearise_particles, per_leaf
from fwdtrain.core.step import propagate
from fwdtrain.problems import CostForm

F64 = torch.float64


def _theta(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "w1": 0.5 * torch.randn(4, 2, generator=g, dtype=F64),
        "b1": 0.1 * torch.randn(4, generator=g, dtype=F64),
        "w2": 0.5 * torch.randn(2, 4, generator=g, dtype=F64),
    }


def _control(th, x):
    """Two control outputs from a 2 -> 4 -> 2 tanh network."""
    return th["w2"] @ torch.tanh(th["w1"] @ x + th["b1"])


def _drift(x, u):
    return torch.stack([-x[0] + u[0] * torch.cos(x[1]), -0.5 * x[1] + u[1] + 0.2 * u[0] * u[1]])


def _full_diffusion(x, u):  # (2, 3), depends on x and u
    return torch.stack(
        [
            torch.stack([0.3 + 0.1 * u[0], 0.05 * x[1], 0.1 * torch.sin(u[1])]),
            torch.stack([0.02 * x[0] * u[1], 0.4 + 0.05 * x[0] ** 2, 0.1 * u[0]]),
        ]
    )


def _diagonal_diffusion(x, u):  # (2,), depends on x and u
    return torch.stack([0.3 + 0.1 * torch.tanh(u[0] + x[1]), 0.4 + 0.05 * u[1] * x[0]])


def _cost(x, u):
    return (x**2).sum() + (u**2).sum() + 0.3 * x[0] * u[1]


def controlled(noise: str) -> ft.ControlledSDE:
    """A 2-D ControlledSDE with a two-output control; diffusion "general", "diagonal" or "additive"."""
    if noise == "additive":
        sigma = torch.tensor([[0.3, 0.1, 0.0], [0.0, 0.4, 0.2]], dtype=F64)
        return ft.ControlledSDE(_control, _drift, lambda x, u: sigma, _cost, noise_type="additive")
    diffusion = _full_diffusion if noise == "general" else _diagonal_diffusion
    return ft.ControlledSDE(_control, _drift, diffusion, _cost)


def _random_sensitivity(theta, particles, d=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return tree_map(lambda leaf: torch.randn(particles, d, *leaf.shape, generator=g, dtype=F64), theta)


@pytest.mark.parametrize("noise", ["general", "diagonal"])
@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_structured_route_equals_generic_route(noise, mode):
    sde, theta = controlled(noise), _theta()
    x = torch.tensor([[0.5, -0.3], [0.1, 0.9], [-1.2, 0.4]], dtype=F64)
    x_tilde = _random_sensitivity(theta, 3)
    structured = linearise_particles(sde, theta, x, x_tilde, mode, route="structured")
    generic = linearise_particles(sde.coefficients, theta, x, x_tilde, mode)
    for left, right in zip(leaves(structured), leaves(generic), strict=True):
        torch.testing.assert_close(left, right, rtol=1e-12, atol=1e-12)
    assert max(leaf.abs().max() for leaf in leaves(structured.total.sigma)) > 1e-3  # D sigma is really there


def test_control_rows_modes_agree_and_match_the_chain_rule():
    theta, x = _theta(), torch.tensor([0.3, -0.7], dtype=F64)
    x_tilde = tree_map(lambda leaf: leaf[0], _random_sensitivity(theta, 1))
    u, rows = control_rows(_control, theta, x, x_tilde, "reverse")
    _, rows_forward = control_rows(_control, theta, x, x_tilde, "forward")
    d_u, d_u_forward = (per_leaf(blocks, u.shape, theta) for blocks in (rows, rows_forward))
    u_theta = torch.autograd.functional.jacobian(
        lambda *leaves_: _control(dict(zip(theta, leaves_)), x), tuple(theta.values())
    )
    u_x = torch.autograd.functional.jacobian(lambda x_: _control(theta, x_), x)
    torch.testing.assert_close(u, _control(theta, x))
    for (name, _leaf), jac in zip(theta.items(), u_theta):
        expected = jac + torch.tensordot(u_x, x_tilde[name], dims=1)
        torch.testing.assert_close(d_u[name], expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(d_u_forward[name], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("noise,m", [("general", 3), ("diagonal", 2), ("additive", 3)])
def test_structured_sensitivity_matches_finite_differences(noise, m):
    _check_against_finite_differences(controlled(noise), _theta(), torch.tensor([0.5, -0.3], dtype=F64), m, "reverse")


def test_additive_plain_sde_sensitivity_matches_finite_differences():
    sde, theta = _additive_plain()
    _check_against_finite_differences(sde, theta, torch.tensor([0.5, -0.3], dtype=F64), 2, "forward")


def _additive_plain(noise_type="additive"):
    theta = {"a": torch.tensor([[-1.0, 0.3], [0.2, -0.8]], dtype=F64), "w": torch.tensor(0.7, dtype=F64)}
    sigma = torch.tensor([0.5, 0.2], dtype=F64)
    sde = ft.SDE(
        lambda th, x: th["a"] @ x + th["w"] * torch.sin(x),
        lambda th, x: sigma,
        lambda th, x: (x**2).sum() + th["w"] * x[0],
        noise_type=noise_type,
    )
    return sde, theta


@pytest.mark.parametrize("problem", ["controlled", "plain"])
@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_additive_skips_the_diffusion_derivative(problem, mode):
    """D sigma is not computed (total.sigma is None), and the step equals the inferred-type step."""
    if problem == "controlled":
        sde, theta = controlled("additive"), _theta()
        inferred = ft.ControlledSDE(sde.control, sde.controlled_drift, sde.controlled_diffusion, sde.controlled_cost)
    else:
        (sde, theta), (inferred, _) = _additive_plain(), _additive_plain(None)
    x = torch.tensor([[0.5, -0.3], [0.1, 0.9]], dtype=F64)
    x_tilde = _random_sensitivity(theta, 2)
    for route in ("structured", "generic"):
        assert linearise_particles(sde, theta, x, x_tilde, mode, route=route).total.sigma is None
    assert linearise_particles(inferred, theta, x, x_tilde, mode).total.sigma is not None
    state = ft.init(sde, theta, x)._replace(x_tilde=x_tilde)
    dw = torch.randn(2, ft.core.state.noise_dim(sde, theta, x), dtype=F64, generator=torch.Generator().manual_seed(4))
    a = ft.step(sde, state, dw, 0.01, 0.3, mode=mode)
    b = ft.step(inferred, state, dw, 0.01, 0.3, mode=mode)
    for left, right in zip(leaves(a), leaves(b), strict=True):
        torch.testing.assert_close(left, right, rtol=1e-12, atol=1e-14)


def test_examples_with_constant_diffusion_declare_additive():
    assert ft.examples.lqr_1d().sde.noise_type == "additive"


@pytest.mark.parametrize(
    "declared,diffusion,message",
    [
        ("additive", lambda x, u: 0.3 + 0.1 * x, "depends on x"),
        ("additive", lambda x, u: 0.3 + 0.1 * u, "depends on theta"),
        ("diagonal", lambda x, u: torch.ones(2, 2, dtype=F64), "noise_type='diagonal'"),
        ("general", lambda x, u: torch.ones(2, dtype=F64), "noise_type='general'"),
    ],
)
def test_wrong_declarations_are_clear_errors(declared, diffusion, message):
    sde = ft.ControlledSDE(
        lambda th, x: th["k"] * torch.ones_like(x),
        lambda x, u: -x + u,
        diffusion,
        lambda x, u: (x**2).sum(),
        noise_type=declared,
    )
    theta = {"k": torch.tensor([0.5, 0.2], dtype=F64)}
    with pytest.raises(ValueError, match=message):
        ft.init(sde, theta, torch.tensor([0.4, -0.1], dtype=F64))
    with pytest.raises(ValueError, match=message):
        check_noise_type(sde, theta, torch.tensor([0.4, -0.1], dtype=F64))


def test_unknown_noise_type_is_rejected_at_construction():
    with pytest.raises(ValueError, match="noise_type"):
        ft.SDE(lambda th, x: x, lambda th, x: x, lambda th, x: x.sum(), noise_type="scalar")
    with pytest.raises(ValueError, match="noise_type"):
        ft.ControlledSDE(_control, _drift, _diagonal_diffusion, _cost, noise_type="diag")


def test_check_noise_type_infers_from_the_shape():
    theta, x0 = _theta(), torch.tensor([0.1, 0.2], dtype=F64)
    assert check_noise_type(controlled("general"), theta, x0) == "general"
    assert check_noise_type(controlled("diagonal"), theta, x0) == "diagonal"
    assert check_noise_type(controlled("additive"), theta, x0) == "additive"


def _mode(mode, state, sde):
    """The derivative mode ``run`` and ``step`` take for this SDE and state."""
    return CostForm(sde).plan(state, mode).mode


def test_auto_picks_the_documented_route():
    theta, x0 = _theta(), torch.tensor([0.1, 0.2], dtype=F64)
    # structured: reverse costs k = 2 passes, forward p = 24: reverse
    sde = controlled("general")
    assert _mode("auto", ft.init(sde, theta, x0), sde) == "reverse"
    # structured with k = 5 control outputs and p = 1 parameter: forward
    wide = ft.ControlledSDE(
        lambda th, x: th["c"] * torch.ones(5, dtype=F64),
        lambda x, u: -x + u[:2],
        lambda x, u: torch.ones(2, dtype=F64),
        lambda x, u: (u**2).sum(),
    )
    c = {"c": torch.tensor(0.3, dtype=F64)}
    assert _mode("auto", ft.init(wide, c, x0), wide) == "forward"
    # generic, d = 2, m = 2, p = 3: inferred counts d + d m + 1 = 7 > 3 (forward), additive d + 1 = 3 (reverse)
    theta3 = {"a": torch.tensor([-1.0, 0.3], dtype=F64), "w": torch.tensor(0.7, dtype=F64)}
    gen = lambda nt: ft.SDE(
        lambda th, x: -x + th["a"] * th["w"],
        lambda th, x: torch.ones(2, dtype=F64),
        lambda th, x: (x**2).sum(),
        noise_type=nt,
    )
    assert _mode("auto", ft.init(gen("additive"), theta3, x0), gen("additive")) == "reverse"
    assert _mode("auto", ft.init(gen(None), theta3, x0), gen(None)) == "forward"
    assert _mode("reverse", ft.init(gen(None), theta3, x0), gen(None)) == "reverse"


@pytest.mark.parametrize("particles", [1, 2])
@pytest.mark.parametrize("noise", ["general", "additive"])
def test_structured_route_composes_with_the_users_jacfwd(noise, particles):
    """jacfwd of X_K (theta frozen) w.r.t. theta equals Xtilde_K: nested torch.func levels pass through."""
    sde, theta = controlled(noise), _theta()
    m = 3
    noise_draws = torch.randn(5, particles, m, dtype=F64, generator=torch.Generator().manual_seed(7)) * 0.1
    x0 = torch.tensor([[0.5, -0.3], [0.2, 0.1]], dtype=F64)[:particles]

    def run(theta_):
        state = ft.State(
            x0,
            tree_map(lambda leaf: torch.zeros(particles, 2, *leaf.shape, dtype=F64), theta_),
            theta_,
            torch.zeros((), dtype=F64),
        )
        for dw in noise_draws:
            moved, _ = propagate(sde, state, dw, 0.01, Plan("reverse", "structured"))
            state = moved._replace(t=state.t + 0.01)
        return state.x, state.x_tilde

    jacobian = jacfwd(lambda th: run(th)[0])(theta)
    _, x_tilde = run(theta)
    for name in theta:
        torch.testing.assert_close(jacobian[name], x_tilde[name], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("transformed", [False, True], ids=["eager", "under-vmap"])
@pytest.mark.parametrize("outputs", ["few", "many"])
def test_reverse_jacobian_equals_jacrev(outputs, transformed, monkeypatch):
    """Every branch (autograd eagerly; under a transform the pullbacks unrolled for <= UNROLLED_ROWS numbers,
    vmapped beyond) equals torch.func.jacrev, raveled into rows (n, numel) per leaf."""
    from torch.func import jacrev, vmap

    from fwdtrain.core.sensitivity import UNROLLED_ROWS, reverse_jacobian

    theta, x = _theta(), torch.tensor([0.3, -0.7], dtype=F64)

    def fn(th, x_):
        u = _control(th, x_)
        constant = torch.ones((), dtype=x_.dtype)  # depends on neither argument: rows of zeros
        outs = (u.sum(), _drift(x_, u)) if outputs == "few" else (_full_diffusion(x_, u), _cost(x_, u))
        return outs + (constant,), u

    if transformed:
        rows, outs, aux = vmap(lambda x_: reverse_jacobian(fn, theta, x_))(x[None])
        rows, outs, aux = tree_map(lambda t: t[0], (rows, outs, aux))
    else:
        rows, outs, aux = reverse_jacobian(fn, theta, x)
    expected, _ = jacrev(fn, argnums=(0, 1), has_aux=True)(theta, x)
    assert all(not bool(leaf.any()) for leaf in leaves(expected[-1]))
    want = [
        torch.cat(
            [
                torch.cat([leaf.reshape(o.numel(), -1) for leaf in leaves(per_arg[j])], 1)
                for per_arg, o in zip(expected, outs, strict=True)
            ]
        )
        for j in range(2)
    ]
    assert (sum(o.numel() for o in fn(theta, x)[0]) <= UNROLLED_ROWS) == (outputs == "few")
    if not transformed:  # the engine's handle and torch.autograd.grad give the same rows
        monkeypatch.setattr(fwdtrain._compat, "_ENGINE", None)
        fallback, _, _ = reverse_jacobian(fn, theta, x)
        for a, b in zip(leaves(fallback), leaves(rows), strict=True):
            assert torch.equal(a, b)
    torch.testing.assert_close(aux, _control(theta, x))
    for got, o in zip(outs, fn(theta, x)[0], strict=True):
        torch.testing.assert_close(got, o)
    assert all(block.grad_fn is None for blocks in rows for block in blocks)
    for blocks, w in zip(rows, want, strict=True):
        got = torch.cat(blocks, 1)
        assert got.shape == w.shape
        torch.testing.assert_close(got, w, rtol=1e-12, atol=1e-12)


def test_auto_route_takes_the_structured_route_only_where_it_costs_fewer_flops():
    from fwdtrain.core.sensitivity import structured_pays

    assert structured_pays("reverse", 1, 1, 2)  # lqr-1d: k = 1, n = d + 1 = 2 (a tie: structured)
    assert not structured_pays("reverse", 10, 10, 21)  # the 10-D LQR: k = d = 10, n = 21
    assert structured_pays("reverse", 1, 2, 9)  # a scalar control, general 2 x 3 noise: n = 9
    assert not structured_pays("forward", 1, 2, 9)  # forward mode: the contractions are extra work
    scalar = ft.ControlledSDE(
        lambda th, x: th["w2"][:1] @ torch.tanh(th["w1"] @ x + th["b1"]),
        _drift_1,
        _diffusion_1,
        lambda x, u: (x**2).sum() + (u**2).sum(),
    )
    theta, x0 = _theta(), torch.tensor([0.5, -0.3], dtype=F64)
    state = ft.init(scalar, theta, x0)
    assert _mode("auto", state, scalar) == "reverse"
    x_tilde = _random_sensitivity(theta, 1)
    auto = linearise_particles(scalar, theta, x0[None], x_tilde, "reverse")
    structured = linearise_particles(scalar, theta, x0[None], x_tilde, "reverse", route="structured")
    for left, right in zip(leaves(auto), leaves(structured), strict=True):
        assert torch.equal(left, right)  # the same computation: auto took the structured route
    with pytest.raises(ValueError, match="route must be"):
        ft.core.sensitivity.linearise(scalar, theta, x0, tree_map(lambda t: t[0], x_tilde), "reverse", route="fast")


def _drift_1(x, u):
    return torch.stack([-x[0] + u[0], -0.5 * x[1] + 0.2 * u[0]])


def _diffusion_1(x, u):  # (2, 3), depends on x and the scalar control
    return torch.stack(
        [
            torch.stack([0.3 + 0.1 * u[0], 0.05 * x[1], 0.1 * torch.sin(u[0])]),
            torch.stack([0.02 * x[0] * u[0], 0.4 + 0.05 * x[0] ** 2, 0.1 * u[0]]),
        ]
    )
