"""fwdtrain.distributed: R ranks x N particles against one process with the ranks' noise concatenated,
reproducibility, rank-0-only output, failures that end the whole group (gloo on localhost), and the
command line under torchrun with a group checkpoint and resume.

The multi-process tests launch 2 or 3 local processes with ``fwdtrain.distributed.launch`` (forked from
a server that imports torch once; every launch bounded by a timeout, overrunning processes killed); the
test_cli_* tests start the real ``torchrun -m fwdtrain``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import boom

import fwdtrain as ft
from fwdtrain import cli, plotting
from fwdtrain import distributed as D
from fwdtrain.problems.cost import CostForm

DT, LR, SEED, STEPS = 0.01, 0.5, 7, 40
LAUNCH_TIMEOUT = 60.0


def _lqr(**kwargs):
    return ft.examples.lqr_1d(dtype=torch.float64, hidden=4, **kwargs)


def _reference(particles: list[int], steps: int, every: int = 1):
    """One process, sum(particles) particles, noise = the ranks' streams concatenated along the particle axis.

    every > 1: theta held for windows of ``every`` steps, then moved by lr dt times the window's summed
    gradient (written out here with lr = 0 steps, independently of GradientMean).
    """
    ex = _lqr()
    state = ft.init(ex.sde, ex.theta, ex.x0, particles=sum(particles))
    noise = torch.cat(
        [
            ft.noise.BrownianNoise((n, 1), DT, seed=D.rank_seed(SEED, r), dtype=torch.float64).draw(steps)
            for r, n in enumerate(particles)
        ],
        dim=1,
    )
    costs, window = [], None
    for n, dw in enumerate(noise, start=1):
        if every == 1:
            new, info = ft.step_with_info(ex.sde, state, dw, DT, LR)
        else:
            new, info = ft.step_with_info(ex.sde, state, dw, DT, 0.0)
            window = info.gradient if window is None else {k: window[k] + info.gradient[k] for k in window}
            if n % every == 0:
                new = new._replace(theta={k: new.theta[k] - LR * DT * window[k] for k in window})
                window = None
        costs.append(info.cost)
        state = new
    return state, torch.stack(costs)


# ----------------------------------------------------------------------------------------------
# workers: run on every rank inside launch(); module-level so that they can be pickled


def _train_worker(particles: list[int], every: int, repeats: int):
    ex = _lqr()
    state = ft.init(ex.sde, ex.theta, ex.x0, particles=particles[D.rank()])
    runs = []
    for _ in range(repeats):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            final, history = D.distributed_run(
                ex.sde,
                state,
                STEPS,
                DT,
                LR,
                seed=SEED,
                save=ft.SaveAt(10),
                every=every,
                checks=ft.Checks(10),
                verbose=True,
            )
        runs.append((final, history, out.getvalue()))
    return runs, _composed_loop(ex, state, every)


def _composed_loop(ex, state, every):
    """The pieces: fwdtrain.run with noise=rank_seed(seed) and a GroupHook; and one's own loop over the kernel's
    advance with reduce=gradient_mean(...) and the same noise."""
    hook = D.GroupHook(state.particles, every=every)
    final, _ = ft.run(
        ex.sde, state, STEPS, DT, LR, D.rank_seed(SEED), save=ft.SaveAt(10), checks=ft.Checks(10), hooks=(hook,)
    )
    reduce = D.gradient_mean(every, weight=state.particles)
    noise = ft.noise.BrownianNoise((state.particles, 1), DT, seed=D.rank_seed(SEED), dtype=torch.float64).draw(STEPS)
    plan = ft.problems.CostForm(ex.sde).plan(state)
    for dw in noise:
        state, _ = CostForm(ex.sde).advance(state, dw, DT, LR, plan, reduce=reduce)
    return final, state


class _Fault:
    """Wraps the controlled drift b(x, u) of one rank: after ``after`` calls it raises, returns NaN,
    kills its process or sleeps."""

    def __init__(self, after: int, action: str, woke: str | None = None) -> None:
        self.after, self.action, self.calls, self.woke = after, action, 0, woke

    def __call__(self, x, u):
        self.calls += 1
        if self.calls > self.after:
            if self.action == "raise":
                raise ValueError("a fault injected on purpose")
            if self.action == "nan":
                return x * float("nan")
            if self.action == "exit":
                os._exit(3)
            if self.action == "sleep":
                time.sleep(6)
                if self.woke is not None:
                    Path(self.woke).touch()
            if self.action == "interrupt":
                raise KeyboardInterrupt
        return -x + u


# The fault's call counts include init's three evaluations of the drift (the value check, the finite check and
# the batched check of fwdtrain.core.state.check_transformable), so that it strikes during training.
def _faulty_problem(action: str | None, after: int = 8, woke: str | None = None):
    ex = _lqr()
    sde = ex.sde
    if action is not None and D.rank() == 1:
        fault = _Fault(after, action, woke)
        sde = ft.ControlledSDE(sde.control, fault, sde.controlled_diffusion, sde.controlled_cost)
    return ex, sde


def _outcome(fn, woke: str | None = None):
    try:
        fn()
        return {"type": None}
    except Exception as error:
        return {
            "type": type(error).__name__,
            "message": str(error),
            "reason": getattr(error, "reason", None),
            "ranks": getattr(error, "ranks", None),
            "step": getattr(error, "step", None),
            "has_state": isinstance(getattr(error, "state", None), ft.State),
            "peer_awake": woke is not None and os.path.exists(woke),
        }


def _failures_worker():
    """Five faults in turn in one group (theta mismatch, bad input, an exception, NaN on rank 1, an exception in
    "auto"'s counted first step): the group stays usable after each, so no collective was left unmatched."""
    outcomes = {}
    ex, sde = _faulty_problem(None)
    theta = dict(ex.theta)
    if D.rank() == 1:
        theta["weight1"] = theta["weight1"] + 1e-9
    state = ft.init(sde, theta, ex.x0, particles=2)
    outcomes["theta"] = _outcome(lambda: D.distributed_run(sde, state, 20, DT, LR, seed=SEED, checks=ft.Checks(5)))
    dt = -1.0 if D.rank() == 1 else DT  # bad input on one rank only
    outcomes["input"] = _outcome(lambda: D.distributed_run(sde, state._replace(theta=ex.theta), 20, dt, LR))
    for action in ("raise", "nan"):
        ex, sde = _faulty_problem(action)
        state = ft.init(sde, ex.theta, ex.x0, particles=2)
        outcomes[action] = _outcome(lambda: D.distributed_run(sde, state, 30, DT, LR, seed=SEED, checks=ft.Checks(5)))
    ex, sde = _faulty_problem("raise", after=4)  # in compile="auto"'s counted first step, before the route is agreed
    state = ft.init(sde, ex.theta, ex.x0, particles=2)
    outcomes["counted"] = _outcome(lambda: D.distributed_run(sde, state, 30, DT, LR, seed=SEED, checks=ft.Checks(5)))
    # the small collectives
    outcomes["broadcast"] = D.broadcast({"a": torch.full((2,), float(D.rank()))})["a"].tolist()
    outcomes["mean"] = D.group_mean(torch.tensor([float(D.rank())]), weight=D.rank() + 1).item()
    outcomes["gather"] = D.gather_to_main({"rank": D.rank()})
    # afterwards the group still works
    ex, sde = _faulty_problem(None)
    final, _ = D.distributed_run(sde, ft.init(sde, ex.theta, ex.x0, particles=2), 5, DT, LR, seed=SEED)
    outcomes["after"] = float(final.t)
    return outcomes


def _abandon_worker(action: str, woke: str):
    ex, sde = _faulty_problem(action, after=6, woke=woke)
    state = ft.init(sde, ex.theta, ex.x0, particles=2)
    run = lambda: D.distributed_run(sde, state, 1000, DT, LR, seed=SEED, checks=ft.Checks(100))
    return _outcome(run, woke)


# ----------------------------------------------------------------------------------------------
# single-process tests


def test_rank_seeds_are_reproducible_and_distinct():
    seeds = [D.rank_seed(SEED, r) for r in range(4)]
    assert seeds == [D.rank_seed(SEED, r) for r in range(4)]
    assert len(set(seeds)) == 4 and D.rank_seed(SEED + 1, 0) != seeds[0]
    assert all(0 <= s < 2**63 for s in seeds)
    a = torch.randn(5, generator=D.rank_generator(SEED, "cpu", 1))
    assert torch.equal(a, torch.randn(5, generator=D.rank_generator(SEED, "cpu", 1)))
    with pytest.raises(ValueError, match="seed"):
        D.rank_seed(-1, 0)
    with pytest.raises(ValueError, match="rank"):
        D.rank_seed(0, -2)


def test_backend_follows_the_device():
    assert D.backend_for("cpu") == "gloo"
    assert "nccl" in D.backend_for("cuda:0") and "gloo" in D.backend_for(torch.device("cuda"))


def test_without_a_group_everything_is_one_process(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert (D.rank(), D.world_size(), D.is_main()) == (0, 1, True)
    assert D.init_process_group() is False
    g = {"a": torch.ones(2)}
    assert D.gradient_mean()(g) is g


def test_partial_environment_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        D.init_process_group()
    with pytest.raises(ValueError, match="timeout"):
        D.init_process_group(timeout=0)


def test_a_torchrun_environment_without_a_group_is_refused(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ex = _lqr()
    with pytest.raises(ValueError, match="init_process_group"):
        D.distributed_run(ex.sde, ft.init(ex.sde, ex.theta, ex.x0), 5, DT, LR)


def test_bad_arguments():
    with pytest.raises(ValueError, match="every"):
        D.gradient_mean(0)
    with pytest.raises(ValueError, match="weight"):
        D.gradient_mean(weight=-1.0)
    ex = _lqr()
    state = ft.init(ex.sde, ex.theta, ex.x0, particles=2)
    with pytest.raises(ValueError, match=r"Checks\(every=...\)"):
        D.distributed_run(ex.sde, state, 10, DT, LR, checks=ft.Checks(0))


@pytest.mark.parametrize("every", [1, 3])
def test_single_process_matches_the_reference(every):
    ex = _lqr()
    state = ft.init(ex.sde, ex.theta, ex.x0, particles=3)
    final, history = D.distributed_run(ex.sde, state, STEPS, DT, LR, seed=SEED, save=ft.SaveAt(10), every=every)
    reference, costs = _reference([3], STEPS, every)
    for got, want in zip(ft.core._tree.leaves(final), ft.core._tree.leaves(reference)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(history.cost, costs.reshape(-1, 10).mean(1), rtol=1e-12, atol=1e-14)
    assert history.step.tolist() == [10, 20, 30, 40]


def test_single_process_divergence_is_a_group_error():
    ex, _ = _faulty_problem(None)
    sde = ft.ControlledSDE(ex.sde.control, _Fault(3, "nan"), ex.sde.controlled_diffusion, ex.sde.controlled_cost)
    state = ft.init(sde, ex.theta, ex.x0, particles=2)
    with pytest.raises(D.GroupError, match="rank 0 diverged: x, x_tilde or theta became non-finite") as caught:
        D.distributed_run(sde, state, 20, DT, LR, checks=ft.Checks(5))
    assert caught.value.step == 5 and caught.value.reason == "non-finite"  # the group's check after the failed step
    assert isinstance(caught.value.__cause__, ft.DivergenceError)
    assert float(caught.value.state.t) == 0.0  # the last state that passed a check: the start
    assert caught.value.history.steps == 0 and caught.value.history.noise is not None


def test_interrupt_returns_the_last_checked_state_and_saves_it(tmp_path):
    ex = _lqr()
    sde = ft.ControlledSDE(ex.sde.control, _Fault(12, "interrupt"), ex.sde.controlled_diffusion, ex.sde.controlled_cost)
    state = ft.init(sde, ex.theta, ex.x0, particles=2)
    path = tmp_path / "ck.pt"
    final, history = D.distributed_run(
        sde, state, 30, DT, LR, seed=SEED, checks=ft.Checks(5), save=ft.SaveAt(5), hooks=(ft.Checkpointing(path),)
    )
    assert bool(history.interrupted) and history.steps == round(float(final.t) / DT) and history.steps % 5 == 0
    saved = D.load_group(path)
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            ft.core._tree.leaves((saved.state, saved.history.step)), ft.core._tree.leaves((final, history.step))
        )
    )
    # continuing the saved run equals the run never interrupted
    plain = ft.init(ex.sde, ex.theta, ex.x0, particles=2)
    whole, _ = D.distributed_run(ex.sde, plain, 30, DT, LR, seed=SEED, checks=ft.Checks(5), save=ft.SaveAt(5))
    rest, _ = D.distributed_run(
        ex.sde,
        (saved.state, saved.history),
        30 - history.steps,
        DT,
        LR,
        seed=SEED,
        checks=ft.Checks(5),
        save=ft.SaveAt(5),
    )
    assert all(torch.equal(a, b) for a, b in zip(ft.core._tree.leaves(rest), ft.core._tree.leaves(whole)))


# ----------------------------------------------------------------------------------------------
# multi-process tests


def _assert_matches_reference(runs_per_rank, particles, every):
    reference, costs = _reference(particles, STEPS, every)
    offsets = [sum(particles[:r]) for r in range(len(particles))]
    for r, (runs, composed) in enumerate(runs_per_rank):
        final, history, _ = runs[0]
        for other in composed:
            assert all(torch.equal(a, b) for a, b in zip(ft.core._tree.leaves(final), ft.core._tree.leaves(other)))
        rows = slice(offsets[r], offsets[r] + particles[r])
        torch.testing.assert_close(final.x, reference.x[rows], rtol=1e-10, atol=1e-12)
        for got, want in zip(ft.core._tree.leaves(final.x_tilde), ft.core._tree.leaves(reference.x_tilde)):
            torch.testing.assert_close(got, want[rows], rtol=1e-10, atol=1e-12)
        for got, want in zip(ft.core._tree.leaves(final.theta), ft.core._tree.leaves(reference.theta)):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(history.cost, costs.reshape(-1, 10).mean(1), rtol=1e-10, atol=1e-12)
    theta0 = ft.core._tree.leaves(runs_per_rank[0][0][0][0].theta)
    for runs, _ in runs_per_rank[1:]:  # bitwise equal theta on every rank
        assert all(torch.equal(a, b) for a, b in zip(theta0, ft.core._tree.leaves(runs[0][0].theta)))


def test_two_ranks_equal_one_process_reproducibly_and_only_rank_0_prints():
    particles = [3, 3]
    ranks = D.launch(_train_worker, 2, (particles, 1, 2), timeout=LAUNCH_TIMEOUT)
    _assert_matches_reference(ranks, particles, every=1)
    for runs, _ in ranks:  # same seed, same bits
        (a, ha, _), (b, hb, _) = runs
        assert all(torch.equal(u, v) for u, v in zip(ft.core._tree.leaves((a, ha)), ft.core._tree.leaves((b, hb))))
    lines = ranks[0][0][0][2].splitlines()
    assert len(lines) == 4 and all(line.startswith("step") and "ranks 2" in line for line in lines)
    assert all(run[2] == "" for run in ranks[1][0])


@pytest.mark.parametrize(
    "particles, every",
    [([2, 2, 2], 1), ([3, 1, 2], 1), ([2, 2, 2], 4)],
    ids=["equal", "unequal-particles", "accumulate-4"],
)
def test_three_ranks_equal_one_process(particles, every):
    ranks = D.launch(_train_worker, 3, (particles, every, 1), timeout=LAUNCH_TIMEOUT)
    _assert_matches_reference(ranks, particles, every)


def test_failures_stop_every_rank_with_a_clear_error():
    ranks = D.launch(_failures_worker, 3, timeout=LAUNCH_TIMEOUT)
    for r, out in enumerate(ranks):
        theta = out["theta"]
        assert theta["type"] == "GroupError" and theta["reason"] == "theta-mismatch"
        assert theta["ranks"] == (1,) and theta["step"] == 0

        bad_input = out["input"]
        if r == 1:
            assert bad_input["type"] == "ValueError" and "dt" in bad_input["message"]
        else:
            assert bad_input["type"] == "GroupError" and bad_input["ranks"] == (1,) and bad_input["step"] == 0

        raised = out["raise"]
        if r == 1:  # the failing rank re-raises its own error after telling the others
            assert raised["type"] == "ValueError" and "on purpose" in raised["message"]
        else:
            assert raised["type"] == "GroupError" and raised["reason"] == "failed"
            assert raised["ranks"] == (1,) and "rank 1 raised" in raised["message"]
            assert raised["step"] == 5 and raised["has_state"]

        counted = out["counted"]  # the others finish the counted step, agree on the route and stop at the check
        if r == 1:
            assert counted["type"] == "ValueError" and "on purpose" in counted["message"]
        else:
            assert counted["type"] == "GroupError" and counted["reason"] == "failed", counted["message"]
            assert counted["ranks"] == (1,) and counted["step"] == 5 and counted["has_state"]

        nan = out["nan"]
        assert nan["type"] == "GroupError" and nan["reason"] == "non-finite" and nan["step"] == 5
        assert "rank 1 diverged: x, x_tilde or theta became non-finite" in nan["message"], nan["message"]
        assert 1 in nan["ranks"] and nan["has_state"]
        assert out["after"] == pytest.approx(5 * DT)
        assert out["broadcast"] == [0.0, 0.0]
        assert out["mean"] == pytest.approx((0 * 1 + 1 * 2 + 2 * 3) / 6)
        assert out["gather"] == ([{"rank": 0}, {"rank": 1}, {"rank": 2}] if r == 0 else None)


@pytest.mark.parametrize("action", ["exit", "sleep"])
def test_a_rank_that_exits_or_hangs_ends_the_group(action, tmp_path):
    """Rank 1 dies (exit) or stops answering (sleeps 6 s, longer than the 3 s group timeout): rank 0 raises
    GroupError("lost") instead of waiting, before the sleeper wakes (an event, the sleeper's marker file,
    not a duration)."""
    woke = str(tmp_path / "woke")
    with pytest.raises(D.LaunchError) if action == "exit" else contextlib.nullcontext() as caught:
        results = D.launch(_abandon_worker, 2, (action, woke), timeout=LAUNCH_TIMEOUT, group_timeout=3.0)
    if action == "exit":
        assert set(caught.value.errors) == {1} and "code 3" in caught.value.errors[1]
        rank0 = caught.value.results[0]
    else:
        rank0 = results[0]
    assert rank0["type"] == "GroupError" and rank0["reason"] == "lost"
    assert "another rank has probably failed" in rank0["message"]
    assert not rank0["peer_awake"]  # rank 0 gave up on its peer before the sleeper woke


def _cli_worker(folder: str, argv: list[str]):
    os.chdir(folder)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(argv)
    return code, out.getvalue()


def _cli_boom_worker(folder: str):
    ft.examples.REGISTRY["boom"] = boom
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code, out = _cli_worker(folder, ["boom", "--no-plot", "--record-every", "2", "--checkpoint", "ck.pt"])
    return code, out, err.getvalue()


def test_cli_divergence_in_a_group_exits_3_and_saves_the_last_agreed_state(tmp_path):
    ranks = D.launch(_cli_boom_worker, 2, (str(tmp_path),), timeout=LAUNCH_TIMEOUT)
    assert [code for code, _, _ in ranks] == [3, 3] and all(out == "" for _, out, _ in ranks)
    err = ranks[0][2]
    assert "diverged" in err and "ck.pt" in err and err.count("\n") == 1 and ranks[1][2] == ""
    saved = ft.load(tmp_path / "ck.pt")
    assert saved.metadata["world_size"] == 2 and 0 < saved.history.steps < 200  # the group checks every record
    assert all(bool(torch.isfinite(entry["x"]).all()) for entry in saved.metadata["ranks"])


def _torchrun(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2 -m fwdtrain ARGS`` in tmp_path, bounded in time."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun not installed next to the interpreter")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "fwdtrain", *args],
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT,
        env=env,
        cwd=tmp_path,
    )


