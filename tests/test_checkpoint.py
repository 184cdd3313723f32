import os

import pytest
import torch

import fwdtrain as ft
from fwdtrain.core._tree import leaves, tree_map
from fwdtrain.driver import checkpoint

DT = 0.01


def trained(steps=30, record_every=20):
    ex = ft.examples.lqr_1d(particles=3, dtype=torch.float64, hidden=4)
    state = ft.init(ex.sde, ex.theta, ex.x0, ex.particles)
    return ex, state, ft.run(ex.sde, state, steps, ex.dt, ex.lr, save=ft.SaveAt(record_every))


def same(a, b):
    la, lb = leaves(a), leaves(b)
    return len(la) == len(lb) and all(torch.equal(x, y) for x, y in zip(la, lb))


def test_round_trip_and_bitwise_resume(tmp_path):
    ex, start, (state, history) = trained()
    path = tmp_path / "ck.pt"
    ft.save(path, state, history, metadata={"problem": "lqr-1d", "dt": ex.dt})
    loaded = ft.load(path)
    assert isinstance(loaded, ft.driver.Checkpoint) and loaded.metadata == {"problem": "lqr-1d", "dt": ex.dt}
    assert same(loaded.state, state) and same(loaded.history[:6], history[:6])
    assert loaded.history.noise["brownian"]["position"] == 30
    resumed, resumed_history = ft.run(ex.sde, (loaded.state, loaded.history), 45, ex.dt, ex.lr, save=ft.SaveAt(20))
    whole, whole_history = ft.run(ex.sde, start, 75, ex.dt, ex.lr, save=ft.SaveAt(20))
    assert same(resumed, whole)
    # the resumed history has one more record, at step 30 where the first part ended
    keep = [i for i, n in enumerate(resumed_history.step.tolist()) if n != 30]
    assert resumed_history.step.tolist() == [20, 30, 40, 60, 75]
    assert same(tree_map(lambda x: x[keep], resumed_history[:6]), whole_history[:6])


def test_crash_while_saving_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    _, _, (state, history) = trained(steps=20)
    path = tmp_path / "ck.pt"
    ft.save(path, state, history)
    real_save = torch.save

    def crash(obj, file, *args, **kwargs):
        file.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    other = state._replace(t=state.t + 1)
    with pytest.raises(OSError, match="disk full"):
        ft.save(path, other, history)
    monkeypatch.setattr(torch, "save", real_save)
    assert same(ft.load(path).state, state)
    assert os.listdir(tmp_path) == ["ck.pt"]  # no temporary file left behind


def test_corrupt_truncated_and_foreign_files_are_refused(tmp_path):
    _, _, (state, history) = trained(steps=20)
    path = tmp_path / "ck.pt"
    ft.save(path, state, history)
    data = path.read_bytes()
    cases = {"truncated": data[: len(data) // 2]}
    flipped = bytearray(data)
    index = data.find(state.x.numpy().tobytes())  # the bytes of x inside the file
    assert index > 0
    flipped[index] ^= 0x40
    cases["flipped"] = bytes(flipped)
    for name, content in cases.items():
        bad = tmp_path / f"{name}.pt"
        bad.write_bytes(content)
        with pytest.raises(ft.CheckpointError, match="corrupt|truncated"):
            ft.load(bad)
    for name, content in {"text": b"step,cost\n1,0.5\n", "garbage": b"\x00" + os.urandom(255)}.items():
        bad = tmp_path / f"{name}.txt"
        bad.write_bytes(content)
        with pytest.raises(ft.CheckpointError, match="is not a fwdtrain checkpoint: it is not a file written by"):
            ft.load(bad)
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ft.CheckpointError, match=r"is empty \(0 bytes\)"):
        ft.load(tmp_path / "empty.pt")
    torch.save({"weights": torch.ones(2)}, tmp_path / "plain.pt")
    with pytest.raises(ft.CheckpointError, match="not a fwdtrain checkpoint"):
        ft.load(tmp_path / "plain.pt")
    with pytest.raises(ft.CheckpointError, match="no checkpoint"):
        ft.load(tmp_path / "missing.pt")


class _Payload:
    """Unpickling this would create a directory: weights_only loading must refuse it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


def test_weights_only_refuses_pickled_objects(tmp_path):
    marker = str(tmp_path / "code-ran")
    path = tmp_path / "evil.pt"
    torch.save({"format": checkpoint.FORMAT, "version": checkpoint.VERSION, "content": _Payload(marker)}, path)
    with pytest.raises(ft.CheckpointError, match="weights_only"):
        ft.load(path)
    assert not os.path.exists(marker)


def test_save_rejects_what_weights_only_could_not_load(tmp_path):
    _, _, (state, history) = trained(steps=20)
    with pytest.raises(TypeError, match="metadata"):
        ft.save(tmp_path / "ck.pt", state, history, metadata={"fn": print})
    with pytest.raises(TypeError, match="State"):
        ft.save(tmp_path / "ck.pt", (state.x,))
    assert not os.listdir(tmp_path)
