"""The prepared step (``fwdtrain.jit_step``, and ``step(..., compile=True)`` which uses it): checks and plans once
per key, the value checks on every call, one kernel call per repeated call, the same results and errors as
the eager step, and the compiled step under the user's ``vmap`` as one batched kernel.

The compiled tests of the default run take torch.compile's "eager" backend (a trace, no compiler); the
AOTInductor route itself is tested in the slow ones.
"""

import pytest
import torch
from torch.func import jacfwd, vmap

import fwdtrain as ft
from fwdtrain.compile import kernels
from fwdtrain.core._tree import leaves, tree_map

DT = 0.01
QUICK = ft.Compile(True, compiler="dynamo", backend="eager")
F64 = torch.float64


def problem(particles=3):
    ex = ft.examples.lqr_1d(dtype=F64, hidden=4, particles=particles)
    x0 = torch.linspace(-0.5, 1.5, particles, dtype=F64).unsqueeze(1)
    return ex, ft.init(ex.sde, ex.theta, x0)


def noise(steps, particles=3, runs=None, seed=5):
    shape = (steps, particles, 1) if runs is None else (steps, runs, particles, 1)
    return torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(seed)) * DT**0.5


def assert_trees_close(actual, expected, rtol=1e-10, atol=1e-12):
    for a, e in zip(leaves(actual), leaves(expected), strict=True):
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol)


def event_counts():
    return {k: v for k, v in kernels.counts().items() if k in ("traces", "compiles", "loads")}


def test_jit_step_is_one_object_per_problem_and_options():
    ex, _ = problem()
    fast = ft.jit_step(ex.sde, compile=QUICK)
    assert ft.jit_step(ex.sde, compile=QUICK) is fast
    assert ft.jit_step(ex.sde, compile=QUICK, solver="heun") is not fast
    assert ft.jit_step(ex.sde, compile=False) is not fast
    assert ft.jit_step(ex.sde, compile=False, solver=ft.Euler()) is ft.jit_step(ex.sde, compile=False)
    with pytest.raises(TypeError, match="compile must be"):  # the look-up of repeated calls keeps the type
        ft.jit_step(ex.sde, compile=0)
    with pytest.raises(TypeError, match="fwdtrain.SDE"):
        ft.jit_step(lambda x: x)
    with pytest.raises(ValueError, match="mode must be one of"):
        ft.jit_step(ex.sde, mode="sideways")
    with pytest.raises(ValueError, match="unknown solver"):
        ft.jit_step(ex.sde, solver="rk45")


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a fallback fails the test
def test_a_repeated_compiled_call_prepares_traces_and_compiles_nothing_and_equals_the_eager_step():
    ex, start = problem()
    fast = ft.jit_step(ex.sde, compile=QUICK)
    schedule = ft.schedules.inverse_time(1.0)
    compiled, eager = start, start
    increments = noise(12)
    compiled = fast(compiled, increments[0], DT, schedule)
    eager = ft.step(ex.sde, eager, increments[0], DT, schedule)
    before, prepared = event_counts(), fast.preparations
    for dw in increments[1:]:
        compiled = fast(compiled, dw, DT, schedule)
        eager = ft.step(ex.sde, eager, dw, DT, schedule)
    assert event_counts() == before and fast.preparations == prepared == 1
    assert_trees_close(compiled, eager)
    assert all(leaf.grad_fn is None and not leaf.requires_grad for leaf in leaves(compiled))
    # step(compile=...) is the same prepared object: it prepares nothing new either
    again = ft.step(ex.sde, compiled, increments[0], DT, schedule, compile=QUICK)
    assert fast.preparations == 1 and event_counts() == before
    assert_trees_close(again, ft.step(ex.sde, compiled, increments[0], DT, schedule))


def test_the_eager_prepared_step_checks_structure_once_and_equals_step():
    ex, start = problem()
    fast = ft.jit_step(ex.sde, compile=False)
    state, reference = start, start
    for dw in noise(6):
        state, info = fast.with_info(state, dw, DT, 0.3)
        reference, expected = ft.step_with_info(ex.sde, reference, dw, DT, 0.3)
    assert fast.preparations == 1
    assert_trees_close((state, info), (reference, expected), rtol=0, atol=0)