@pytest.mark.slow
def test_cli_under_torchrun_prints_once_and_resumes_the_group(tmp_path):
    """The real launcher and the real command line: rank 0 alone prints, plots and writes one checkpoint
    with both ranks' particles; resuming it under torchrun equals the uninterrupted group run bitwise."""
    first = _torchrun(tmp_path, "lqr-1d", "--steps", "60", "--particles", "8", "--checkpoint", "a.pt", "--json")
    assert first.returncode == 0, first.stderr[:4000]
    lines = first.stdout.splitlines()
    assert len(lines) == 1, first.stdout  # one copy of the output
    out = json.loads(lines[0])
    assert out["processes"] == 2 and out["particles"] == 8 and out["steps"] == 60
    assert set(out["metrics"]) == {"slope", "cost"}
    if plotting.available():
        assert (tmp_path / "fwdtrain-lqr-1d.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = ft.load(tmp_path / "a.pt")
    assert saved.metadata["world_size"] == 2 and [e["x"].shape for e in saved.metadata["ranks"]] == [(8, 1)] * 2
    assert torch.equal(saved.metadata["ranks"][0]["x"], saved.state.x)
    assert not torch.equal(saved.metadata["ranks"][0]["x"], saved.metadata["ranks"][1]["x"])  # own noise

    # the same command line on a group made by launch (quicker to start than torchrun)
    resumed = D.launch(
        _cli_worker,
        2,
        (str(tmp_path), ["--resume", "a.pt", "--steps", "120", "--checkpoint", "b.pt", "--no-plot", "--json"]),
        timeout=LAUNCH_TIMEOUT,
    )
    whole = D.launch(
        _cli_worker,
        2,
        (str(tmp_path), ["--steps", "120", "--particles", "8", "--checkpoint", "c.pt", "--no-plot", "--json"]),
        timeout=LAUNCH_TIMEOUT,
    )
    for (code0, out0), (code1, out1) in (resumed, whole):
        assert code0 == code1 == 0 and out1 == ""
        assert json.loads(out0)["steps"] == 120 and json.loads(out0)["steps_this_run"] in (60, 120)
    b, c = ft.load(tmp_path / "b.pt"), ft.load(tmp_path / "c.pt")
    assert all(
        torch.equal(u, v)
        for u, v in zip(
            ft.core._tree.leaves((b.state, b.metadata["ranks"])), ft.core._tree.leaves((c.state, c.metadata["ranks"]))
        )
    )
    assert torch.equal(b.history.average_cost[-1], c.history.average_cost[-1])

    # one process cannot continue a group's run
    assert cli.main(["--resume", str(tmp_path / "a.pt"), "--steps", "120", "--no-plot"]) == 2


@pytest.mark.slow
def test_benchmark_quick(monkeypatch, capsys, tmp_path):
    """benchmarks/distributed.py --quick: one line per process count, and the JSON rows."""
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import importlib

    bench = importlib.import_module("distributed")
    payload = bench.main(["--quick", "--out", str(tmp_path / "distributed.json")])
    assert [row["processes"] for row in payload["rows"]] == [1, 2]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("processes")]
    assert [line.split()[1] for line in lines] == ["1", "2"]
    assert all(float(line.split("particle-steps/s")[1].split()[0].replace(",", "")) > 0 for line in lines)


