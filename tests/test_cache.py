"""The kernels' folder (``fwdtrain.compile.cache``) stays within its cap: least recently used packages go first,
never the one just written; ``fwdtrain cache`` shows, prunes and clears it. Packages here are fake files of
chosen sizes and modification times (the last use), except in the one slow test that compiles for real."""

import json
import os
import time
import warnings
from pathlib import Path

import pytest
import torch

import fwdtrain as ft
from fwdtrain import cli
from fwdtrain.compile import cache, kernels

HOUR = 3600.0


def package(name: str, size: int, age: float = 0.0, suffix: str = ".pt2") -> Path:
    """A fake package of ``size`` bytes last used ``age`` seconds ago."""
    path = cache.cache_dir() / "kernels" / f"{name}{suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    when = time.time() - age
    os.utime(path, (when, when))
    return path


def on_disk() -> list[str]:
    return sorted(path.name for path in (cache.cache_dir() / "kernels").iterdir())


def test_past_the_cap_the_least_recently_used_packages_go_until_the_rest_fits(monkeypatch):
    monkeypatch.setenv(cache.LIMIT_ENV, "2500")
    for age, name in enumerate("edcba"):  # a is the oldest use, e the newest
        package(name, 1000, age=10.0 * age)
    pruned = cache.prune(keep=package("f", 1000))
    assert on_disk() == ["e.pt2", "f.pt2"]
    assert pruned == cache.Pruned(removed=4, freed=4000, kept=2, size=2000)
    assert cache.prune() == cache.Pruned(0, 0, 2, 2000)  # within the cap: nothing to do


def test_the_package_just_written_stays_even_alone_over_the_cap(monkeypatch):
    monkeypatch.setenv(cache.LIMIT_ENV, "1k")
    package("old", 500, age=HOUR)
    written = package("new", 5000, age=2 * HOUR)  # an old modification time: `keep` decides, not the clock
    assert cache.prune(keep=written).removed == 1
    assert on_disk() == ["new.pt2"]


def test_a_loaded_package_survives_and_an_unused_one_of_the_same_age_goes(monkeypatch):
    monkeypatch.setenv(cache.LIMIT_ENV, "2000")
    loaded, unused = package("loaded", 1000, age=HOUR), package("unused", 1000, age=HOUR + 1)
    cache.touch(unused.with_name("gone.pt2"))  # a package another process removed: nothing happens
    cache.touch(loaded)
    cache.prune(keep=package("new", 1000))
    assert on_disk() == ["loaded.pt2", "new.pt2"]


def test_a_prune_clears_stale_temporaries_and_rejected_packages_and_skips_what_vanished(monkeypatch):
    monkeypatch.setenv(cache.LIMIT_ENV, "none")
    package(".tmp-crashed-abc", 300, age=2 * HOUR)
    package(".tmp-compiling-def", 300, age=60.0)  # another process's compile in progress
    package("set-aside", 200, suffix=".rejected")
    package("kept", 100)
    assert cache.prune() == cache.Pruned(removed=0, freed=500, kept=1, size=100)
    assert on_disk() == [".tmp-compiling-def.pt2", "kept.pt2"]

    monkeypatch.setenv(cache.LIMIT_ENV, "0")
    real_scandir = os.scandir

    def racing_scandir(folder):  # another process removes a package between the listing and its stat
        entries = list(real_scandir(folder))
        os.unlink(cache.cache_dir() / "kernels" / "kept.pt2")
        return iter(entries)

    monkeypatch.setattr(os, "scandir", racing_scandir)
    assert cache.prune().removed == 0
    monkeypatch.setattr(os, "scandir", real_scandir)
    os.unlink(cache.cache_dir() / "kernels" / ".tmp-compiling-def.pt2")
    assert cache.prune_to(0) == cache.Pruned(0, 0, 0, 0)  # an empty folder, or none: nothing to do
    os.rmdir(cache.cache_dir() / "kernels")
    assert cache.prune_to(0) == cache.Pruned(0, 0, 0, 0)


def build_folder(name: str, age: float, wrapper: bool = True) -> int:
    """A fake folder of ``cache_dir() / "inductor"`` (with an AOTInductor wrapper's source when ``wrapper``), its
    files last written ``age`` seconds ago; returns its bytes."""
    folder = cache.cache_dir() / "inductor" / name
    (folder / "weights").mkdir(parents=True, exist_ok=True)
    files = {folder / (f"{name}.wrapper.cpp" if wrapper else f"{name}.h.gch"): 700, folder / "weights" / "w.o": 50}
    when = time.time() - age
    for path, size in files.items():
        path.write_bytes(b"x" * size)
        os.utime(path, (when, when))
    return sum(files.values())


