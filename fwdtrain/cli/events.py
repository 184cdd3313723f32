"""``python -m fwdtrain hawkes-2d`` and ``order-book``: an event-stream example simulated, fitted by the exact
likelihood (batch or online) and compared with the truth; a table, or JSON with ``--json``; ``--plot PATH``
saves the estimates against the truth and the time-rescaling QQ plot."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from .. import examples
from ..events import goodness, qq_plot


def events_parser(name: str) -> argparse.ArgumentParser:
    """The options of the event-stream example ``name``."""
    builder = examples.EVENT_REGISTRY[name]
    parser = argparse.ArgumentParser(prog=f"fwdtrain {name}", description=getattr(builder, "summary", name))
    parser.add_argument("--end-time", type=float, default=None, help="the observation window's end")
    parser.add_argument("--seed", type=int, default=0, help="the simulation's seed")
    parser.add_argument("--method", choices=("batch", "online"), default="batch", help="the fit")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--plot", metavar="PATH", default=None, help="save estimates vs truth and the QQ plot")
    return parser


def _figure(example: Any, result: Any, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = example.compare(result)
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    x = range(len(rows))
    left.errorbar(x, [r[1] for r in rows], yerr=[2 * r[2] for r in rows], fmt="o", label="estimate +- 2 s.e.")
    left.plot(x, [r[3] for r in rows], "kx", label="truth")
    left.set_xticks(list(x), [r[0] for r in rows], rotation=45, ha="right")
    left.legend()
    left.set_title(f"{example.name}: {result.method} fit of {result.events} events")
    qq_plot(goodness(example.model, result.params, example.events), ax=right)
    right.set_title("time-rescaling residuals")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def run_events(name: str, argv: list[str]) -> int:
    """Simulate, fit and report one event-stream example; the exit status."""
    args = events_parser(name).parse_args(argv)
    options = {"seed": args.seed} | ({} if args.end_time is None else {"end_time": args.end_time})
    example = examples.EVENT_REGISTRY[name](**options)
    started = time.perf_counter()
    result = example.fit(args.method)
    seconds = time.perf_counter() - started
    fit = goodness(example.model, result.params, example.events)
    rows = example.compare(result)
    out = {
        "problem": name,
        "method": args.method,
        "events": result.events,
        "seconds": seconds,
        "log_likelihood": result.log_likelihood,
        "parameters": [{"name": r[0], "estimate": r[1], "stderr": r[2], "truth": r[3]} for r in rows],
        "ks": fit.ks,
    }
    if args.plot:
        _figure(example, result, args.plot)
        out["plot"] = args.plot
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{name}: {args.method} fit of {result.events} events in {seconds:.2f} s")
    print(f"{'parameter':<16}{'estimate':>12}{'stderr':>10}{'truth':>10}{'z':>7}")
    for label, estimate, error, truth in rows:
        print(f"{label:<16}{estimate:>12.4f}{error:>10.4f}{truth:>10.4f}{(estimate - truth) / error:>7.2f}")
    print("KS distance of the rescaled times to Exp(1), by type: " + ", ".join(f"{d:.4f}" for d in fit.ks))
    return 0


__all__ = ["events_parser", "run_events"]
