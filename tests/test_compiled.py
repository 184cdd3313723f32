"""Compiled and fused steps against eager ``advance``: same states (float64, same noise), no recompiles.

torch.compile (inductor) takes tens of seconds per graph on a small CPU, so there are
two inductor graphs here, both of a 1 -> 4 -> 1 network: one step, and two fused steps.
"""

import logging
import math
import warnings

import pytest
import torch
import torch._dynamo

import fwdtrain as ft
from fwdtrain._tree import leaves
from fwdtrain import compiled as compiled_module
from fwdtrain.compiled import choose_compilation, compile_advance, compile_steps
from fwdtrain.euler import advance

DT = 0.01
PARTICLES = 3


@pytest.fixture
def problem():
    ex = ft.examples.lqr_1d(dtype=torch.float64, hidden=4)
    state = ft.init(ex.sde, ex.theta, torch.tensor([[0.8], [-0.2], [1.5]], dtype=torch.float64))
    noise = torch.randn(6, PARTICLES, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    return ex.sde, state, noise * math.sqrt(DT)


def assert_trees_close(actual, expected):
    for a, e in zip(leaves(actual), leaves(expected), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a fallback to eager fails the test
def test_compiled_step_equals_eager_and_never_recompiles(problem):
    sde, state, noise = problem
    one_step = compile_advance(sde, DT, "reverse")
    schedule = ft.schedules.inverse_time(2.0)
    compiled, eager = state, state
    compiled, _ = one_step(compiled, noise[0], schedule(compiled.t))  # warm-up: the one compilation
    eager, _ = advance(sde, eager, noise[0], DT, schedule(eager.t), "reverse")
    torch._dynamo.utils.counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for dw in noise[1:]:  # t and alpha change every step: new data, not new graphs
            compiled, compiled_info = one_step(compiled, dw, schedule(compiled.t))
            eager, eager_info = advance(sde, eager, dw, DT, schedule(eager.t), "reverse")
        compiled, _ = one_step(compiled, noise[0], 0.25)  # a plain number for alpha as well
        eager, _ = advance(sde, eager, noise[0], DT, torch.tensor(0.25, dtype=torch.float64), "reverse")
    assert sum(torch._dynamo.utils.counters["recompiles"].values()) == 0
    assert_trees_close(compiled, eager)
    assert_trees_close(compiled_info, eager_info)
    assert float(compiled.t) == pytest.approx(7 * DT)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_fused_steps_equal_eager_steps(problem):
    sde, state, noise = problem
    lr = ft.schedules.piecewise_constant([0.5, 0.1], [0.015])  # the switch falls inside the chunk
    fused = compile_steps(sde, DT, lr, "reverse", 2)
    compiled, info = fused(state, noise[:2])
    compiled, info = fused(compiled, noise[2:4])
    eager, costs, gradients = state, [], []
    for dw in noise[:4]:
        eager, step_info = advance(sde, eager, dw, DT, lr(eager.t), "reverse")
        costs.append(step_info.cost)
        gradients.append(step_info.gradient)
    assert_trees_close(compiled, eager)
    torch.testing.assert_close(info.cost, torch.stack(costs[2:]), rtol=1e-10, atol=1e-12)
    for name, g in info.gradient.items():
        torch.testing.assert_close(g, torch.stack([step[name] for step in gradients[2:]]), rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="noise must have shape"):
        fused(compiled, noise[:3])


def _failing_backend(graph_module, example_inputs):
    raise RuntimeError("no compiler here")


def _noisy_failing_backend(graph_module, example_inputs):
    logging.getLogger("torch._inductor.fake_internal").error("internal assert log line\n" * 20)
    raise RuntimeError("no compiler here\nsecond line of the error")


def test_compile_failure_falls_back_to_eager_with_one_warning_line(problem, capsys, caplog):
    sde, state, noise = problem
    one_step = compile_advance(sde, DT, "reverse", backend=_noisy_failing_backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallback, _ = one_step(state, noise[0], 0.3)
        fallback, _ = one_step(fallback, noise[1], 0.3)  # eager from now on: no second warning
    assert len(caught) == 1 and caught[0].category is RuntimeWarning
    message = str(caught[0].message)
    assert "running it eagerly" in message and "no compiler here" in message and "\n" not in message
    assert caught[0].filename == __file__  # points at the caller, not at fwdtrain's internals
    assert "internal assert" not in capsys.readouterr().err and "internal assert" not in caplog.text
    expected = state
    for dw in noise[:2]:
        expected, _ = advance(sde, expected, dw, DT, torch.tensor(0.3, dtype=torch.float64), "reverse")
    assert_trees_close(fallback, expected)
    assert logging.getLogger("torch").level != logging.CRITICAL + 1  # levels restored


def test_cache_folder_is_the_user_cache_dir_never_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("FWDTRAIN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compiled_module.cache_dir() == tmp_path / "xdg" / "fwdtrain"
    monkeypatch.setenv("FWDTRAIN_CACHE_DIR", str(tmp_path / "mine"))
    assert compiled_module.cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert compiled_module.use_persistent_cache() == tmp_path / "mine" / "inductor"
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # set by inductor itself on first look
    assert compiled_module.use_persistent_cache() == tmp_path / "mine" / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "theirs"))  # the user's own choice wins
    assert compiled_module.use_persistent_cache() == tmp_path / "theirs"
    assert not compiled_module.warm_cache_exists()


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_second_build_loads_the_kernel_from_the_on_disk_cache(problem, monkeypatch, tmp_path):
    """A fresh folder: the first build compiles and writes there, a rebuild (dynamo reset, as in
    a new launch) hits the FX graph / AOTAutograd cache instead of compiling again."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("FWDTRAIN_CACHE_DIR", str(tmp_path))
    sde, state, noise = problem
    state = ft.init(sde, state.theta, state.x[:2])  # 2 particles: a graph no other test compiled
    counters = torch._dynamo.utils.counters
    results = []
    for _ in range(2):
        torch._dynamo.reset()
        counters.clear()
        one_step = compile_advance(sde, DT, "reverse")
        results.append(one_step(state, noise[0, :2], 0.2)[0])
        hits = counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]
    assert hits >= 1 and compiled_module.warm_cache_exists()
    assert (tmp_path / "inductor" / "fxgraph").is_dir()
    assert_trees_close(results[1], results[0])


def test_choose_compilation_picks_the_soonest_finish():
    short = choose_compilation(100, 1, warm_cache=False)
    assert (short.compile, short.fuse) == (False, 1)  # tests and short runs stay eager
    seed_cold = choose_compilation(6000, 256, warm_cache=False)  # a 20 s compile saves ~19 s: not yet
    assert not seed_cold.compile and seed_cold.estimates["compiled"] > seed_cold.estimates["eager"]
    assert choose_compilation(6000, 256, warm_cache=True).compile  # a warm cache lowers break-even
    assert choose_compilation(20_000, 256, warm_cache=False).compile
    assert choose_compilation(3000, 10_000, warm_cache=False).compile  # big N: eager is slow per step
    assert not choose_compilation(3000, 1, warm_cache=False).compile
    long = choose_compilation(1_000_000, 100, warm_cache=True)
    assert long.compile and long.fuse > 1
    assert choose_compilation(0, 1, warm_cache=True) == (False, 1, {"eager": 0.0, "compiled": 4.5})
    with pytest.raises(ValueError, match="particles must be an integer >= 1"):
        choose_compilation(10, 0, warm_cache=False)


def test_mode_must_be_resolved():
    ex = ft.examples.lqr_1d(dtype=torch.float64, hidden=4)
    with pytest.raises(ValueError, match="mode must be 'reverse' or 'forward'"):
        compile_advance(ex.sde, DT, "auto")


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_run_with_compile_and_fuse_equals_eager_run():
    """run(fuse=4): fused calls between events, single compiled steps to reach them (record_every=10)."""
    ex = ft.examples.lqr_1d(dtype=torch.float64, hidden=4, particles=PARTICLES)
    state = ft.init(ex.sde, ex.theta, ex.x0, particles=PARTICLES)
    options = dict(record_every=10, check_every=10, seed=3, mode="reverse")
    eager, eager_history = ft.run(ex.sde, state, 26, DT, ex.lr, **options)
    fused, fused_history = ft.run(ex.sde, state, 26, DT, ex.lr, fuse=4, **options)
    assert_trees_close(fused, eager)
    for name in ("step", "t", "cost", "grad_norm", "average_cost", "theta"):
        assert_trees_close(getattr(fused_history, name), getattr(eager_history, name))


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_step_with_compile_equals_eager_step(problem):
    sde, state, noise = problem
    compiled, eager = state, state
    for dw in noise[:3]:
        compiled = ft.step(sde, compiled, dw, DT, ft.schedules.inverse_time(1.0), mode="reverse", compile=True)
        eager = ft.step(sde, eager, dw, DT, ft.schedules.inverse_time(1.0), mode="reverse")
    assert_trees_close(compiled, eager)
    assert all(leaf.grad_fn is None for leaf in leaves(compiled))


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_many_problems_in_one_process_each_get_their_own_compiled_kernel():
    """Dynamo counts recompiles per code object (limit 8): twelve different problems compiled in one
    process must not fall back to eager (each kernel has its own code object)."""
    for i in range(12):
        control = eval(f"lambda th, x: -th['k'] * x * {1 + i / 100}")  # a new code object per problem
        sde = ft.ControlledSDE(control=control, drift=lambda x, u: -x + u,
                               diffusion=lambda x, u: torch.ones_like(x), cost=lambda x, u: (x * x + u * u).sum())
        state = ft.init(sde, {"k": torch.tensor(0.2, dtype=torch.float64)}, torch.ones(1, dtype=torch.float64), 3)
        eager, _ = ft.run(sde, state, 4, DT, 0.1, compile=False, progress=False)
        traced, _ = ft.run(sde, state, 4, DT, 0.1, compile="eager", progress=False)
        assert torch.equal(eager.theta["k"], traced.theta["k"])