def test_a_prune_removes_aotinductors_build_folders_untouched_for_an_hour(monkeypatch):
    """A compile's build folder is a copy of its package: gone after an hour; a younger one (maybe another process's
    compile in progress) and inductor's other folders (precompiled headers) stay."""
    monkeypatch.setenv(cache.LIMIT_ENV, "none")
    stale = build_folder("cstale", age=2 * HOUR)
    build_folder("cyoung", age=60.0)
    build_folder("precompiled_headers", age=2 * HOUR, wrapper=False)
    before = cache.usage().inductor_bytes
    assert cache.prune() == cache.Pruned(removed=0, freed=stale, kept=0, size=before - stale)
    assert sorted(p.name for p in (cache.cache_dir() / "inductor").iterdir()) == ["cyoung", "precompiled_headers"]
    assert cache.usage().inductor_bytes == before - stale


def inductor_file(relative: str, size: int, age: float) -> Path:
    """A fake file of ``cache_dir() / "inductor"`` of ``size`` bytes, last written and read ``age`` seconds ago."""
    path = cache.cache_dir() / "inductor" / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"i" * size)
    when = time.time() - age
    os.utime(path, (when, when))
    return path


def inductor_layout() -> None:
    """Inductor's folder as a few compiles leave it, 1930 bytes: precompiled headers (a header and its compiled form,
    4 h old, 1000 bytes; another, 3 h, 400), a cache bucket (a source and its library, 5 h, 300), a compile's build
    folder of the last hour (200), two lock folders and the probe's record (10 each)."""
    inductor_file("precompiled_headers/cold.h", 100, 4 * HOUR)
    inductor_file("precompiled_headers/cold.h.gch", 900, 4 * HOUR)
    inductor_file("precompiled_headers/warm.h.gch", 400, 3 * HOUR)
    inductor_file("precompiled_headers/locks/cold.lock", 10, 4 * HOUR)
    inductor_file("th/cprobe.cpp", 100, 5 * HOUR)
    inductor_file("th/cprobe.so", 200, 5 * HOUR)
    inductor_file("cbuild/cbuild.wrapper.cpp", 200, 0.5 * HOUR)
    inductor_file("locks/cbuild.lock", 10, 0.5 * HOUR)
    inductor_file("isa.json", 10, 5 * HOUR)


def inductor_left() -> list[str]:
    folder = cache.cache_dir() / "inductor"
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())


def test_inductors_files_count_under_the_cap_and_go_oldest_first_with_the_packages(monkeypatch):
    """Packages and inductor's files are one least-recently-used list under the cap: the oldest go first whatever
    their kind (a header goes with its compiled form), never the package just written, never inductor's files of
    the last hour (a compile may be using them), its locks or the probe's record."""
    inductor_layout()
    package("p4", 500, age=4.5 * HOUR)
    package("p2", 500, age=2 * HOUR)
    written = package("new", 500, age=6 * HOUR)
    assert cache.usage().inductor_bytes == 1930 and cache.usage().total == 1930 + 1500
    monkeypatch.setenv(cache.LIMIT_ENV, "2000")  # 3430 bytes: th (5 h, 300), p4 (4.5 h), cold.h (4 h, 1000) go
    pruned = cache.prune(keep=written)
    assert pruned == cache.Pruned(removed=1, freed=1800, kept=2, size=1630)
    assert on_disk() == ["new.pt2", "p2.pt2"]
    expected = ["cbuild/cbuild.wrapper.cpp", "isa.json", "locks/cbuild.lock", "precompiled_headers/locks/cold.lock"]
    assert inductor_left() == sorted([*expected, "precompiled_headers/warm.h.gch"])
    assert cache.usage().total == 1630
    assert cache.prune_to(0, keep=written) == cache.Pruned(removed=1, freed=900, kept=1, size=730)
    assert inductor_left() == expected  # the last hour's build folder, the locks and the record stay