def test_a_new_shape_dtype_or_dt_is_prepared_again():
    ex, start = problem()
    fast = ft.jit_step(ex.sde, compile=False)
    dw = noise(1)[0]
    fast(start, dw, DT, 0.1)
    fast(start, dw, 2 * DT, 0.1)  # eager: dt is a value, checked every call
    assert fast.preparations == 1
    bigger = ft.init(ex.sde, ex.theta, ex.x0, particles=5)
    fast(bigger, noise(1, particles=5)[0], DT, 0.1)
    assert fast.preparations == 2
    quick = ft.jit_step(ex.sde, compile=QUICK)
    quick(start, dw, DT, 0.1)
    quick(start, dw, 2 * DT, 0.1)  # compiled: dt is baked into the kernel
    assert quick.preparations == 2


@pytest.mark.parametrize("compile", [False, QUICK])
def test_every_error_of_step_is_raised_on_a_repeated_call_too(compile):
    """After a key is prepared, bad values still raise the eager step's error, before the state is used."""
    ex, state = problem()
    fast = ft.jit_step(ex.sde, compile=compile)
    dw = noise(1)[0]
    fast(state, dw, DT, 0.1)

    def same_error(*args):
        with pytest.raises((ValueError, TypeError)) as expected:
            ft.step(ex.sde, *args)
        with pytest.raises(type(expected.value)) as raised:
            fast(*args)
        assert str(raised.value) == str(expected.value)
        return str(raised.value)

    assert "dt must be positive" in same_error(state, dw, -DT, 0.1)
    assert "dt must be positive" in same_error(state, dw, float("nan"), 0.1)
    assert "lr must be finite and >= 0" in same_error(state, dw, DT, -0.5)
    assert "must be finite" in same_error(state, dw, DT, lambda t: t * float("inf"))
    assert "not per-parameter" in same_error(state, dw, DT, lambda t: torch.ones(2, dtype=F64))
    assert "requires grad" in same_error(state, dw.clone().requires_grad_(), DT, 0.1)
    assert "dw must have shape" in same_error(state, noise(1, particles=2)[0], DT, 0.1)
    other = state._replace(x_tilde={"weight0": state.x_tilde["weight0"]})
    assert "structure" in same_error(other, dw, DT, 0.1)
    assert "expects a fwdtrain.State" in same_error(tuple(state), dw, DT, 0.1)
    assert fast(state, dw, DT, 0.1).t == pytest.approx(DT)  # and the prepared key still works


@pytest.mark.parametrize("compile", [False, QUICK])
def test_the_prepared_step_under_the_users_jacfwd_is_the_derivative(compile):
    """jacfwd through two prepared steps (run eagerly inside the transform) equals central differences."""
    ex, start = problem(particles=2)
    fast = ft.jit_step(ex.sde, compile=compile)
    increments = noise(2, particles=2)

    def final_x(weight):
        state = start._replace(theta={**start.theta, "weight1": weight})
        for dw in increments:
            state = fast(state, dw, DT, 0.2)
        return state.x

    weight = start.theta["weight1"]
    jacobian = jacfwd(final_x)(weight)
    eps = 1e-6
    for j in range(weight.numel()):
        e = torch.zeros_like(weight).reshape(-1)
        e[j] = eps
        e = e.reshape(weight.shape)
        central = (final_x(weight + e) - final_x(weight - e)) / (2 * eps)
        torch.testing.assert_close(jacobian.reshape(*central.shape, -1)[..., j], central, rtol=1e-6, atol=1e-9)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_the_compiled_step_under_the_users_vmap_is_one_batched_kernel_equal_to_a_loop_over_runs():
    ex, start = problem()
    runs = 4
    states = tree_map(lambda leaf: torch.stack([leaf] * runs), start)
    increments = noise(5, runs=runs)
    rates = torch.tensor([0.1, 0.2, 0.4, 0.8], dtype=F64)
    fast = ft.jit_step(ex.sde, compile=QUICK)
    batched = vmap(lambda s, w, lr: fast(s, w, DT, lr))
    out = batched(states, increments[0], rates)
    before = event_counts()
    for dw in increments[1:]:
        out = batched(out, dw, rates)
    assert event_counts() == before and len(fast.batched_kernels) == 1  # one batched kernel, built once
    for r in range(runs):
        state = start
        for dw in increments:
            state = ft.step(ex.sde, state, dw[r], DT, rates[r])
        assert_trees_close(tree_map(lambda leaf: leaf[r], out), state)
    with pytest.raises(ValueError, match="must be >= 0"):
        batched(out, increments[0], -rates)


