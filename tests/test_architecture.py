"""The module structure: no import cycles (deferred imports count), no use of another module's
private names, and no module hidden by a same-named attribute of its package."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import fwdtrain

PACKAGE = Path(fwdtrain.__file__).parent
PRIVATE_MODULES = {"fwdtrain._checks", "fwdtrain._tree"}  # private modules whose public names are shared


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _imports(module: str, path: Path, modules: dict[str, Path]):
    """(imported fwdtrain module, imported name or None, line) for every import, deferred ones included."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("fwdtrain"):
                    yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, is_package, node.level, node.module)
            if not source.startswith("fwdtrain"):
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in modules:
                    yield submodule, None, node.lineno
                else:
                    yield source, alias.name, node.lineno


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for target, _, _ in _imports(name, path, modules):
            # a package's __init__ may import its own submodules; a submodule importing its package is an edge
            if target in modules and target != name and not target.startswith(name + "."):
                graph[name].add(target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles():
    cycle = _cycle(_graph())  # a package importing its own submodules is not an edge
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _private_uses() -> list[str]:
    modules = _modules()
    found = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        aliases: dict[str, str] = {}  # local name -> fwdtrain module it is bound to
        for target, imported, line in _imports(name, path, modules):
            if (
                imported is not None
                and imported.startswith("_")
                and not imported.startswith("__")
                and target != name
                and target not in PRIVATE_MODULES
            ):
                found.append(f"{name}:{line} imports {target}.{imported}")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _resolve(name, path.name == "__init__.py", node.level, node.module)
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:
                        aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("fwdtrain") and alias.asname:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                target = aliases[node.value.id]
                if (
                    node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and target != name
                    and target not in PRIVATE_MODULES
                ):
                    found.append(f"{name}:{node.lineno} uses {target}.{node.attr}")
    return found


def test_no_private_names_of_other_modules():
    assert _private_uses() == []


def test_the_private_name_finder_finds_uses(tmp_path, monkeypatch):
    (tmp_path / "fwdtrain").mkdir()
    (tmp_path / "fwdtrain" / "__init__.py").write_text("")
    (tmp_path / "fwdtrain" / "a.py").write_text("def _hidden():\n    pass\n")
    (tmp_path / "fwdtrain" / "b.py").write_text("from . import a\nfrom .a import _hidden\na._hidden()\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path / "fwdtrain")
    assert _private_uses() == ["fwdtrain.b:2 imports fwdtrain.a._hidden", "fwdtrain.b:3 uses fwdtrain.a._hidden"]
    (tmp_path / "fwdtrain" / "a.py").write_text("from . import b\n")
    assert _cycle(_graph()) == ["fwdtrain.a", "fwdtrain.b", "fwdtrain.a"]


def test_no_module_is_hidden_by_a_same_named_attribute():
    hidden = []
    for info in pkgutil.walk_packages(fwdtrain.__path__, "fwdtrain."):
        if info.name.endswith("__main__"):
            continue
        parent, _, leaf = info.name.rpartition(".")
        package = importlib.import_module(parent)
        module = importlib.import_module(info.name)
        if getattr(package, leaf) is not module:
            hidden.append(f"{info.name} is hidden by {parent}.{leaf} = {getattr(package, leaf)!r}")
    assert hidden == []


PUBLIC_PATHS = (
    "fwdtrain.schedules",
    "fwdtrain.noise",
    "fwdtrain.errors",
    "fwdtrain.calibration",
    "fwdtrain.sgdct",
    "fwdtrain.ensemble",
)
# The layers, from the ground up: a module imports only from its own package or from packages on lower floors.
LAYERS = (
    ("fwdtrain._compat", "fwdtrain.optim"),  # torch workarounds; update rules (no fwdtrain imports)
    ("fwdtrain.core",),  # the maths: problem, state, sensitivity, solvers, the step, noise, schedules, history
    ("fwdtrain.compile",),  # compiled kernels, their cache and the route rule
    ("fwdtrain.problems", "fwdtrain.events"),  # what is trained: the Trainable protocol, cost form, calibration,
    # SGDCT, ensembles; event streams fitted by the exact likelihood
    ("fwdtrain.driver",),  # the run: options, hooks, the loop, checkpoints
    ("fwdtrain.distributed", "fwdtrain.examples", "fwdtrain.plotting"),
    ("fwdtrain.cli",),
    # the public face, its short paths (modules that re-export a layer's names) and the entry point
    ("fwdtrain", "fwdtrain.__main__", *PUBLIC_PATHS),
)
# the loop reaches problems only through the protocol; run() also turns an SDE into its cost form
THROUGH_THE_PROTOCOL = {"fwdtrain.driver.loop", "fwdtrain.driver.block", "fwdtrain.driver.hooks"}


def _room(module: str) -> tuple[int, str]:
    """(floor, package) of a module: the longest layer entry that is the module or one of its packages."""
    best = max(
        (
            (floor, room)
            for floor, rooms in enumerate(LAYERS)
            for room in rooms
            if module == room or module.startswith(room + ".")
        ),
        key=lambda found: len(found[1]),
    )
    return best


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in graph.items():
        floor, room = _room(module)
        for target in sorted(targets):
            target_floor, target_room = _room(target)
            if target_room != room and target_floor >= floor:
                found.append(f"{module} (floor {floor}) imports {target} (floor {target_floor})")
            if (
                module in THROUGH_THE_PROTOCOL
                and target_room == "fwdtrain.problems"
                and target != "fwdtrain.problems.trainable"
            ):
                found.append(
                    f"{module} imports {target}: the loop sees problems only through fwdtrain.problems.trainable"
                )
    return found


def test_every_import_goes_down_the_layers():
    assert _layer_violations(_graph()) == []


def test_the_layer_check_finds_an_upward_import_and_one_across_a_floor():
    graph = {
        "fwdtrain.core.state": {"fwdtrain.driver.loop"},
        "fwdtrain.examples.lqr": {"fwdtrain.distributed.hooks"},
        "fwdtrain.driver.loop": {"fwdtrain.problems.cost", "fwdtrain.core.state"},
    }
    assert _layer_violations(graph) == [
        "fwdtrain.core.state (floor 1) imports fwdtrain.driver.loop (floor 4)",
        "fwdtrain.examples.lqr (floor 5) imports fwdtrain.distributed.hooks (floor 5)",
        "fwdtrain.driver.loop imports fwdtrain.problems.cost: the loop sees problems only through "
        "fwdtrain.problems.trainable",
    ]


def _functions():
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield name, node


def test_no_function_body_is_longer_than_60_lines():
    """The body, from its first statement (after the docstring) to its last line."""
    long = []
    for module, node in _functions():
        body = node.body[1:] if ast.get_docstring(node) is not None and len(node.body) > 1 else node.body
        lines = node.end_lineno - body[0].lineno + 1
        if lines > 60:
            long.append(f"{module}.{node.name}: {lines} lines")
    assert long == []


def test_no_public_callable_takes_more_than_12_parameters():
    wide = []
    for module, node in _functions():
        if node.name.startswith("_") and node.name != "__init__":
            continue
        arguments = node.args
        named = [
            a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs if a.arg not in ("self", "cls")
        ]
        if len(named) > 12:
            wide.append(f"{module}.{node.name}: {len(named)} parameters")
    assert wide == []


def test_a_short_public_path_only_re_exports_its_layers_names():
    """fwdtrain.schedules and the like: a docstring, then ``from <layer's module> import *`` and that module's
    ``__all__``: each public name is written once, in its layer."""
    modules = _modules()
    for name in PUBLIC_PATHS:
        tree = ast.parse(modules[name].read_text())
        imports = [node for node in tree.body if isinstance(node, ast.ImportFrom)]
        assert len(imports) == 2 and len(tree.body) == 3, f"{name}: docstring, two imports"
        sources = {_resolve(name, False, node.level, node.module) for node in imports}
        assert len(sources) == 1, f"{name} imports from several modules: {sorted(sources)}"
        (source,) = sources
        assert source.count(".") == 2, f"{name} re-exports {source}, not a layer's module"
        assert [[(alias.name, alias.asname) for alias in node.names] for node in imports] == [
            [("*", None)],
            [("__all__", "__all__")],
        ]
        public, layer = importlib.import_module(name), importlib.import_module(source)
        assert public.__all__ == layer.__all__
        assert all(getattr(public, n) is getattr(layer, n) for n in layer.__all__)


def test_the_public_face_is_at_most_35_names_and_every_one_exists():
    # 33 since 0.4 (noise and errors joined schedules and the problem modules); 35 leaves room for one concept

    assert len(fwdtrain.__all__) <= 35
    assert len(set(fwdtrain.__all__)) == len(fwdtrain.__all__)
    assert all(hasattr(fwdtrain, name) for name in fwdtrain.__all__)