# ----------------------------------------------------------------------------------------------
# 0.2: the compiled and fused kernels under a group (the gradient collective runs between compiled pieces)


def _compiled_worker(particles: int):
    ex = _lqr()
    state = ft.init(ex.sde, ex.theta, ex.x0, particles=particles)
    out = {}
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quick = ft.Compile(True, compiler="dynamo", backend="eager")
        for name, options in (
            ("eager", {"compile": False}),
            ("compiled", {"compile": quick}),
            ("chunked", {"compile": quick._replace(chunk=4)}),
        ):
            out[name] = D.distributed_run(
                ex.sde, state, 20, DT, LR, seed=SEED, save=ft.SaveAt(10), checks=ft.Checks(10), **options
            )
    out["fallbacks"] = [str(w.message) for w in caught if "eagerly instead" in str(w.message)]
    return out


def test_compile_and_fuse_under_a_group_equal_the_eager_run():
    ranks = D.launch(_compiled_worker, 2, (3,), timeout=4 * LAUNCH_TIMEOUT)
    for out in ranks:
        assert out["fallbacks"] == []  # compiled, not fallen back to eager
        eager_state, eager_history = out["eager"]
        for name in ("compiled", "chunked"):
            state, history = out[name]
            for a, b in zip(
                ft.core._tree.leaves((eager_state, eager_history.cost)), ft.core._tree.leaves((state, history.cost))
            ):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    theta0 = ft.core._tree.leaves(ranks[0]["chunked"][0].theta)
    assert all(torch.equal(a, b) for a, b in zip(theta0, ft.core._tree.leaves(ranks[1]["chunked"][0].theta)))


