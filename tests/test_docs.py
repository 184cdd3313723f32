"""The documentation cannot drift: every python block of README.md and docs/**/*.md runs, every command of a
shell block parses, the figure script runs, every public name has a docstring and an API entry, and the site
builds with ``mkdocs build --strict`` (when mkdocs is installed: the ``docs`` extra).

The blocks of one page run in order in one namespace, in a temporary working folder. A long run is shortened by
a visible marker on the line that sets its length::

    steps = 20_000  # shortened to 300 when the docs are tested

which the tests replace by ``steps = 300``; nothing is skipped.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import shlex
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

import fwdtrain as ft

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ ]*$", re.M | re.S)
MARK = "when the docs are tested"
SHORTENED = re.compile(
    r"^(?P<lhs>[ ]*[A-Za-z_]\w*[ ]*=[ ]*)(?P<value>[^#\n]+?)[ ]+# shortened to (?P<short>[^ ]+) " + MARK + r"[ ]*$",
    re.M,
)
SETUP = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e '.[plot]' && python -m fwdtrain",
    "pip install torch==2.13.0 -e '.[test,plot]' && python -m pytest -q",
)


def blocks(page: Path, lang: str) -> list[tuple[int, str]]:
    """(first line number, code) of each fenced block of ``lang`` in ``page``, dedented."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        if match.group("lang") != lang:
            continue
        indent = len(match.group("indent"))
        body = "".join(line[indent:] for line in match.group("body").splitlines(keepends=True))
        found.append((text.count("\n", 0, match.start("body")) + 1, body))
    return found


def shortened(code: str) -> str:
    """``code`` with every marked assignment set to its shortened value; a malformed marker fails."""
    marked = sum(MARK in line for line in code.splitlines())
    new, count = SHORTENED.subn(lambda m: f"{m.group('lhs')}{m.group('short')}", code)
    assert count == marked, f"a '# shortened to N {MARK}' marker is malformed in:\n{code}"
    return new


_NAMESPACES: dict[Path, dict[str, Any]] = {}


