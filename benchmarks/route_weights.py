"""What the route rule would have cost on ``bench_route``'s continued cases with another ``CONTINUED_WEIGHT``,
from the times one ``bench_route`` run measured (no run of its own but one counted step per case).

    python -m benchmarks.route_weights                                   # benchmarks/results/bench_route.json
    python -m benchmarks.route_weights path/to/bench_route.json --weights 0 1 4 16

Per case and machine (``fresh``, ``warm``) the measured times give an eager segment e (``False``'s time over its
segments on that machine), a compiled one k (``again``'s ``True``: a kernel loaded, no compile) and the compile c (that
machine's ``True`` less its segments at k). The rule (``fwdtrain.compile.route.choose``, its estimates, not
the times) picks the first call that compiles, i; the cost is i e + c + (n - i) k, against the better fixed
route. A weight of 0 never looks back: one segment at a time, which never compiles on these cases.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .bench_route import CASES, RESULTS, example_of


def counted(case: dict[str, Any]) -> Any:
    """The ``StepCost`` of the case's step, counted as ``compile="auto"`` counts it."""
    import torch

    from fwdtrain.driver import runner

    torch.set_num_threads(1)
    ex = example_of(case["problem"], case["particles"])
    loop = runner.setup(
        ex.trainable, ex.initial_state(), 1, ex.dt, ex.lr, ex.noise(0), compile="auto", save=None, hooks=()
    )
    return loop.cost if loop.cost is not None else loop.counted_step(loop.source.draw(1)[0])


def first_compiled(cost: Any, segment: int, segments: int, weight: float, set_up: bool) -> int:
    """The first call (0-based) the rule compiles with this weight; ``segments`` when none does."""
    from fwdtrain.compile import route

    for call in range(segments):
        eager_s, compiled_s = route.estimates(cost, segment + int(weight * call * segment), False, set_up)
        if compiled_s < eager_s:
            return call
    return segments


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", default=str(RESULTS / "bench_route.json"))
    parser.add_argument("--weights", type=float, nargs="+", default=[0, 1, 2, 4, 8, 16, 32])
    args = parser.parse_args(argv)
    rows = json.loads(Path(args.results).read_text())["rows"]
    seconds = {(row["case"], row["machine"], row["route"]): row["seconds"] for row in rows}
    print("| case | machine | e, k, c (s) | auto measured | " + " | ".join(f"W = {w:g}" for w in args.weights) + " |")
    print("|---|---|---|---:|" + "---:|" * len(args.weights))
    for name, case in CASES.items():
        segment, n = case["segment"], case["segments"]
        if n == 1 or (name, "fresh", "True") not in seconds:
            continue
        cost = counted(case)
        k = seconds[(name, "again", "True")] / n
        for machine in ("fresh", "warm"):
            e = seconds[(name, machine, "False")] / n
            c = seconds[(name, machine, "True")] - n * k
            best = min(seconds[(name, machine, "True")], seconds[(name, machine, "False")])
            cells = []
            for weight in args.weights:
                i = first_compiled(cost, segment, n, weight, set_up=machine == "warm")
                total = i * e + (c + (n - i) * k if i < n else 0.0)
                cells.append(f"{total / best:.2f} ({i})")
            measured = seconds[(name, machine, "auto")] / best
            print(f"| {name} | {machine} | {e:.2f}, {k:.3f}, {c:.1f} | {measured:.2f} | " + " | ".join(cells) + " |")
    print("\nx the better fixed route (in brackets: the eager calls before the first compiled one)")


if __name__ == "__main__":
    main()
