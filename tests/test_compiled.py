"""Compiled steps (``fwdtrain.compile``) against the eager step: same states (float64, same noise), built once
per process, kept on disk for the next, never stale, and a clear fallback when compiling fails.

AOTInductor compiles for 10-30 s per graph on a small CPU: the tests here share one problem (a 1 -> 4 -> 1
network, 3 particles) and its two kernels (the loop of steps, and one step); everything else that compares
compiled with eager uses the quick torch.compile route with the "eager" backend, or is marked ``slow``.
"""

import logging
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch

import fwdtrain as ft
from fwdtrain.compile import cache, kernels
from fwdtrain.core._tree import leaves
from fwdtrain.core.sensitivity import Plan
from fwdtrain.problems.cost import CostForm

DT = 0.01
PARTICLES = 3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small_problem():
    ex = ft.examples.lqr_1d(dtype=torch.float64, hidden=4, particles=PARTICLES)
    state = ft.init(ex.sde, ex.theta, torch.tensor([[0.8], [-0.2], [1.5]], dtype=torch.float64))
    return ex, state


def assert_trees_close(actual, expected, rtol=1e-10, atol=1e-12):
    for a, e in zip(leaves(actual), leaves(expected), strict=True):
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a fallback fails the test
def test_compiled_run_equals_eager_and_a_second_call_never_compiles():
    """The trace-once route: run(compile=True) equals eager; the second run call, a continued run and a run with
    another learning rate reuse the process's kernel (counted: no trace, no compile, no load)."""
    ex, state = small_problem()
    options = dict(save=ft.SaveAt(10), checks=ft.Checks(10))
    eager, eager_history = ft.run(ex.sde, state, 26, DT, ex.lr, 3, compile=False, **options)
    compiled, compiled_history = ft.run(ex.sde, state, 26, DT, ex.lr, 3, compile=True, **options)
    assert_trees_close(compiled, eager)
    for name in ("step", "t", "cost", "grad_norm", "average_cost", "theta"):
        assert_trees_close(getattr(compiled_history, name), getattr(eager_history, name))
    before = kernels.counts()
    again, _ = ft.run(ex.sde, state, 26, DT, ex.lr, 3, compile=True, **options)
    continued, _ = ft.run(ex.sde, (compiled, compiled_history), 30, DT, ex.lr, compile=True, **options)
    _other_rate, _ = ft.run(ex.sde, state, 26, DT, 0.25, 3, compile=True, **options)
    assert kernels.counts() == before  # not one trace, compile or load more
    assert_trees_close(again, compiled, rtol=0, atol=0)
    whole, _ = ft.run(ex.sde, state, 56, DT, ex.lr, 3, compile=False, **options)
    assert_trees_close(continued, whole)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_new_process_loads_the_kernel_from_disk_without_compiling(tmp_path):
    """The package written by this process is found by the next one: it loads (and checks) it, compiles nothing."""
    ex, state = small_problem()
    ft.run(ex.sde, state, 12, DT, ex.lr, 3, compile=True, save=ft.SaveAt(10), checks=ft.Checks(10))
    script = (
        "import json, torch, fwdtrain as ft\n"
        "from fwdtrain.compile import kernels\n"
        "ex = ft.examples.lqr_1d(dtype=torch.float64, hidden=4, particles=3)\n"
        "state = ft.init(ex.sde, ex.theta, torch.tensor([[0.8], [-0.2], [1.5]], dtype=torch.float64))\n"
        "s, h = ft.run(ex.sde, state, 12, 0.01, ex.lr, 3, compile=True, save=ft.SaveAt(10), checks=ft.Checks(10))\n"
        "e, _ = ft.run(ex.sde, state, 12, 0.01, ex.lr, 3, compile=False, save=ft.SaveAt(10), checks=ft.Checks(10))\n"
        "print(json.dumps({**kernels.counts(), 'diff': float((s.x - e.x).abs().max())}))\n"
    )
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    counts = json.loads(done.stdout.splitlines()[-1])
    assert counts["compiles"] == 0 and counts["loads"] >= 1 and counts["fallbacks"] == 0, counts
    assert counts["diff"] < 1e-12


@pytest.mark.slow
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_step_with_compile_equals_the_eager_step():
    ex, state = small_problem()
    noise = torch.randn(3, PARTICLES, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) * 0.1
    compiled, eager = state, state
    schedule = ft.schedules.inverse_time(1.0)
    for dw in noise:
        compiled = ft.step(ex.sde, compiled, dw, DT, schedule, compile=True)
        eager = ft.step(ex.sde, eager, dw, DT, schedule)
    assert_trees_close(compiled, eager)
    assert all(leaf.grad_fn is None for leaf in leaves(compiled))