def test_no_file_of_inductor_goes_while_another_process_holds_one_of_its_locks(monkeypatch):
    """A held lock in inductor's folder is a compile in progress, which may read any of its files (a header
    made days ago): over the cap, only packages go then; once the lock is free, inductor's old files go too."""
    fcntl = pytest.importorskip("fcntl")
    inductor_layout()
    package("old", 500, age=6 * HOUR)
    lock = cache.cache_dir() / "inductor" / "locks" / "cbuild.lock"
    with open(lock, "r+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another open file: as another process, flock() refuses the prune's
        assert cache.prune_to(0) == cache.Pruned(removed=1, freed=500, kept=0, size=1930)
        assert len(inductor_left()) == 9
        fcntl.flock(held, fcntl.LOCK_UN)
    assert cache.prune_to(0).freed == 1700 and len(inductor_left()) == 4


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", cache.DEFAULT_LIMIT_BYTES),
        ("123456", 123456),
        ("500M", 500_000_000),
        ("2G", 2_000_000_000),
        ("1.5gb", 1_500_000_000),
        (" 512 MiB ", 512 * 2**20),
        ("10k", 10_000),
        ("0", 0),
        ("none", None),
        ("Unlimited", None),
    ],
)
def test_the_cap_from_the_environment(monkeypatch, text, expected):
    monkeypatch.setenv(cache.LIMIT_ENV, text)
    assert cache.limit_bytes() == expected


@pytest.mark.parametrize("text", ["-1", "abc", "5X", "1e9", "inf", "2 G B"])
def test_a_bad_cap_names_the_variable_its_value_and_the_accepted_forms(monkeypatch, text):
    monkeypatch.setenv(cache.LIMIT_ENV, text)
    with pytest.raises(ValueError) as error:
        cache.limit_bytes()
    message = str(error.value)
    assert f"FWDTRAIN_CACHE_LIMIT={text!r}" in message and "500M" in message and "'none'" in message
    package("a", 10, age=HOUR)
    with warnings.catch_warnings(record=True) as caught:  # the engine's call warns and keeps the default cap
        warnings.simplefilter("always")
        assert cache.prune(keep=package("b", 10)) == cache.Pruned(0, 0, 2, 20)
    assert len(caught) == 1 and f"FWDTRAIN_CACHE_LIMIT={text!r}" in str(caught[0].message)