def run_page(page: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run the python blocks of ``page`` in order in one namespace, in ``folder``; the namespace (cached)."""
    if page in _NAMESPACES:
        return _NAMESPACES[page]
    monkeypatch.chdir(folder)
    namespace: dict[str, Any] = {"__name__": f"docs:{page.name}"}
    torch.manual_seed(0)
    for line, code in blocks(page, "python"):
        source = "\n" * (line - 1) + shortened(code)  # tracebacks point at the page's own lines
        exec(compile(source, str(page), "exec"), namespace)
    _NAMESPACES[page] = namespace
    return namespace


def with_python(pages: list[Path]) -> list[Any]:
    return [pytest.param(p, id=str(p.relative_to(ROOT))) for p in pages if blocks(p, "python")]


@pytest.mark.parametrize("page", with_python(PAGES))
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_page(page, tmp_path, monkeypatch)


def test_every_marker_is_well_formed_and_every_page_is_found() -> None:
    assert len(with_python(PAGES)) >= 10
    for page in PAGES:
        for _, code in blocks(page, "python"):
            shortened(code)
        for lang in ("py", "Python", "python3"):
            assert not blocks(page, lang), f"{page}: use ```python so that the block is run"


def commands(page: Path) -> list[str]:
    """The ``fwdtrain`` command lines of the shell blocks of ``page`` (continuations joined, comments cut)."""
    found = []
    for _, body in blocks(page, "bash"):
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            for part in line.split("&&"):
                words = shlex.split(part)
                if "-m" in words and words[words.index("-m") + 1 : words.index("-m") + 2] == ["fwdtrain"]:
                    found.append(words[words.index("-m") + 2 :])
                elif words[:1] == ["fwdtrain"]:
                    found.append(words[1:])
    return found


def test_every_command_line_in_the_docs_parses(capsys: pytest.CaptureFixture[str]) -> None:
    """Shell blocks are not run (the figure script runs each problem); each command must parse as written."""
    from fwdtrain.cli import parser

    seen = 0
    for page in PAGES:
        for argv in commands(page):
            seen += 1
            if "--help" in argv or "-h" in argv:
                with pytest.raises(SystemExit) as stop:
                    parser.parse(argv)
                assert stop.value.code == 0, f"{page}: fwdtrain {' '.join(argv)}"
                continue
            try:
                parser.parse(argv)
            except (parser.UsageError, SystemExit) as error:
                pytest.fail(f"{page}: `fwdtrain {' '.join(argv)}` does not parse: {error}")
    capsys.readouterr()
    assert seen >= 15


def test_readme_is_a_landing_page_with_the_two_set_up_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    shell = [line for _, body in blocks(ROOT / "README.md", "bash") for line in body.splitlines()]
    assert shell[:2] == list(SETUP), "the README's two set-up commands (CI runs the second one verbatim)"
    assert SETUP[1] in (ROOT / ".ci" / "run").read_text()
    printed = [body for _, body in blocks(ROOT / "README.md", "text")]
    assert (DOCS / "examples" / "output" / "lqr-1d.txt").read_text() in printed, "the README shows the last run"
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), f"README links to a missing {link}"


def _lqr_run(steps: int) -> Any:
    """``python -m fwdtrain``'s default problem through ``fwdtrain.run``, as the command line trains it."""
    ex = ft.examples.lqr_1d()
    return ft.run(ex.sde, ex.initial_state(), steps, ex.dt, ex.lr, ex.noise(0), compile=False)


@pytest.mark.parametrize("page", [ROOT / "README.md", DOCS / "index.md"], ids=["README.md", "docs/index.md"])
def test_the_short_example_is_the_command_lines_default_problem(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = run_page(page, tmp_path, monkeypatch)
    result = namespace["result"]
    reference = _lqr_run(result.history.steps)
    for name, leaf in reference.state.theta.items():
        torch.testing.assert_close(result.state.theta[name], leaf, rtol=1e-5, atol=1e-7)


def test_transforms_page_claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep equals one training per learning rate, the meta-gradient a central difference, and forward
    propagation equals backpropagation through time, as the page says."""
    ns = run_page(DOCS / "guides" / "transforms.md", tmp_path, monkeypatch)
    sde, theta0, x0, dws, dt = ns["sde"], ns["theta0"], ns["x0"], ns["dws"], ns["dt"]
    for r, lr in enumerate(ns["lrs"]):
        state = ft.init(sde, theta0, x0, particles=dws.shape[1])
        for dw in dws:
            state = ft.step(sde, state, dw, dt, float(lr))
        torch.testing.assert_close(ns["states"].theta["k"][r], state.theta["k"], rtol=0, atol=1e-13)
    assert len(set(ns["states"].theta["k"].squeeze(1).tolist())) == 4
    scale, eps = ns["scale"], 1e-6
    central = (ns["final_cost"](scale + eps) - ns["final_cost"](scale - eps)) / (2 * eps)
    assert abs(float(central)) > 1e-4
    torch.testing.assert_close(ns["meta"], central, rtol=1e-6, atol=1e-10)
    assert float(ns["forward"].abs().max()) > 1e-3
    torch.testing.assert_close(ns["backward"]["k"], ns["forward"], rtol=0, atol=1e-13)


def test_figure_script_quick(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("docs_figures", DOCS / "figures.py")
    assert spec is not None and spec.loader is not None
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    assert figures.main(["--quick", "--out", str(tmp_path)]) == 0
    for problem in ft.examples.REGISTRY:
        assert (tmp_path / f"{problem}.png").stat().st_size > 10_000, problem
        assert (tmp_path / f"{problem}.txt").read_text().startswith("(quick run")
        page = (DOCS / "examples" / f"{problem}.md").read_text()
        assert f"figures/{problem}.png" in page and f"docs/examples/output/{problem}.txt" in page
        assert (DOCS / "figures" / f"{problem}.png").is_file()
        assert (DOCS / "examples" / "output" / f"{problem}.txt").read_text().startswith(f"fwdtrain {problem}")


INLINED = re.compile(r"<!-- (?P<source>docs/examples/output/[\w-]+\.txt),[^\n]*-->\n```text\n(?P<body>.*?)```\n", re.S)


def test_example_pages_carry_their_output_inline_equal_to_the_file_it_came_from(tmp_path: Path) -> None:
    """An example page shows its printed output as text, not a snippet include (which GitHub shows literally):
    each copy equals the file docs/figures.py wrote, and the script's own update of a page keeps it so."""
    pages = sorted(p for p in (DOCS / "examples").glob("*.md") if p.name != "index.md")
    assert {page.stem for page in pages} == {*ft.examples.REGISTRY, *ft.examples.EVENT_REGISTRY}
    for page in pages:
        assert "--8<--" not in page.read_text(), f"{page.name}: a snippet include reads as literal text on GitHub"
    for page in (p for p in pages if p.stem in ft.examples.REGISTRY):  # the trained problems print their output
        copies = INLINED.findall(page.read_text())
        assert [source for source, _ in copies] == [f"docs/examples/output/{page.stem}.txt"], page.name
        assert copies[0][1] == (ROOT / copies[0][0]).read_text(), f"{page.name}: the copy differs from its file"
    spec = importlib.util.spec_from_file_location("docs_figures", DOCS / "figures.py")
    assert spec is not None and spec.loader is not None
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    page = (DOCS / "examples" / "sgdct-ou.md").read_text()
    updated = figures.inlined(page, "docs/examples/output/sgdct-ou.txt", "new output\n")
    assert INLINED.findall(updated) == [("docs/examples/output/sgdct-ou.txt", "new output\n")]
    assert updated.replace("new output\n", (DOCS / "examples" / "output" / "sgdct-ou.txt").read_text()) == page
    with pytest.raises(ValueError, match="0 copies"):
        figures.inlined(page, "docs/examples/output/lqr-1d.txt", "x\n")


# ---- the API reference ----

SUBMODULES = ("schedules", "optim", "calibration", "sgdct", "ensemble", "distributed", "examples", "noise", "errors")


def documented() -> set[str]:
    """The identifiers of every ``::: identifier`` directive of the API pages."""
    found = set()
    for page in (DOCS / "api").glob("*.md"):
        found.update(re.findall(r"^::: ([\w.]+)", page.read_text(), re.M))
    return found


def own_docstring(obj: Any) -> str | None:
    doc = getattr(obj, "__doc__", None)
    if isinstance(obj, type):
        doc = obj.__dict__.get("__doc__")
        if doc and re.fullmatch(rf"{obj.__name__}\(.*\)", doc.strip(), re.S):  # NamedTuple's generated one
            return None
    return doc


def test_every_public_name_has_a_docstring_and_an_api_entry() -> None:
    entries = documented()
    for name in ft.__all__:
        obj = getattr(ft, name)
        assert own_docstring(obj), f"fwdtrain.{name} has no docstring"
        assert f"fwdtrain.{name}" in entries, f"fwdtrain.{name} has no API entry (::: fwdtrain.{name})"
    for module_name in SUBMODULES:
        module = getattr(ft, module_name)
        assert module.__doc__, f"fwdtrain.{module_name} has no docstring"
        names = getattr(module, "__all__", None) or [
            name
            for name, obj in vars(module).items()
            if not name.startswith("_") and getattr(obj, "__module__", None) == module.__name__
        ]
        for name in names:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                assert own_docstring(obj), f"fwdtrain.{module_name}.{name} has no docstring"
            covered = f"fwdtrain.{module_name}" in entries or f"fwdtrain.{module_name}.{name}" in entries
            assert covered, f"fwdtrain.{module_name}.{name} has no API entry"


def summary(page: Path) -> str:
    """The hand-written part of an API page: its text above the first ``:::`` directive (what GitHub shows)."""
    return page.read_text().split("\n::: ", 1)[0]


def mentioned(text: str) -> set[str]:
    """Every identifier inside a code span of ``text`` (`` `ft.run(sde, ...)` `` mentions ``ft``, ``run``, ``sde``)."""
    return {word for span in re.findall(r"`([^`\n]+)`", text) for word in re.findall(r"[A-Za-z_]\w*", span)}


def test_every_api_page_is_readable_without_its_directives_and_names_each_public_name() -> None:
    """On GitHub an API page shows only its hand-written summary: every public name of ``fwdtrain`` is named in a
    code span of the summary of the page holding its ``:::`` entry, and every name of a public submodule's
    ``__all__`` in its own page's (``errors``: the Errors page), so that the pages cannot drift from the code."""
    pages = {page: summary(page) for page in (DOCS / "api").glob("*.md")}
    for page, text in pages.items():
        assert len(re.sub(r"^#.*$", "", text, flags=re.M).split()) >= 25, f"{page.name} has no summary to read"
    missing = []
    for name in ft.__all__:
        if inspect.ismodule(getattr(ft, name)):
            continue
        page = next(page for page in pages if re.search(rf"^::: fwdtrain\.{name}$", page.read_text(), re.M))
        if name not in mentioned(pages[page]):
            missing.append(f"{page.name}: {name}")
    for module_name in (*SUBMODULES, "pointprocess"):
        page = DOCS / "api" / f"{module_name}.md"
        names = getattr(ft, module_name).__all__
        missing += [f"{page.name}: {name}" for name in names if name not in mentioned(pages[page])]
    assert not missing, f"public names the API pages' summaries do not name: {missing}"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built once with ``mkdocs build --strict`` (skipped without the ``docs`` extra)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    folder = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert build.returncode == 0, build.stdout + build.stderr
    return folder


def test_site_builds_strict(site: Path) -> None:
    assert (site / "index.html").is_file()


class _Fetches(HTMLParser):
    """The URLs a page makes the browser fetch as it loads: scripts, styles, icons, images, frames, media and the
    ``url(...)`` of inline styles (links a reader follows, ``<a href>``, are not fetched)."""

    ATTRIBUTES: ClassVar[dict[str, str]] = {
        "script": "src",
        "img": "src",
        "iframe": "src",
        "source": "src",
        "video": "src",
        "audio": "src",
        "embed": "src",
        "object": "data",
        "link": "href",
    }
    NOT_FETCHED: ClassVar[set[str]] = {"next", "prev", "canonical", "alternate"}

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if tag == "link" and set(values.get("rel", "").split()) & self.NOT_FETCHED:
            return
        if tag in self.ATTRIBUTES and values.get(self.ATTRIBUTES[tag]):
            self.urls.append(values[self.ATTRIBUTES[tag]])
        self.urls += values.get("srcset", "").split()[::2]
        self.urls += CSS_URL.findall(values.get("style", ""))


CSS_URL = re.compile(r"""url\(\s*["']?([^"')\s]+)|@import\s+["']([^"']+)""")
OUTSIDE = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.I)


def test_the_built_pages_fetch_nothing_from_outside(site: Path) -> None:
    """An offline or firewalled reader sees the whole site: no page loads a script, style, font or image from
    another host (the maths is typeset by the vendored KaTeX, the theme uses the system's fonts). The theme's
    bundle loads mermaid from a CDN only for a page with a mermaid diagram: there is none."""
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 40
    outside = []
    for page in pages:
        text = page.read_text()
        parser = _Fetches()
        parser.feed(text)
        outside += [f"{page.relative_to(site)}: {url}" for url in parser.urls if OUTSIDE.match(url)]
        assert 'class="mermaid"' not in text, f"{page}: a mermaid diagram makes the theme load mermaid from a CDN"
    for sheet in site.rglob("*.css"):
        found = [url or imported for url, imported in CSS_URL.findall(sheet.read_text())]
        outside += [f"{sheet.relative_to(site)}: {url}" for url in found if OUTSIDE.match(url)]
    assert not outside, "the built site fetches from outside:\n" + "\n".join(outside[:20])
    index = (site / "index.html").read_text()
    assert "vendor/katex/katex.min.js" in index and "javascripts/katex.js" in index
    assert 'class="arithmatex"' in (site / "examples" / "lqr-1d" / "index.html").read_text()


def test_the_maths_renders_offline_in_a_headless_browser(site: Path) -> None:
    """Where Chromium is installed (Debian's ``chromium``), a page of the built site loaded with the network cut
    (``unshare -n``, as root) typesets every formula: as many KaTeX renderings as arithmatex spans, none an error."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    offline = ["unshare", "-n"] if shutil.which("unshare") and os.geteuid() == 0 else []
    page = site / "examples" / "lqr-1d" / "index.html"
    command = [*offline, browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000"]
    done = subprocess.run([*command, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    marked = page.read_text().count('class="arithmatex"')
    assert marked > 10
    assert done.stdout.count('class="katex"') == marked and "katex-error" not in done.stdout


def test_the_sites_own_scripts_and_styles_exist() -> None:
    """mkdocs --strict does not check extra_javascript / extra_css: a missing script leaves every formula as raw
    TeX. Each entry must be a file under docs/ (nothing from a CDN); the KaTeX one typesets arithmatex's maths, and
    every font the vendored stylesheet names is vendored beside it."""
    config = (ROOT / "mkdocs.yml").read_text()
    entries = re.findall(r"^extra_(?:javascript|css):\n((?:  - .+\n)+)", config, flags=re.MULTILINE)
    listed = [line.strip()[2:] for block in entries for line in block.splitlines()]
    assert "vendor/katex/katex.min.js" in listed and "vendor/katex/katex.min.css" in listed
    for entry in listed:
        assert "://" not in entry, f"mkdocs.yml loads {entry} from outside the site"
        assert (DOCS / entry).is_file(), f"mkdocs.yml lists docs/{entry}, which does not exist"
    assert "arithmatex" in (DOCS / "javascripts" / "katex.js").read_text()
    katex = DOCS / "vendor" / "katex"
    fonts = re.findall(r"url\(([^)]+)\)", (katex / "katex.min.css").read_text())
    assert len(fonts) >= 20
    for font in fonts:
        assert (katex / font).is_file(), f"docs/vendor/katex/katex.min.css names {font}, which is not vendored"
    assert "MIT" in (katex / "LICENSE").read_text()