def test_the_key_covers_what_the_graph_depends_on():
    """Changing a closed-over tensor's value, a shape, a dtype or an option names another package: a kernel
    built for other numbers can never be loaded for these."""

    def graph_key(scale, particles=2, dtype=torch.float64, options=None):
        matrix = torch.tensor([[scale]], dtype=dtype)
        traced = ft.compile.graphs.trace(lambda x: x @ matrix, (torch.ones(particles, 1, dtype=dtype),))
        example = [torch.ones(particles, 1, dtype=dtype)]
        return cache.kernel_key(traced.graph.code, traced.constants(), example, options or {}, "function")

    first = graph_key(1.0)
    assert graph_key(1.0) == first
    assert (
        len(
            {
                first,
                graph_key(2.0),
                graph_key(1.0, particles=3),
                graph_key(1.0, dtype=torch.float32),
                graph_key(1.0, options={"cpp.threads": 2}),
            }
        )
        == 5
    )


def test_a_corrupt_package_is_set_aside_with_one_warning_and_rebuilt(tmp_path, monkeypatch):
    """A package that cannot be loaded: one warning line, a fresh build, the same numbers (the build is stubbed:
    what is tested is the handling, not inductor)."""
    compiled = "import os, sys; open(sys.argv[2], 'wb').write(b'compiled'); os.unlink(sys.argv[1])"

    def fake_load(path, device):
        if Path(path).read_bytes() != b"compiled":
            raise RuntimeError("not a package")
        return lambda flat: [flat[0] * 2]

    monkeypatch.setenv("FWDTRAIN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "WORKER", ("-c", compiled))  # the compile's process: writes a stand-in
    monkeypatch.setattr(ft._compat, "aot_load", fake_load)
    cache.forget_kernels()
    built = lambda: kernels.counts()["compiles"] - before
    before = kernels.counts()["compiles"]
    fn = lambda x: x * 2
    x = torch.arange(3.0, dtype=torch.float64)
    kernel = ft.compile.function_kernel(fn, (x,), key="doubling", options=ft.Compile(True))
    assert torch.equal(kernel(x), x * 2) and built() == 1
    (path,) = list((tmp_path / "kernels").glob("*.pt2"))
    path.write_bytes(b"garbage")
    cache.forget_kernels()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = ft.compile.function_kernel(fn, (x,), key="doubling", options=ft.Compile(True))
        assert torch.equal(again(x), x * 2)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "could not be loaded" in messages[0] and "\n" not in messages[0]
    assert built() == 2 and path.read_bytes() == b"compiled"
    cache.forget_kernels()


def _failing_backend(graph_module, example_inputs):
    logging.getLogger("torch._inductor.fake_internal").error("internal assert log line\n" * 20)
    raise RuntimeError("no compiler here\nsecond line of the error")


def test_when_every_route_fails_the_step_runs_eagerly_after_one_warning_line(capsys, caplog, monkeypatch, tmp_path):
    ex, state = small_problem()
    monkeypatch.setenv("FWDTRAIN_CACHE_DIR", str(tmp_path))  # no package on disk: the route must compile

    no_aot = "import sys; sys.stderr.write('RuntimeError: AOTInductor is not available here'); sys.exit(1)"
    monkeypatch.setattr(kernels, "WORKER", ("-c", no_aot))  # the compile's process fails
    cache.forget_kernels()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, _ = ft.run(ex.sde, state, 7, DT, 0.3, 3, compile=ft.Compile(True, backend=_failing_backend))
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 2, messages  # the trace-once route failed; then torch.compile failed
    assert "AOTInductor is not available here" in messages[0] and "using torch.compile instead" in messages[0]
    assert "running it eagerly" in messages[1] and "no compiler here" in messages[1]
    assert all("\n" not in m for m in messages)
    assert "internal assert" not in capsys.readouterr().err and "internal assert" not in caplog.text
    eager, _ = ft.run(ex.sde, state, 7, DT, 0.3, 3, compile=False)
    assert_trees_close(out, eager)
    assert logging.getLogger("torch").level != logging.CRITICAL + 1  # levels restored
    cache.forget_kernels()


@pytest.mark.slow
def test_the_dynamo_route_equals_eager_and_respects_the_recompile_limit():
    """compiler="dynamo" (backend "eager": quick): equal to eager; twelve problems in one process each get a kernel
    of their own (dynamo counts its recompile limit of 8 per code object)."""
    for i in range(12):
        control = eval(f"lambda th, x: -th['k'] * x * {1 + i / 100}")  # a new code object per problem
        sde = ft.ControlledSDE(
            control=control,
            drift=lambda x, u: -x + u,
            diffusion=lambda x, u: torch.ones_like(x),
            cost=lambda x, u: (x * x + u * u).sum(),
        )
        state = ft.init(sde, {"k": torch.tensor(0.2, dtype=torch.float64)}, torch.ones(1, dtype=torch.float64), 3)
        eager, _ = ft.run(sde, state, 4, DT, 0.1, compile=False)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            traced, _ = ft.run(sde, state, 4, DT, 0.1, compile=ft.Compile(True, compiler="dynamo", backend="eager"))
        assert torch.equal(eager.theta["k"], traced.theta["k"])


def test_cache_folder_is_the_user_cache_dir_never_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("FWDTRAIN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert ft.compile.cache_dir() == tmp_path / "xdg" / "fwdtrain"
    monkeypatch.setenv("FWDTRAIN_CACHE_DIR", str(tmp_path / "mine"))
    assert ft.compile.cache_dir() == tmp_path / "mine"
    assert cache.package_path("abc").parent == tmp_path / "mine" / "kernels"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    ft._compat.use_cache_folders(tmp_path / "mine")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine" / "inductor")
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # set by inductor itself on first look
    ft._compat.use_cache_folders(tmp_path / "mine")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine" / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "theirs"))  # the user's own choice wins
    ft._compat.use_cache_folders(tmp_path / "mine")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "theirs")


@pytest.mark.slow
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_float32_run_with_a_clock_dependent_rate_equals_eager():
    """The compiled loop's rates alpha(t_k) come from clocks rounded as the float32 step rounds them, and in the
    dtype the kernel was built for (SGDCT's data-driven steps, float32, inverse-time rate)."""
    ex = ft.examples.sgdct_ou(particles=4, steps=200)
    start = ex.initial_state()
    options = dict(save=ft.SaveAt(50), checks=ft.Checks(50))
    eager, _ = ft.run(ex.trainable, start, 200, ex.dt, ex.lr, ex.noise(0), compile=False, **options)
    compiled, _ = ft.run(ex.trainable, start, 200, ex.dt, ex.lr, ex.noise(0), compile=True, **options)
    assert torch.equal(compiled.t, eager.t)
    assert_trees_close(compiled.theta, eager.theta, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_kernel_refuses_inputs_of_another_dtype_instead_of_reading_garbage():
    _, state = small_problem()
    kernel = kernels.function_kernel(
        lambda s: s.x * 2, (state,), key=("double-x", "test"), options=ft.Compile(True), what="x times 2"
    )
    assert torch.equal(kernel(state), state.x * 2)
    as_float32 = ft.core._tree.tree_map(lambda leaf: leaf.float(), state)
    with pytest.raises(TypeError, match="was built for inputs"):
        kernel(as_float32)


def test_the_frozen_theta_kernel_takes_theta_as_input_so_each_theta_gets_its_own_cost():
    """One compiled evaluation kernel serves every theta (carried, not baked in): J(k) = 1 / (2 k) for
    dX = -k X dt + dW, cost X^2, each within its Monte Carlo error and equal to the eager estimate."""
    sde = ft.SDE(
        lambda th, x: -th["k"] * x, lambda th, x: torch.ones_like(x), lambda th, x: (x * x).sum(), noise_type="additive"
    )
    x0 = torch.zeros(1, dtype=torch.float64)
    compiles = None
    for k in (1.0, 4.0):
        theta = {"k": torch.tensor(k, dtype=torch.float64)}
        options = dict(particles=64, dt=0.01, steps=3000, burn_in=500, seed=1)
        compiled = ft.stationary_cost(
            sde, theta, x0, compile=ft.Compile(True, compiler="dynamo", backend="eager"), **options
        )
        eager = ft.stationary_cost(sde, theta, x0, compile=False, **options)
        assert compiled.mean == pytest.approx(eager.mean, rel=1e-12)
        assert abs(compiled.mean - 1 / (2 * k)) < 5 * compiled.stderr + 0.01 / k  # Euler's O(h) bias included
        compiles = kernels.counts()["compiles"] if compiles is None else compiles
    assert kernels.counts()["compiles"] == compiles  # the second theta compiled nothing


@pytest.mark.slow
def test_inputs_laid_out_otherwise_are_copied_to_the_kernels_layout():
    kernel = kernels.function_kernel(
        lambda a: a @ a.T,
        (torch.eye(3, dtype=torch.float64) * 2,),
        key=("gram", "test"),
        options=ft.Compile(True),
        what="a gram matrix",
    )
    transposed = torch.arange(9, dtype=torch.float64).reshape(3, 3).T  # another stride, same shape
    assert torch.equal(kernel(transposed), transposed @ transposed.T)


def test_a_cost_with_its_own_theta_term_compiles_in_float32():
    """Forward mode gives the derivative of 0.1 k^2 (k 0-d, float32) in float64 in torch <= 2.13; the totals are
    cast back, so the compiled loop's carry keeps its dtypes and nothing falls back (or reads garbage)."""
    sde = ft.SDE(
        lambda th, x: -th["k"] * (x - th["m"]),
        lambda th, x: 0.5 * torch.ones_like(x),
        lambda th, x: ((x - 1) ** 2).sum() + 0.1 * th["k"] ** 2,
    )
    state = ft.init(sde, {"k": torch.tensor(1.0), "m": torch.tensor(0.0)}, torch.zeros(1), particles=16)
    _, info = ft.step_with_info(sde, state, torch.zeros(16, 1), 0.01, 0.1, mode="forward")
    assert all(g.dtype == torch.float32 for g in info.gradient.values())
    schedule = ft.schedules.inverse_time(2.0, 10.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        compiled = ft.run(
            sde, state, 30, 0.01, schedule, 1, compile=ft.Compile(True, compiler="dynamo", backend="eager")
        )
    eager = ft.run(sde, state, 30, 0.01, schedule, 1, compile=False)
    assert_trees_close(compiled.state.theta, eager.state.theta, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_an_unrolled_loop_equals_eager_for_counts_that_are_not_multiples_of_its_unroll():
    ex, state = small_problem()
    options = dict(save=ft.SaveAt(10), checks=ft.Checks(10))
    eager, _ = ft.run(ex.sde, state, 27, DT, ex.lr, 3, compile=False, **options)
    unrolled, _ = ft.run(ex.sde, state, 27, DT, ex.lr, 3, compile=ft.Compile(True, unroll=3), **options)
    assert_trees_close(unrolled, eager)  # segments of 1, 9, 10 and 7 steps: whole and partial iterations


def test_unroll_is_checked():
    with pytest.raises(ValueError, match=r"Compile\(unroll=...\)"):
        ft.compile.options.as_compile(ft.Compile(True, unroll=0))


@pytest.mark.parametrize("particles", [1, 3])
def test_simplify_folds_the_shape_chains_of_a_traced_step_and_keeps_its_values_bit_for_bit(particles):
    """``graphs.simplify`` on the traced cost-form step (what vmap and vjp leave: reshape chains, expands and
    permutes of one particle): far fewer ATen calls, the same outputs exactly, run eagerly on random inputs."""
    ex = ft.examples.lqr_1d(dtype=torch.float64, hidden=4, particles=particles)
    state = ft.init(ex.sde, ex.theta, torch.linspace(-1, 1, particles, dtype=torch.float64)[:, None])
    plan = Plan("reverse", "structured")
    step = lambda carry, inputs: CostForm(ex.sde).advance(carry, inputs[0], DT, inputs[1], plan)[0]
    example = (state, (torch.zeros(particles, 1, dtype=torch.float64), torch.tensor(0.3, dtype=torch.float64)))
    traced = ft.compile.graphs.trace(step, example)
    generator = torch.Generator().manual_seed(2)
    inputs = [torch.randn(leaf.shape, generator=generator, dtype=leaf.dtype) for leaf in leaves(example)]
    expected = traced.graph(*inputs)
    before, after = ft.compile.graphs.simplify(traced.graph)
    assert before == sum(1 for node in traced.graph.graph.nodes if node.op == "call_function") + (before - after)
    assert after < 0.75 * before
    for got, want in zip(traced.graph(*inputs), expected, strict=True):
        assert torch.equal(got, want)


def test_simplify_leaves_what_an_in_place_op_touches_and_drops_only_repeats():
    def fn(x):
        same = x.reshape(x.shape)  # a repeat: dropped
        folded = x.reshape(6).reshape(3, 2).reshape(2, 3)  # a chain: one view of x
        touched = x.reshape(2, 3)
        touched.unsqueeze_(0)  # written to in place: kept, and so is what it reads
        twice = x.unsqueeze(1).squeeze(1)  # x again
        return same + folded + twice, touched

    x = torch.arange(6.0).reshape(2, 3)
    traced = ft.compile.graphs.trace(fn, (x,))
    expected = traced.graph(x.clone())
    before, after = ft.compile.graphs.simplify(traced.graph)
    targets = [str(node.target) for node in traced.graph.graph.nodes if node.op == "call_function"]
    assert targets.count("aten.view.default") == 1  # the one written to in place; the others are x itself
    assert after < before and "aten.unsqueeze_.default" in targets and "aten.squeeze.dim" not in targets
    for got, want in zip(traced.graph(x.clone()), expected, strict=True):
        assert torch.equal(got, want) and got.shape == want.shape


def test_simplify_turns_traced_views_into_reshapes_that_take_other_strides():
    """make_fx records x.reshape(6) of a contiguous x as a view, valid only for contiguous inputs; the export
    that compiles a graph may give a tensor other strides. After simplify the graph takes them."""
    traced = ft.compile.graphs.trace(lambda x: (x.reshape(6) * 2,), (torch.ones(2, 3),))
    transposed = torch.arange(6.0).reshape(3, 2).t()  # shape (2, 3), not viewable as (6,)
    with pytest.raises(RuntimeError, match="view"):
        traced.graph(transposed)
    ft.compile.graphs.simplify(traced.graph)
    targets = [str(node.target) for node in traced.graph.graph.nodes if node.op == "call_function"]
    assert "aten.view.default" not in targets
    (got,) = traced.graph(transposed)
    assert torch.equal(got, transposed.reshape(6) * 2)


def test_unfold_writes_out_small_and_thin_products_and_leaves_wide_ones_to_the_library():
    """``graphs.unfold_small_matmuls``: a one-particle product and the thin ones of many particles (an outer
    product, K = 1; a row times a matrix, M = 1) become a broadcast multiply and a sum; a wide product of
    many particles (every dimension > 1, too big to be small) stays a library call. Values equal to rounding."""
    generator = torch.Generator().manual_seed(0)
    a = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)
    args = (a(16, 1), a(1, 4096), a(1, 16), a(16, 4096), a(64, 64), a(64, 4096), a(3, 4), a(4, 5), a(2, 3, 4))

    def fn(w0, x, w1, h, w, hs, s0, s1, b):
        return (
            w0 @ x,  # outer product over 4,096 particles: thin
            w1 @ h,  # a row times a matrix: thin
            w @ hs,  # every dimension 64 or more, 16.8M multiplies: the library's
            s0 @ s1,  # small
            torch.bmm(b, b.transpose(1, 2)),  # small, batched
            torch.addmm(h[:, :5], w0, x[:, :5]),  # small, with a term added
        )

    traced = ft.compile.graphs.trace(fn, args)
    expected = traced.graph(*args)
    assert ft.compile.graphs.unfold_small_matmuls(traced.graph) == 5
    targets = [str(node.target) for node in traced.graph.graph.nodes if node.op == "call_function"]
    assert targets.count("aten.mm.default") == 1 and "aten.bmm.default" not in targets
    assert "aten.addmm.default" not in targets
    for got, want in zip(traced.graph(*args), expected, strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_the_loop_carries_one_buffer_per_dtype_and_unpacks_every_leaf_as_it_was():
    leaves_ = (
        torch.randn(3, 2, dtype=torch.float64),
        torch.tensor(4, dtype=torch.int64),
        torch.randn((), dtype=torch.float64),
        torch.randn(2, 1, 5, dtype=torch.float32),
        torch.zeros(0, dtype=torch.float64),
    )
    packing = ft.compile.graphs.Packing.of(leaves_)
    buffers = packing.pack(leaves_)
    assert [b.dtype for b in buffers] == [torch.float64, torch.int64, torch.float32]
    assert [b.numel() for b in buffers] == [7, 1, 10]
    for got, want in zip(packing.unpack(buffers), leaves_, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


def test_a_background_compile_that_ends_is_reaped_without_a_poll(tmp_path, monkeypatch):
    """A process that never polls again (a notebook cell that ended) keeps no zombie: the compile's process is
    waited for as it ends, and a later poll still reads its exit status and last line."""
    monkeypatch.setenv("FWDTRAIN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "WORKER", ("-c", "import sys; sys.stderr.write('stub worker failed'); sys.exit(3)"))
    monkeypatch.setenv("FWDTRAIN_QUIET", "1")
    x = torch.arange(3.0)
    package = kernels._Package(torch.nn.Identity(), [x], "reaped", {})
    package.start("in the background")
    assert package.child is not None
    pid = package.child.pid
    (reaper,) = [t for t in threading.enumerate() if t.name == "fwdtrain-compile-reaper"]
    reaper.join(timeout=60)
    assert not reaper.is_alive()
    with pytest.raises(ChildProcessError):  # already waited for: no zombie left to reap
        os.waitpid(pid, os.WNOHANG)
    assert package.poll() == "stub worker failed"
