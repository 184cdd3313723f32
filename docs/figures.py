"""The figures and printed results of the example pages, from fixed seeds.

Each built-in problem is trained exactly as ``python -m fwdtrain PROBLEM`` trains it (the command line's
own parsing, training, report and figure: ``fwdtrain.cli.figures``), its printed table is written to
``docs/examples/output/PROBLEM.txt`` and its figure to ``docs/figures/PROBLEM.png``::

    python docs/figures.py                  # every problem at its default length (minutes on two cores)
    python docs/figures.py lqr-1d noisy-control
    python docs/figures.py --quick --out /tmp/figures   # tiny runs, no evaluation (what the tests run)

``--quick`` trains each problem for a few steps with a few particles, skips the evaluation against the
reference and writes into ``--out`` (never over the committed figures). Needs matplotlib and scipy.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
import time
from pathlib import Path
from typing import Any

from fwdtrain.cli import figures as drawing
from fwdtrain.cli.configure import prepare
from fwdtrain.cli.parser import parse
from fwdtrain.cli.report import render, report
from fwdtrain.cli.train import train

DOCS = Path(__file__).resolve().parent
QUICK = ["--total-steps", "40", "--particles", "4", "--record-every", "10"]
# Options beyond the defaults, shown on the problem's page with its command.
EXTRA: dict[str, list[str]] = {}  # extra command-line options per problem


def trained(problem: str, quick: bool) -> tuple[Any, Any, str]:
    """(job, trained, printed table) of ``python -m fwdtrain PROBLEM`` (shortened with ``quick``)."""
    argv = [problem, *EXTRA.get(problem, []), "--no-plot", "--no-progress", *(QUICK if quick else [])]
    args, named = parse(argv)
    job = prepare(args, named)
    result = train(job)
    if quick:
        return job, result, f"(quick run of {' '.join(argv)}: not evaluated)"
    with contextlib.redirect_stdout(io.StringIO()):
        text = render(report(job, result))
    return job, result, text


def inlined(page: str, source: str, text: str) -> str:
    """``page`` with the copy of ``source`` (the text block under its ``<!-- source, ... -->`` marker) set to
    ``text``: the example pages carry their output inline, so that they read on GitHub as on the site."""
    marker = re.compile(rf"(<!-- {re.escape(source)},[^\n]*-->\n```text\n).*?(```\n)", re.S)
    new, count = marker.subn(lambda m: m.group(1) + text + m.group(2), page)
    if count != 1:
        raise ValueError(f"the page has {count} copies of {source} (a '<!-- {source}, ... -->' marker), not one")
    return new


def make(problem: str, quick: bool, figures: Path, outputs: Path) -> float:
    """Train ``problem``, write its printed table and its figure (the command line's: ``fwdtrain.cli.figures``);
    the seconds it took."""
    start = time.perf_counter()
    job, result, text = trained(problem, quick)
    example = job.example
    title = (
        f"{problem}: {result.history.steps} steps of dt {example.dt}, {example.particles} particles, seed {job.seed}"
    )
    figures.mkdir(parents=True, exist_ok=True)
    outputs.mkdir(parents=True, exist_ok=True)
    run = drawing.Trained(example, job.seed, result.state, result.history)
    drawing.save(problem, run, str(figures / f"{problem}.png"), title)
    (outputs / f"{problem}.txt").write_text(text + "\n")
    if not quick:
        page = DOCS / "examples" / f"{problem}.md"
        page.write_text(inlined(page.read_text(), f"docs/examples/output/{problem}.txt", text + "\n"))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("problems", nargs="*", metavar="PROBLEM", help=f"default: all of {', '.join(drawing.FIGURES)}")
    parser.add_argument("--quick", action="store_true", help="tiny runs, no evaluation (for the tests)")
    parser.add_argument("--out", type=Path, help="folder for the figures and tables (required with --quick)")
    args = parser.parse_args(argv)
    if args.quick and args.out is None:
        parser.error("--quick writes into --out DIR, never over the committed figures")
    unknown = [p for p in args.problems if p not in drawing.FIGURES]
    if unknown:
        parser.error(f"unknown problem(s) {unknown}; choose from {list(drawing.FIGURES)}")
    figures = args.out if args.out else DOCS / "figures"
    outputs = args.out if args.out else DOCS / "examples" / "output"
    for problem in args.problems or drawing.FIGURES:
        seconds = make(problem, args.quick, figures, outputs)
        print(f"{problem}: {seconds:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