def test_the_cache_command_shows_the_folder_packages_cap_and_inductor(monkeypatch, capsys):
    monkeypatch.setenv(cache.LIMIT_ENV, "2G")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    package("a", 1_500_000)
    package("b", 1_000_000)
    package(".tmp-x", 7)
    inductor = cache.cache_dir() / "inductor" / "ab" / "cd"
    inductor.mkdir(parents=True)
    (inductor / "graph.so").write_bytes(b"y" * 300_000)
    assert cli.main(["cache"]) == 0
    out = capsys.readouterr().out
    assert f"cache folder  {cache.cache_dir()}\n" in out
    assert "packages      2, 2.5 MB" in out and "cap           2.0 GB" in out and "inductor      300.0 kB" in out
    assert cli.main(["cache", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown == {
        "folder": str(cache.cache_dir()),
        "packages": 2,
        "package_bytes": 2_500_000,
        "limit_bytes": 2_000_000_000,
        "inductor_bytes": 300_000,
        "torchinductor_cache_dir": None,
        "exit_status": 0,
    }
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")  # the user's own folder for inductor's caches
    assert cli.main(["cache"]) == 0
    assert "inductor writes to $TORCHINDUCTOR_CACHE_DIR=/elsewhere\n" in capsys.readouterr().out


def test_the_cache_command_prunes_to_a_size_and_clears_everything(monkeypatch, capsys):
    package("old", 1_000_000, age=HOUR)
    package("new", 1_000_000)
    assert cli.main(["cache", "--limit", "1.5M"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pruned to 1.5 MB: removed 1 package, freed 1.0 MB\n") and "packages      1, 1.0 MB" in out
    assert on_disk() == ["new.pt2"]
    (cache.cache_dir() / "inductor" / "fx").mkdir(parents=True)
    (cache.cache_dir() / "inductor" / "fx" / "entry").write_bytes(b"z" * 2_000_000)
    (cache.cache_dir() / "routes").mkdir()
    (cache.cache_dir() / "routes" / "0123").touch()  # a route marker (fwdtrain.compile.route)
    assert cli.main(["cache", "--clear"]) == 0
    out = capsys.readouterr().out
    assert out == f"cleared {cache.cache_dir()}: freed 3.0 MB (1 package, 2.0 MB of inductor's caches)\n"
    assert os.listdir(cache.cache_dir()) == []  # the route markers went with the kernels
    assert cli.main(["cache", "--clear", "--json"]) == 0  # nothing left to clear
    assert json.loads(capsys.readouterr().out)["freed_bytes"] == 0


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["cache", "--limit", "lots"], None, "argument --limit: 'lots' is not a size"),
        (["cache", "--clear", "--limit", "1G"], None, "not allowed with argument"),
        (["cache"], "12Q", "FWDTRAIN_CACHE_LIMIT='12Q' is not a size"),
    ],
)
def test_the_cache_command_refuses_a_bad_size_in_one_line(monkeypatch, capsys, argv, env, message):
    if env is not None:
        monkeypatch.setenv(cache.LIMIT_ENV, env)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fwdtrain: error:") and message in err and err.count("\n") == 1, err
    assert cli.main([*argv, "--json"]) == 2
    assert message in json.loads(capsys.readouterr().out)["error"]["message"]


def test_the_engine_touches_on_load_and_prunes_after_a_write(monkeypatch):
    """Through ``function_kernel`` with the compile stubbed (what is tested is the cache, not inductor): with a
    cap of one package, a second kernel written removes the first; loading it again from disk marks it used."""

    compiled = (  # the compile's process, writing a stand-in package and pruning as the worker does
        "import os, sys; open(sys.argv[2], 'wb').write(b'compiled' * 100); os.unlink(sys.argv[1]); "
        "from fwdtrain.compile import cache; cache.prune(keep=sys.argv[2])"
    )
    monkeypatch.setattr(kernels, "WORKER", ("-c", compiled))
    monkeypatch.setattr(ft._compat, "aot_load", lambda path, device: lambda flat: [flat[0] * 2])
    monkeypatch.setenv(cache.LIMIT_ENV, "1000")
    x = torch.arange(3.0, dtype=torch.float64)
    options = ft.Compile(True, verify=False)

    def build(fn, key):
        cache.forget_kernels()
        return ft.compile.function_kernel(fn, (x,), key=key, options=options)(x)

    build(lambda x: x * 2, "first")
    (first,) = on_disk()
    build(lambda x: x + x, "second")
    (second,) = on_disk()
    assert second != first
    old = time.time() - HOUR
    os.utime(cache.cache_dir() / "kernels" / second, (old, old))
    build(lambda x: x + x, "second")  # loaded from disk, not compiled
    assert time.time() - (cache.cache_dir() / "kernels" / second).stat().st_mtime < 60
    cache.forget_kernels()


@pytest.mark.slow
def test_two_real_compiles_under_a_tiny_cap_leave_the_newest(monkeypatch):
    """Two AOTInductor compiles (about 40 s each on two busy cores) with a cap of one byte: the compile process's
    prune leaves only the newest; a prune that counts every build folder stale leaves none in ``inductor/``."""
    monkeypatch.setenv(cache.LIMIT_ENV, "1")
    ex = ft.examples.lqr_1d(dtype=torch.float64, hidden=4, particles=2)
    cache.forget_kernels()
    for particles in (2, 3):  # another shape: another kernel
        state = ft.init(ex.sde, ex.theta, torch.zeros(particles, 1, dtype=torch.float64))
        ft.run(ex.sde, state, 8, 0.01, ex.lr, 1, compile=True)
        newest = max((cache.cache_dir() / "kernels").glob("*.pt2"), key=lambda path: path.stat().st_mtime_ns)
        assert on_disk() == [newest.name]
    assert cache.usage().packages == 1
    monkeypatch.setattr(cache, "STALE_SECONDS", -1.0)  # every build folder stale: inductor's real layout is pruned
    cache.prune()
    assert not list((cache.cache_dir() / "inductor").glob("*/*.wrapper.cpp"))  # no compile's build folder left
    cache.forget_kernels()


def test_the_cache_module_holds_the_only_module_global_state():
    """A module-level container that is not a constant table (those are named in capitals) lives in ``cache``."""
    import ast

    containers = {"dict", "set", "list", "WeakKeyDictionary", "WeakValueDictionary", "Counter", "OrderedDict"}
    found = []
    for path in sorted((Path(ft.__file__).parent).rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            value = getattr(node, "value", None)
            if not isinstance(target, ast.Name) or value is None or target.id.isupper() or target.id == "__all__":
                continue
            call = value.func if isinstance(value, ast.Call) else None
            if isinstance(value, (ast.Dict, ast.Set, ast.List)) or getattr(call, "attr", getattr(call, "id", None)) in (
                containers
            ):
                found.append(f"{path.relative_to(Path(ft.__file__).parent)}:{target.id}")
    assert sorted(found) == [
        "compile/cache.py:_checked",
        "compile/cache.py:_events",
        "compile/cache.py:_kernels",
        "compile/cache.py:_prepared",
    ], found