def test_a_rank_started_by_hand_whose_peer_is_killed_says_why(tmp_path):
    """RANK/WORLD_SIZE set by hand (no torchrun agent): kill rank 0 mid-run; rank 1 exits 1 and says why."""
    import signal
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    started = tmp_path / "started.pt"  # rank 0 writes it at step 20: both ranks are then training
    argv = [
        sys.executable,
        "-m",
        "fwdtrain",
        "lqr-1d",
        "--steps",
        "10000000",
        "--no-plot",
        "--no-compile",
        "--checkpoint",
        str(started),
        "--checkpoint-every",
        "20",
    ]
    ranks = [
        subprocess.Popen(
            argv,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        for r in range(2)
    ]
    try:
        deadline = time.monotonic() + 300  # a condition to wait for, with a generous bound: never a fixed sleep
        while not started.exists() and time.monotonic() < deadline and all(p.poll() is None for p in ranks):
            time.sleep(0.2)
        assert started.exists(), "the group did not start training"
        ranks[0].send_signal(signal.SIGKILL)
        _, err = ranks[1].communicate(timeout=180)
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
    assert ranks[1].returncode == 1
    assert err.startswith("fwdtrain: ") and "error: rank 1:" in err and "Traceback" not in err


def _ensemble_worker(particles: list[int], members: int):
    ex = _lqr()
    state = ft.ensemble.init(ex.sde, ex.theta, ex.x0, particles[D.rank()], members=members)
    rates = torch.linspace(0.25, 1.0, members, dtype=torch.float64)
    return D.distributed_run(
        ft.ensemble.Ensemble(ex.sde, members),
        state,
        STEPS,
        DT,
        rates,
        seed=SEED,
        save=ft.SaveAt(10),
        checks=ft.Checks(10),
    )


def test_an_ensemble_on_two_ranks_equals_one_process():
    """Member e on rank r draws BrownianNoise(seed=rank_seed(seed, r) + e); one process with the ranks' particles
    of each member side by side, driven by those streams concatenated, takes the same run (within rounding)."""
    particles, members = [2, 3], 3
    ranks = D.launch(_ensemble_worker, 2, (particles, members), timeout=LAUNCH_TIMEOUT)
    ex = _lqr()
    noise = torch.stack(
        [
            torch.cat(
                [
                    ft.noise.BrownianNoise((n, 1), DT, seed=D.rank_seed(SEED, r) + e, dtype=torch.float64).draw(STEPS)
                    for r, n in enumerate(particles)
                ],
                dim=1,
            )
            for e in range(members)
        ],
        dim=1,
    )  # (steps, E, N, 1)
    start = ft.ensemble.init(ex.sde, ex.theta, ex.x0, sum(particles), members=members)
    rates = torch.linspace(0.25, 1.0, members, dtype=torch.float64)
    reference = ft.run(
        ft.ensemble.Ensemble(ex.sde, members), start, STEPS, DT, rates, noise, save=ft.SaveAt(10), checks=ft.Checks(10)
    )
    for final, history in ranks:
        for name, leaf in reference.state.theta.items():
            torch.testing.assert_close(final.theta[name], leaf, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(history.cost, reference.history.cost, rtol=1e-12, atol=1e-14)
    assert torch.equal(ranks[0][0].theta["weight1"], ranks[1][0].theta["weight1"])  # one theta per member
    offset = particles[0]
    torch.testing.assert_close(ranks[1][0].x, reference.state.x[:, offset:], rtol=1e-12, atol=1e-14)


def _tiny(*, particles=3, dt=DT, steps=STEPS, lr=LR, seed=0, dtype=torch.float64):
    """lqr-1d with a 4-unit network and an evaluate that reads theta only, for the command line on a group."""
    ex = ft.examples.lqr_1d(particles=particles, dt=dt, steps=steps, lr=lr, seed=seed, dtype=dtype, hidden=4)
    return ex._replace(
        name="tiny",
        lr=ft.schedules.constant(lr),
        evaluate=lambda theta: {"slope": ft.examples.linear_slope(ex.sde.control, theta)},
    )


def _cli_tiny_worker(folder: str, argv: list[str]):
    ft.examples.REGISTRY["tiny"] = _tiny
    return _cli_worker(folder, argv)


def test_cli_ensemble_on_two_ranks_equals_one_process_and_prints_every_member_once(tmp_path):
    """--ensemble 3 under a group: every rank steps the 3 members on its own particles; each member equals one
    process with both ranks' particles driven by the ranks' streams (rank seed + e) side by side, and rank 0
    alone prints one JSON object with the 3 members."""
    argv = ["tiny", "--ensemble", "3", "--particles", "3", "--no-compile", "--json", "--checkpoint", "e.pt"]
    ranks = D.launch(_cli_tiny_worker, 2, (str(tmp_path), argv), timeout=LAUNCH_TIMEOUT)
    assert [code for code, _ in ranks] == [0, 0] and ranks[1][1] == ""
    lines = ranks[0][1].splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["ensemble"] == 3 and out["processes"] == 2 and out["seeds"] == [0, 2]
    assert [m["seed"] for m in out["members"]] == [0, 1, 2] and out["diverged"] == []

    particles, members = [3, 3], 3
    noise = torch.stack(
        [
            torch.cat(
                [
                    ft.noise.BrownianNoise((n, 1), DT, seed=D.rank_seed(0, r) + e, dtype=torch.float64).draw(STEPS)
                    for r, n in enumerate(particles)
                ],
                dim=1,
            )
            for e in range(members)
        ],
        dim=1,
    )  # (steps, E, sum(particles), 1)
    runs = [_tiny(particles=sum(particles), seed=e) for e in range(members)]
    start = ft.ensemble.stack([ex.initial_state() for ex in runs])
    problem = ft.ensemble.Ensemble(runs[0].trainable, members)
    reference = ft.run(problem, start, STEPS, DT, runs[0].lr, noise, compile=False)
    saved = ft.load(tmp_path / "e.pt")
    assert saved.metadata["world_size"] == 2 and saved.metadata["ensemble"] == members
    for name, leaf in reference.state.theta.items():
        torch.testing.assert_close(saved.state.theta[name], leaf, rtol=1e-12, atol=1e-14)
    for e, member in enumerate(out["members"]):
        slope = runs[e].evaluate(ft.ensemble.member(reference.state, e).theta)["slope"]
        assert member["metrics"]["slope"]["learned"] == pytest.approx(slope, rel=1e-10)


def test_cli_ensemble_under_torchrun_prints_every_member_once(tmp_path):
    done = _torchrun(tmp_path, "lqr-1d", "--ensemble", "3", "--steps", "30", "--particles", "4", "--json")
    assert done.returncode == 0, done.stderr[:4000]
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    out = json.loads(lines[0])
    assert out["ensemble"] == 3 and out["processes"] == 2 and len(out["members"]) == 3
    assert [m["seed"] for m in out["members"]] == [0, 1, 2] and out["exit_status"] == 0


class _RouteSeen(ft.driver.hooks.Hook):
    """Remembers how the loop's last block ran ("eager" or "compiled")."""

    def end(self, loop, interrupted):
        self.route = loop.route


def _auto_worker(particles: int):
    """The default compile under a group, past ``Compile(after=...)``: the gradient collective runs between the
    step's halves, so the block cannot be one kernel; no rank compiles in the background or switches."""
    ex = _lqr()
    state = ft.init(ex.sde, ex.theta, ex.x0, particles=particles)
    seen = _RouteSeen()
    run = D.distributed_run(ex.sde, state, 30, DT, LR, seed=SEED, compile=ft.Compile(after=1), hooks=(seen,))
    return seen.route, run.state.theta, ft.compile.counts()["compiles"]


def test_compile_auto_under_a_group_steps_eagerly_on_every_rank():
    """Eager and compiled steps agree only to rounding, and a group refuses ranks whose thetas differ: under a
    group the default steps eagerly on every rank (``compile=True`` compiles the halves on every rank)."""
    ranks = D.launch(_auto_worker, 2, (3,), timeout=2 * LAUNCH_TIMEOUT)
    assert [(route, compiles) for route, _, compiles in ranks] == [("eager", 0), ("eager", 0)]
    assert all(torch.equal(ranks[0][1][name], ranks[1][1][name]) for name in ranks[0][1])
