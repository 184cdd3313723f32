"""``compile="auto"``: compile when the steps left are projected to take longer eagerly than compiling them.

One cost model, measured on the machine that runs:

    eager    = remaining x t_eager                                (t_eager: this run's first eager steps, timed)
    compiled = T_compile + remaining x t_eager / speedup
    reuse    = remaining x t_eager x (1 - 1 / speedup) - T_load - T_trace   (what one later run of the same
                                                                         length saves by loading the kernel)

and the run compiles iff compiled < eager + reuse + spent (reuse counts only when the kernel is not on disk
yet: a compiled kernel is kept, so its compile pays back over this run and one more like it; the default
problem's second launch then loads it). ``spent`` is what earlier runs of the same problem and shapes
took eagerly in this process because "auto" kept them eager: a run continued again and again in short
segments compiles once the eager time it has spent reaches the price of compiling (the ski-rental rule:
never more than about twice the better of the two choices made in hindsight). ``T_compile`` is nearly
nothing when the kernel's AOTInductor package is already on disk (a load takes milliseconds, after a trace
that costs about ``TRACE_SECONDS``); otherwise this machine's own record of compile seconds per graph node
(``cache.record_compile``), or ``ASSUMED_SECONDS_PER_NODE`` until it has compiled once. ``speedup``
is this machine's record of eager against compiled step times (``record_speedup``), or
``ASSUMED_SPEEDUP`` until it has one. The assumed constants only matter for a machine's first
compile; they are stated in the docs with the measurements they come from.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable
from typing import NamedTuple

from . import cache

TRACE_SECONDS = 1.5  # tracing the step with make_fx, the first torch.func call included (~1.2 s measured)
LOAD_SECONDS = 0.05  # loading a package from disk (3 ms measured) and checking it against one eager step
ASSUMED_SECONDS_PER_NODE = 0.03  # before a machine's first compile: 11 s for the 370-node seed step, 2-core CPU
ASSUMED_SPEEDUP = 20.0  # before a machine's first measurement: 3.2 ms eager against 0.1 ms compiled at N = 256
EAGER_PROBE_STEPS = 3  # eager steps timed before "auto" decides (after one warm-up step)


class Decision(NamedTuple):
    """What ``decide`` chose, with its estimates in seconds (for logs, benchmarks and tests)."""

    compile: bool
    eager_s: float
    compiled_s: float
    reuse_s: float = 0.0  # what one later run of the same length saves by loading the kernel (not yet on disk)


def seconds_per_node() -> float:
    """This machine's median compile seconds per graph node, or the assumed value before its first compile."""
    entries = cache.read_stats().get("compiles", [])
    rates = [seconds / nodes for seconds, nodes in entries if nodes > 0 and seconds > 0]
    return statistics.median(rates) if rates else ASSUMED_SECONDS_PER_NODE


def speedup() -> float:
    """This machine's median eager / compiled step time, or the assumed value before its first measurement."""
    ratios = [r for r in cache.read_stats().get("speedups", []) if isinstance(r, (int, float)) and r > 0]
    return statistics.median(ratios) if ratios else ASSUMED_SPEEDUP


_SPENT: dict[Hashable, float] = {}  # key -> eager seconds of the runs "auto" kept eager in this process
_SPENT_KEYS = 256  # the most keys remembered (the oldest forgotten first)


def spent(key: Hashable) -> float:
    """The eager seconds that runs of ``key`` (a problem and its shapes) kept eager have taken in this process."""
    return _SPENT.get(key, 0.0)


def spend(key: Hashable, seconds: float) -> None:
    """Add ``seconds`` of eager steps to what ``key`` has spent (a run that "auto" kept eager)."""
    _SPENT[key] = _SPENT.pop(key, 0.0) + seconds
    while len(_SPENT) > _SPENT_KEYS:
        del _SPENT[next(iter(_SPENT))]


_COMPILED: dict[Hashable, None] = {}  # the keys "auto" chose to compile in this process (insertion ordered)


def chose_compiled(key: Hashable) -> None:
    """Remember that a run of ``key`` compiled: a later run of it in this process compiles without probing."""
    _COMPILED[key] = None
    while len(_COMPILED) > _SPENT_KEYS:
        del _COMPILED[next(iter(_COMPILED))]


def compiled_before(key: Hashable) -> bool:
    """Whether "auto" compiled a run of ``key`` in this process (its kernel is built: compiling again is free)."""
    return key in _COMPILED


def worth_tracing(eager_step_s: float, remaining: int, spent_s: float = 0.0) -> bool:
    """Whether the eager steps left, with what earlier runs of the problem spent eagerly, take longer than tracing
    would: below that, stay eager without looking."""
    return eager_step_s * remaining + spent_s > TRACE_SECONDS


def decide(eager_step_s: float, remaining: int, *, warm: bool, nodes: int, spent_s: float = 0.0) -> Decision:
    """Compile iff the compiled estimate (compile or load, then faster steps) beats the eager one, counting
    for a kernel not yet on disk what one later run of the same length saves by loading it, and what earlier
    runs of the same problem spent eagerly in this process (``spent_s``)."""
    eager = eager_step_s * remaining
    compile_s = LOAD_SECONDS if warm else seconds_per_node() * nodes
    compiled = compile_s + eager / speedup()
    reuse = 0.0 if warm else max(0.0, eager - eager / speedup() - LOAD_SECONDS - TRACE_SECONDS)
    return Decision(compiled < eager + reuse + spent_s, eager, compiled, reuse)


def record_speedup(eager_step_s: float, compiled_step_s: float) -> None:
    """Remember a measured eager / compiled step-time ratio (best effort)."""
    if eager_step_s <= 0 or compiled_step_s <= 0:
        return
    stats = cache.read_stats()
    ratios = [r for r in stats.get("speedups", []) if isinstance(r, (int, float))][-19:]
    ratios.append(eager_step_s / compiled_step_s)
    cache.write_stats({**stats, "speedups": ratios})


__all__ = [
    "ASSUMED_SECONDS_PER_NODE",
    "ASSUMED_SPEEDUP",
    "EAGER_PROBE_STEPS",
    "TRACE_SECONDS",
    "Decision",
    "chose_compiled",
    "compiled_before",
    "decide",
    "record_speedup",
    "seconds_per_node",
    "speedup",
    "spend",
    "spent",
    "worth_tracing",
]
