"""Jump-diffusions (fwdtrain.core.jumps): exact sensitivities with the events fixed, the score of a varying
intensity against finite differences, the jump LQR's closed forms, the draws, purity, resume, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import jacrev, vmap

import fwdtrain as ft
from fwdtrain.core.evaluate import average_cost
from fwdtrain.core.step import draw_events
from fwdtrain.examples import jump_linear_cost, jump_lqr, jump_lqr_sde, jump_optimal_gain

D64 = torch.float64
DT = 0.05


def theta0() -> dict:
    return {"k": torch.tensor(0.7, dtype=D64), "b": torch.tensor([0.2, -0.1], dtype=D64)}


def jump_sde(rate="varying") -> ft.SDE:
    """A 2-D SDE whose drift, diffusion, jump size and (optionally) rate all depend on theta and x."""
    varying = lambda th, x: torch.nn.functional.softplus(th["b"].sum() + 0.5 * x[0]) + 0.5
    return ft.SDE(
        lambda th, x: -th["k"] * x + th["b"],
        lambda th, x: 0.3 + 0.1 * torch.tanh(x) * th["k"],
        lambda th, x: (x * x).sum() + (th["b"] * x).sum(),
        jumps=ft.Jumps(
            lambda th, x, z: th["k"] * torch.tanh(x) * z + th["b"] * z.sum(),
            rate=2.0 if rate == "constant" else varying,
            marks=torch.distributions.MultivariateNormal(
                torch.tensor([0.5, -0.2]), scale_tril=torch.tensor([[0.4, 0.0], [0.1, 0.3]])
            ),
        ),
    )


def increments(steps: int, particles: int, width: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((steps, particles, width), generator=generator, dtype=D64) * math.sqrt(DT)


@pytest.mark.parametrize("rate", ["constant", "varying"])
def test_xtilde_equals_jacrev_through_the_chain_with_the_events_fixed(rate):
    sde, x0 = jump_sde(rate), torch.tensor([0.3, -0.4], dtype=D64)
    dw = increments(12, 3, 2 + 3)  # m = 2 Brownian, 1 event draw, 2 mark numbers

    def final(theta):
        state = ft.init(sde, theta, x0, 3)
        for n in range(dw.shape[0]):
            state = ft.step(sde, state, dw[n], DT, 0.0)
        return state

    state = final(theta0())
    events = sum(float(draw_events(sde, theta0(), x0.expand(3, 2), dw[n][:, 2:], DT).dn.sum()) for n in range(12))
    assert events > 0  # the chain does jump (at x0 already; the test is about the events it has)
    jacobian = jacrev(lambda th: final(th).x)(theta0())
    for name in ("k", "b"):
        torch.testing.assert_close(state.x_tilde[name], jacobian[name], rtol=1e-10, atol=1e-12)
    assert all(leaf.grad_fn is None for leaf in (state.x, *state.x_tilde.values()))


def controlled_jump_sde(rate="varying") -> ft.ControlledSDE:
    """A 2-D controlled jump SDE with a 2 -> 6 -> 1 tanh control, jumps and (optionally) a rate in (x, u)."""
    return ft.ControlledSDE(
        control=lambda th, x: torch.tanh(x @ th["w1"].T) @ th["w2"].T,
        drift=lambda x, u: -x + u,
        diffusion=lambda x, u: 0.3 + 0.1 * torch.tanh(x * u),
        cost=lambda x, u: (x * x).sum() + (u * u).sum(),
        jumps=ft.Jumps(
            lambda x, u, z: torch.tanh(x + u) * z,
            rate=2.0 if rate == "constant" else (lambda x, u: 1.0 + torch.sigmoid((x * u).sum())),
            marks=torch.distributions.Normal(0.3, 0.5),
        ),
    )


def controlled_theta() -> dict:
    generator = torch.Generator().manual_seed(3)
    return {
        name: torch.randn(shape, generator=generator, dtype=D64) for name, shape in (("w1", (6, 2)), ("w2", (1, 6)))
    }


@pytest.mark.parametrize("rate", ["constant", "varying"])
@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_the_structured_route_differentiates_the_jump_terms_as_the_generic_one(rate, mode):
    from fwdtrain.core.sensitivity import Plan
    from fwdtrain.core.step import particle_terms

    sde, theta = controlled_jump_sde(rate), controlled_theta()
    x = torch.tensor([[0.5, -0.3], [0.1, 0.9], [-1.2, 0.4]], dtype=D64)
    generator = torch.Generator().manual_seed(1)
    x_tilde = {k: torch.randn((3, 2, *v.shape), generator=generator, dtype=D64) for k, v in theta.items()}
    events = draw_events(sde, theta, x, torch.randn((3, 2), generator=generator, dtype=D64), DT)
    events = events._replace(dn=torch.tensor([1.0, 0.0, 1.0], dtype=D64))  # both kinds of step
    names = ("mu", "sigma", "cost")
    routes = [
        particle_terms(sde, theta, Plan(mode, r), events, DT)(x, x_tilde, names) for r in ("structured", "generic")
    ]
    (value_s, total_s), (value_g, total_g) = routes
    assert set(total_s) == set(total_g) and "jump" in total_s and (("likelihood" in total_s) == (rate == "varying"))
    torch.testing.assert_close(value_s, value_g, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(total_s, total_g, rtol=1e-12, atol=1e-12)
    assert float(total_s["jump"]["w2"].abs().max()) > 1e-3  # D jump is really there


def test_a_controlled_jump_chain_takes_the_structured_route_and_its_xtilde_is_exact():
    sde, x0 = controlled_jump_sde("varying"), torch.tensor([0.3, -0.4], dtype=D64)
    state0 = ft.init(sde, controlled_theta(), x0, 2)
    assert sde.plan_at(state0.theta, x0, "reverse").route == "structured"
    dw = increments(10, 2, 2 + 2)  # m = 2, one event draw, one mark number

    def final(theta):
        state = ft.init(sde, theta, x0, 2)
        for n in range(dw.shape[0]):
            state = ft.step(sde, state, dw[n], DT, 0.0, mode="reverse")
        return state

    state = final(controlled_theta())
    jacobian = jacrev(lambda th: final(th).x)(controlled_theta())
    torch.testing.assert_close(state.x_tilde, jacobian, rtol=1e-10, atol=1e-12)
    score = jacrev(lambda th: final(th).score)(controlled_theta())  # the score's own derivative exists too
    assert all(torch.isfinite(leaf).all() for leaf in ft.core._tree.leaves(score))


def test_a_constant_rate_carries_no_score_and_a_varying_one_does():
    x0 = torch.zeros(2, dtype=D64)
    assert ft.init(jump_sde("constant"), theta0(), x0).score == ()
    score = ft.init(jump_sde("varying"), theta0(), x0, 4).score
    assert {k: tuple(v.shape) for k, v in score.items()} == {"k": (4,), "b": (4, 2)}


def test_events_and_marks_follow_the_rate_and_the_distribution():
    sde = ft.SDE(
        lambda th, x: 0 * x,
        lambda th, x: torch.ones_like(x),
        lambda th, x: x.sum(),
        jumps=ft.Jumps(lambda th, x, z: z * torch.ones_like(x), rate=3.0, marks=torch.distributions.Exponential(2.0)),
    )
    n = 200_000
    normals = torch.randn((n, 2), generator=torch.Generator().manual_seed(1), dtype=D64)
    events = draw_events(sde, {"a": torch.zeros((), dtype=D64)}, torch.zeros((n, 1), dtype=D64), normals * 0.1, 0.01)
    p = 1 - math.exp(-3.0 * 0.01)
    assert abs(float(events.dn.mean()) - p) < 4 * math.sqrt(p * (1 - p) / n)
    assert abs(float(events.z.mean()) - 0.5) < 4 * 0.5 / math.sqrt(n)  # Exponential(2): mean 1/2, sd 1/2
    assert abs(float(events.z.var()) - 0.25) < 0.01


def test_the_score_gradient_agrees_with_finite_differences_and_the_pathwise_one_does_not():
    """d/dk of the mean cost over 30 steps for an intensity that depends on k and x: the estimate (pathwise
    + score) against central differences of the same chain with common draws, over 12 seeds."""
    sde = ft.SDE(
        lambda th, x: -x,
        lambda th, x: 0.3 * torch.ones_like(x),
        lambda th, x: (x * x).sum(),
        jumps=ft.Jumps(
            lambda th, x, z: z * torch.ones_like(x),
            rate=lambda th, x: torch.exp(th["k"]) * (1 + 0.5 * torch.tanh(x.sum())),
            marks=torch.distributions.Normal(0.6, 0.2),
        ),
    )
    theta, x0, steps, particles, eps = {"k": torch.tensor(0.5, dtype=D64)}, torch.zeros(1, dtype=D64), 30, 4000, 0.1
    estimates, differences = [], []
    for seed in range(12):
        dw = increments(steps, particles, 3, seed)
        state, total = ft.init(sde, theta, x0, particles), 0.0
        for n in range(steps):
            state, info = ft.step_with_info(sde, state, dw[n], DT, 0.0)
            total += float(info.gradient["k"])
        estimates.append(total / steps)
        plus = average_cost(sde, {"k": theta["k"] + eps}, x0, dw, DT).mean()
        minus = average_cost(sde, {"k": theta["k"] - eps}, x0, dw, DT).mean()
        differences.append(float(plus - minus) / (2 * eps))
    assert not state.x_tilde["k"].any()  # nothing but the events depends on k: the pathwise estimate is 0
    estimate, difference = torch.tensor(estimates), torch.tensor(differences)
    error = math.sqrt((estimate.var() + difference.var()) / 12)
    assert abs(float(estimate.mean() - difference.mean())) < 3 * error
    assert float(difference.mean()) > 10 * error  # so the pathwise estimate alone would be rejected


def test_the_score_is_the_gradient_of_the_events_log_probability():
    """S_K = d/dtheta sum_n log P(dN_n | X_n) along the chain, computed by jacrev through the chain."""
    sde, x0 = jump_sde("varying"), torch.tensor([0.1, 0.2], dtype=D64)
    dw = increments(10, 2, 5, seed=3)

    def log_probability(theta):
        state, total = ft.init(sde, theta, x0, 2), torch.zeros(2, dtype=D64)
        for n in range(dw.shape[0]):
            events = draw_events(sde, theta, state.x, dw[n][:, 2:], DT)
            rate = vmap(lambda xi: sde.jump_rate(theta, xi))(state.x)
            total = total + ft.core.jumps.likelihood(events.dn, rate, DT)
            state = ft.step(sde, state, dw[n], DT, 0.0)
        return total, state

    _, state = log_probability(theta0())
    jacobian = jacrev(lambda th: log_probability(th)[0])(theta0())
    for name in ("k", "b"):
        torch.testing.assert_close(state.score[name], jacobian[name], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["additive", "proportional"])
def test_jump_lqr_learns_its_closed_form_gain(kind):
    example = jump_lqr(kind=kind)
    run = ft.run(example.trainable, example.initial_state(), example.steps, example.dt, example.lr, 0, compile=True)
    learned, reference = example.measure(run.state.theta), example.reference
    assert learned["gain"] == pytest.approx(reference["gain"], rel=0.05)
    assert learned["cost"] == pytest.approx(reference["cost"], rel=0.01)
    assert jump_optimal_gain("proportional", 2.0, 0.5) == pytest.approx(0.5)  # the jumps do move the optimum


@pytest.mark.parametrize("kind", ["additive", "proportional"])
def test_jump_lqr_eager_and_compiled_runs_are_equal(kind):
    example = jump_lqr(kind=kind, particles=32)
    runs = [
        ft.run(example.sde, example.initial_state(), 400, example.dt, example.lr, 5, compile=c) for c in (False, True)
    ]
    torch.testing.assert_close(runs[0].state.theta, runs[1].state.theta, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(runs[0].state.x, runs[1].state.x, rtol=1e-5, atol=1e-6)


def test_additive_jumps_keep_the_riccati_gain_and_add_rate_times_the_mark_variance_to_the_cost():
    sde, k = jump_lqr_sde("additive", sigma=0.5, rate=2.0, mark_scale=0.5), math.sqrt(2) - 1
    theta = {"gain": torch.tensor(k, dtype=D64)}
    measured = ft.stationary_cost(
        sde, theta, torch.zeros(1, dtype=D64), particles=2000, dt=0.01, steps=3000, burn_in=500
    )
    expected = k * (0.5**2 + 2.0 * 0.5**2)
    assert expected == pytest.approx(jump_linear_cost(k, "additive", 0.5, 2.0, 0.5))
    assert abs(measured.mean - expected) < 4 * measured.stderr + 0.01 * expected  # + Euler's O(h) bias


def test_a_continued_run_equals_the_uninterrupted_one_and_a_checkpoint_keeps_the_score(tmp_path):
    sde, state = jump_sde("varying"), ft.init(jump_sde("varying"), theta0(), torch.zeros(2, dtype=D64), 3)
    whole = ft.run(sde, state, 90, DT, 0.05, 4)
    half = ft.run(sde, state, 40, DT, 0.05, 4)
    path = tmp_path / "half.pt"
    ft.save(path, half.state, half.history)
    rest = ft.run(sde, half, 50, DT, 0.05, 4)
    torch.testing.assert_close(rest.state.score, whole.state.score, rtol=0, atol=0)
    torch.testing.assert_close(rest.state.x, whole.state.x, rtol=0, atol=0)
    loaded = ft.load(path)
    torch.testing.assert_close(loaded.state.score, half.state.score, rtol=0, atol=0)
    resumed = ft.run(sde, loaded, 50, DT, 0.05, 4)
    torch.testing.assert_close(resumed.state.score, whole.state.score, rtol=0, atol=0)


def test_the_step_is_pure_and_vmaps_over_runs_like_a_loop():
    sde = jump_sde("varying")
    states = [ft.init(sde, theta0(), torch.tensor([0.1 * r, 0.0], dtype=D64), 2) for r in range(4)]
    dw = increments(4, 2, 5, seed=7)
    before = [tuple(t.clone() for t in ft.core._tree.leaves(s)) for s in states]
    looped = [ft.step(sde, s, w, DT, 0.1) for s, w in zip(states, dw, strict=True)]
    batched = vmap(lambda s, w: ft.step(sde, s, w, DT, 0.1))(
        ft.core._tree.tree_map(lambda *xs: torch.stack(xs), *states), dw
    )
    for r, one in enumerate(looped):
        torch.testing.assert_close(ft.core._tree.tree_map(lambda leaf: leaf[r], batched), one)
    for s, saved in zip(states, before, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(ft.core._tree.leaves(s), saved, strict=True))


def test_bad_jumps_are_refused_before_the_first_step():
    size = lambda th, x, z: z * torch.ones_like(x)
    with pytest.raises(ValueError, match="positive"):
        ft.Jumps(size, rate=-1.0)
    with pytest.raises(ValueError, match="positive"):
        ft.Jumps(size, rate=0.0)
    with pytest.raises(TypeError, match="Distribution"):
        ft.Jumps(size, rate=1.0, marks=[0.5])
    with pytest.raises(ValueError, match="inverse CDF"):
        ft.Jumps(size, rate=1.0, marks=torch.distributions.Gamma(2.0, 1.0))
    with pytest.raises(TypeError, match="size"):
        ft.Jumps(0.5)
    with pytest.raises(TypeError, match="Jumps"):
        ft.SDE(lambda th, x: x, lambda th, x: x, lambda th, x: x.sum(), jumps=size)

    def sde(jumps):
        return ft.SDE(lambda th, x: -x, lambda th, x: torch.ones_like(x), lambda th, x: (x * x).sum(), jumps=jumps)

    theta, x0 = {"a": torch.zeros((), dtype=D64)}, torch.zeros(2, dtype=D64)
    with pytest.raises(ValueError, match=r"size returned shape \(3,\)"):
        ft.init(sde(ft.Jumps(lambda th, x, z: torch.ones(3, dtype=D64), 1.0)), theta, x0)
    with pytest.raises(ValueError, match="rate is negative"):
        ft.init(sde(ft.Jumps(size, lambda th, x: x.sum() - 1.0)), theta, x0)
    with pytest.raises(ValueError, match=r"rate returned shape \(2,\)"):
        ft.init(sde(ft.Jumps(size, lambda th, x: x + 1.0)), theta, x0)
    good = sde(ft.Jumps(size, 1.0, torch.distributions.Normal(0.0, 1.0)))
    state = ft.init(good, theta, x0)
    with pytest.raises(ValueError, match="2 Brownian increments and 2 jump draws"):
        ft.step(good, state, torch.zeros((1, 2), dtype=D64), 0.1, 0.1)
    for solver in (ft.Heun(), ft.Milstein()):
        with pytest.raises(ValueError, match="does not take jumps"):
            ft.run(good, state, 10, 0.1, 0.1, solver=solver)
    with pytest.raises(ValueError, match="jump score"):
        ft.step(good, state._replace(score={"a": torch.zeros(1, dtype=D64)}), torch.zeros((1, 4), dtype=D64), 0.1, 0.1)
    varying = sde(ft.Jumps(size, lambda th, x: 1.0 + th["a"]))
    with pytest.raises(ValueError, match="must carry the events' score"):
        ft.step(varying, state, torch.zeros((1, 3), dtype=D64), 0.1, 0.1)


def test_a_0d_jump_size_is_the_jump_of_a_1d_state_and_is_refused_for_d_2():
    """``size=lambda x, u, z: z`` with a scalar mark is the jump of a 1-D state: the run equals the one whose
    size returns (1,); for d = 2 a 0-d size is still refused, naming the shape it must have."""

    def sde(size):
        return ft.ControlledSDE(
            control=lambda th, x: -th["k"] * x,
            drift=lambda x, u: -x + u,
            diffusion=lambda x, u: 0.5 * torch.ones_like(x),
            cost=lambda x, u: (x * x + u * u).sum(),
            noise_type="additive",
            jumps=ft.Jumps(size, rate=5.0, marks=torch.distributions.Normal(0.2, 0.5)),
        )

    theta, x0 = {"k": torch.tensor(0.3, dtype=D64)}, torch.ones(1, dtype=D64)
    scalar, vector = sde(lambda x, u, z: z * (1 + u.sum())), sde(lambda x, u, z: (z * (1 + u.sum())).reshape(1))
    runs = [
        ft.run(s, ft.init(s, theta, x0, particles=8), 200, DT, 0.1, noise=3, compile=False) for s in (scalar, vector)
    ]
    assert float(runs[0].state.x.std()) > 0.1
    for a, b in zip(runs[0].state, runs[1].state):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(runs[0].state.theta["k"], runs[1].state.theta["k"], rtol=0, atol=0)
    assert float((runs[0].state.theta["k"] - theta["k"]).abs()) > 1e-4
    with pytest.raises(ValueError, match=r"size returned shape \(\) at x0; it must return \(2,\)"):
        ft.init(scalar, theta, torch.ones(2, dtype=D64))


@pytest.mark.parametrize(
    "marks",
    [
        torch.distributions.Bernoulli(torch.tensor(0.3)),
        torch.distributions.Categorical(torch.tensor([0.2, 0.5, 0.1, 0.2])),
        torch.distributions.Binomial(3, torch.tensor(0.4)),
        torch.distributions.Independent(torch.distributions.Bernoulli(torch.tensor([0.1, 0.8])), 1),
    ],
    ids=["Bernoulli", "Categorical", "Binomial", "Independent(Bernoulli)"],
)
def test_discrete_marks_are_drawn_by_counting_their_cdf_with_the_right_frequencies(marks):
    """Marks of a finite support come from the uniform column by the inverse CDF by counting: the empirical
    frequency of every support point matches its probability (within 5 standard errors, 200,000 draws), and the
    draws are the state's dtype."""
    jumps = ft.Jumps(lambda th, x, z: z.sum() * torch.ones_like(x), rate=1.0, marks=marks)
    n = 200_000
    _, z = jumps.draws(torch.randn((n, jumps.width), generator=torch.Generator().manual_seed(2), dtype=D64))
    assert z.dtype == D64 and z.shape == (n, *marks.event_shape)
    base = marks.base_dist if isinstance(marks, torch.distributions.Independent) else marks
    support = base.enumerate_support(expand=True)  # (K, *batch)
    probabilities = base.log_prob(support).exp().double()
    columns = z.reshape(n, -1)
    for k in range(support.shape[0]):
        for j, (point, p) in enumerate(zip(support[k].reshape(-1), probabilities[k].reshape(-1))):
            frequency = float((columns[:, j] == float(point)).double().mean())
            assert abs(frequency - float(p)) < 5 * math.sqrt(float(p) * (1 - float(p)) / n) + 1e-12, (k, j)
    assert bool(torch.isin(columns, support.double().unique()).all())


def test_bernoulli_marks_run_and_poisson_marks_are_refused_naming_what_works():
    """A jump SDE with Bernoulli marks (a jump up or none) trains; marks with neither an inverse CDF nor a finite
    support are refused when the Jumps is made."""
    sde = ft.SDE(
        lambda th, x: -th["k"] * x,
        lambda th, x: 0.3 * torch.ones_like(x),
        lambda th, x: (x * x).sum(),
        jumps=ft.Jumps(lambda th, x, z: z * th["k"], rate=4.0, marks=torch.distributions.Bernoulli(0.5)),
    )
    state = ft.init(sde, {"k": torch.tensor(1.0, dtype=D64)}, torch.zeros(1, dtype=D64), particles=16)
    result = ft.run(sde, state, 300, DT, 0.05, noise=0, compile=False)
    assert result.history.steps == 300 and bool(torch.isfinite(result.state.x).all())
    assert float(result.state.theta["k"]) < 1.0
    counting = r"Poisson.*counting a finite support's CDF \(Bernoulli, Categorical, Binomial\)"
    with pytest.raises(ValueError, match=counting):
        ft.Jumps(lambda th, x, z: z * torch.ones_like(x), rate=1.0, marks=torch.distributions.Poisson(2.0))