@pytest.mark.slow
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_the_aot_route_calls_the_loaded_kernel_on_flat_leaves_and_equals_the_eager_step():
    ex, start = problem()
    fast = ft.jit_step(ex.sde)
    schedule = ft.schedules.inverse_time(1.0)
    increments = noise(30)
    compiled, eager = fast(start, increments[0], DT, schedule), ft.step(ex.sde, start, increments[0], DT, schedule)
    (entry,) = fast._kernels.values()
    assert entry.run is not None  # the fast path: the package's runner on the flat leaves
    before = event_counts()
    for dw in increments[1:]:
        compiled = fast(compiled, dw, DT, schedule)
        eager = ft.step(ex.sde, eager, dw, DT, schedule)
    assert event_counts() == before and fast.preparations == 1
    assert_trees_close(compiled, eager)
    assert all(leaf.grad_fn is None for leaf in leaves(compiled))


def test_a_vmap_inside_the_users_jacfwd_runs_the_eager_step_and_is_the_derivative():
    """vmap nested in jacfwd: the compiled step cannot be differentiated, so it runs eagerly, and equals the eager
    step's derivative."""
    ex, start = problem(particles=2)
    increments = noise(2, particles=2, runs=3)
    runs = tree_map(lambda leaf: torch.stack([leaf] * 3), start)

    def final_x(weight, compile):
        def one(state, dw):
            state = state._replace(theta={**state.theta, "weight1": weight})
            return ft.step(ex.sde, state, dw, DT, 0.2, compile=compile).x

        return vmap(one)(runs, increments[0])

    weight = start.theta["weight1"]
    torch.testing.assert_close(jacfwd(final_x)(weight, QUICK), jacfwd(final_x)(weight, False), rtol=0, atol=0)


_FRESH_VMAP = """
import json, warnings, torch, fwdtrain as ft
from torch.func import vmap
from fwdtrain.compile import kernels
from fwdtrain.core._tree import tree_map
warnings.simplefilter("error", RuntimeWarning)  # a fallback warns: here it fails the process
ex = ft.examples.lqr_1d(particles=3, hidden=4)
states = [ft.init(ex.sde, ex.theta, ex.x0, 3) for _ in range(4)]
stacked = tree_map(lambda *xs: torch.stack(xs), *states)
dw, lrs = torch.randn(4, 3, 1, generator=torch.Generator().manual_seed(0)) * 0.1, torch.tensor([0.1, 0.2, 0.3, 0.4])
batched = vmap(lambda s, w, a: ft.step(ex.sde, s, w, 0.01, a, compile=True))
for _ in range(3):
    out = batched(stacked, dw, lrs)
    loop = [ft.step(ex.sde, states[r], dw[r], 0.01, lrs[r]) for r in range(4)]
    for r in range(4):
        for key in out.theta:
            torch.testing.assert_close(out.theta[key][r], loop[r].theta[key], rtol=1e-5, atol=1e-6)
    stacked, states = out, loop
print(json.dumps(kernels.counts()))
"""


@pytest.mark.slow
def test_vmap_over_compiled_steps_compiles_once_in_a_fresh_process(tmp_path):
    """Issue 41: in a process that compiled nothing before, the user's ``vmap`` over ``step(compile=True)``
    compiles one batched kernel (no fallback, no warning) and equals a loop over the runs, step after step."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "FWDTRAIN_CACHE_DIR": str(tmp_path), "PYTHONPATH": root}
    done = subprocess.run([sys.executable, "-c", _FRESH_VMAP], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.splitlines()[-1])
    assert counts["compiles"] == 1 and counts["fallbacks"] == 0, counts
