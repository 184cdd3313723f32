"""Checkpoints during a run (``fwdtrain.driver.hooks.Checkpointing``) and on the command line: the path is probed before
the first step, a save that fails later keeps the results, and ``--resume`` refuses what it cannot continue."""

from __future__ import annotations

import errno
import os

import pytest
import torch

import fwdtrain as ft
from fwdtrain import cli, examples
from fwdtrain.core._tree import leaves
from fwdtrain.driver import hooks as checkpointing

DT, LR = 0.01, 0.5


def _problem():
    ex = examples.lqr_1d(particles=3, dtype=torch.float64, hidden=4)
    return ex.sde, ft.init(ex.sde, ex.theta, ex.x0, 3)


def _tiny(*, particles=3, dt=0.01, steps=40, lr=0.5, seed=0, dtype=torch.float64):
    ex = examples.lqr_1d(particles=particles, dt=dt, steps=steps, lr=lr, seed=seed, dtype=dtype, hidden=4)
    return ex._replace(name="tiny", lr=ft.schedules.constant(lr), evaluate=lambda theta: {"cost": 0.5})


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(examples.REGISTRY, "tiny", _tiny)


def _unwritable(folder) -> bool:
    """Make ``folder`` read-only; False when that does not stop writes (running as root)."""
    os.chmod(folder, 0o500)
    return not os.access(folder, os.W_OK)


def _bad_paths(tmp_path):
    plain = tmp_path / "file.txt"
    plain.write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir()
    paths = {"missing folder": tmp_path / "missing" / "ck.pt", "under a file": plain / "ck.pt"}
    if _unwritable(locked):
        paths["unwritable folder"] = locked / "ck.pt"
    return paths


def test_run_probes_the_checkpoint_path_before_the_first_step(tmp_path):
    sde, state = _problem()
    steps = []
    for what, path in _bad_paths(tmp_path).items():
        with pytest.raises(ft.CheckpointError, match="cannot write the checkpoint") as caught:
            ft.run(
                sde,
                state,
                10,
                DT,
                LR,
                hooks=(ft.driver.Callback(lambda n, s: steps.append(n), 1), ft.Checkpointing(path)),
            )
        assert str(path) in str(caught.value), what
    assert steps == []  # refused before stepping
    os.chmod(tmp_path / "locked", 0o700)


def test_a_save_that_fails_later_keeps_the_results(tmp_path, monkeypatch):
    sde, state = _problem()
    expected, expected_history = ft.run(sde, state, 30, DT, LR)
    saves = []

    def full_disk(path, *args, **kwargs):
        saves.append(path)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpointing, "save_checkpoint", full_disk)
    path = tmp_path / "ck.pt"
    with pytest.raises(ft.errors.CheckpointWriteError, match="No space left") as caught:
        ft.run(sde, state, 30, DT, LR, hooks=(ft.Checkpointing(path, every=10),))
    error = caught.value
    assert isinstance(error, ft.CheckpointError) and error.path == str(path) and saves == [path]
    assert error.history.steps == 10 and float(error.state.t) == pytest.approx(10 * DT)  # the state it tried to save
    # at the end: the whole run
    with pytest.raises(ft.errors.CheckpointWriteError) as caught:
        ft.run(sde, state, 30, DT, LR, hooks=(ft.Checkpointing(path),))
    assert all(torch.equal(a, b) for a, b in zip(leaves(caught.value.state), leaves(expected)))
    assert torch.equal(caught.value.history.cost, expected_history.cost)


def test_cli_refuses_an_unwritable_checkpoint_before_training(tiny, tmp_path, capsys):
    for what, path in _bad_paths(tmp_path).items():
        assert cli.main(["tiny", "--no-plot", "--checkpoint", str(path)]) == 2, what
        captured = capsys.readouterr()
        assert str(path) in captured.err and "Traceback" not in captured.err and captured.out == ""
    os.chmod(tmp_path / "locked", 0o700)


def test_cli_prints_the_results_when_the_final_save_fails(tiny, tmp_path, capsys, monkeypatch):
    def full_disk(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpointing, "save_checkpoint", full_disk)
    path = tmp_path / "ck.pt"
    assert cli.main(["tiny", "--no-plot", "--checkpoint", str(path)]) == cli.app.EXIT_CHECKPOINT == 4
    captured = capsys.readouterr()
    assert "steps 40" in captured.out and "checkpoint NOT saved" in captured.out
    assert str(path) in captured.err and "No space left" in captured.err


def test_cli_resume_refuses_another_seed_and_foreign_or_historyless_checkpoints(tiny, tmp_path, capsys):
    path = tmp_path / "ck.pt"
    assert cli.main(["tiny", "--no-plot", "--steps", "20", "--seed", "0", "--checkpoint", str(path)]) == 0
    capsys.readouterr()
    assert cli.main(["tiny", "--no-plot", "--steps", "40", "--seed", "5", "--resume", str(path)]) == 2
    assert "--seed 5 differs from the resumed run's 0" in capsys.readouterr().err
    assert cli.main(["tiny", "--no-plot", "--steps", "40", "--seed", "0", "--resume", str(path)]) == 0
    capsys.readouterr()

    # an API checkpoint of another SDE, with its history
    sde = ft.SDE(
        drift=lambda th, x: -th["k"] * x, diffusion=lambda th, x: torch.ones_like(x), cost=lambda th, x: (x * x).sum()
    )
    theta = {"k": torch.tensor(1.0, dtype=torch.float64)}
    state, history = ft.run(sde, ft.init(sde, theta, torch.zeros(1, dtype=torch.float64), 3), 5, DT, LR)
    foreign = tmp_path / "foreign.pt"
    ft.save(foreign, state, history)
    assert cli.main(["tiny", "--no-plot", "--resume", str(foreign)]) == 2
    err = capsys.readouterr().err
    assert "does not fit this problem (tiny)" in err and "Traceback" not in err

    bare = tmp_path / "bare.pt"
    ft.save(bare, state)
    assert cli.main(["tiny", "--no-plot", "--resume", str(bare)]) == 2
    assert "without its history" in capsys.readouterr().err


def test_a_second_interrupt_during_the_evaluation_still_prints_the_training(tmp_path, capsys, monkeypatch):
    def interrupted_evaluation(**options):
        def evaluate(theta):
            raise KeyboardInterrupt

        return _tiny(**options)._replace(evaluate=evaluate)

    monkeypatch.setitem(examples.REGISTRY, "tiny", interrupted_evaluation)
    assert cli.main(["tiny", "--no-plot", "--json"]) == 130
    import json

    result = json.loads(capsys.readouterr().out)
    assert result["steps"] == 40 and result["interrupted"]
    assert any("evaluation interrupted" in note for note in result["notes"])
