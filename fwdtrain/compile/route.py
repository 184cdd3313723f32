"""``compile="auto"``: eager or compiled steps, chosen by a rule stated in advance.

The rule reads what one eager step of the run does, counted (never timed): ``ops``, the ATen calls it
makes, and ``numbers``, the numbers those calls write (``count_step``). From them, with constants
measured once on a 2-core CPU (``benchmarks/bench_route.py`` measures them again):

    E = OP_SECONDS x ops + NUMBER_SECONDS x numbers        one eager step (Python and dispatch per call, memory)
    K = COMPILED_NUMBER_SECONDS x numbers                  one compiled step
    C = TRACE_SECONDS + LOAD_SECONDS                       when a kernel of this step is on disk, else
        TRACE_SECONDS + COMPILE_SECONDS + COMPILE_SECONDS_PER_OP x ops
            (+ SETUP_SECONDS where inductor was never set up in this cache: its probe and headers)
    S = the steps this call takes + the larger of CONTINUED_WEIGHT x the steps the run took before it (its
        history) and the steps earlier "auto" runs of this step kept eager in this cache (``eager_spent``)

and the run compiles iff S (E - K) > C. Nothing else counts: the same call on the same machine and cache
takes the same route, whatever the process ran before. A run continued in segments thus compiles once it
has spent about C / CONTINUED_WEIGHT eagerly, and a job launched again and again once its launches' eager
steps would have paid for the compile (ski rental). "A kernel of this step is on disk" is a marker a compiled
run leaves (``routes/<signature>``: the counted step's calls and shapes, dt, the options, torch, the CPU). The
performance guide states the rule for a user, with what it costs.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import _compat
from . import cache

OP_SECONDS = 9e-6  # eager seconds per ATen call (the seed step at N = 1: 121 calls in 1.1 ms)
NUMBER_SECONDS = 0.7e-9  # eager seconds per number written (the seed step at N = 10^4: 18 M numbers, 13.8 ms)
COMPILED_NUMBER_SECONDS = 0.09e-9  # compiled seconds per number the eager step writes (N = 10^4: 1.6 ms)
TRACE_SECONDS = 2.0  # tracing the step with make_fx and looking up its package
LOAD_SECONDS = 0.5  # loading a package from disk and checking it against one eager step
COMPILE_SECONDS = 10.0  # AOTInductor's fixed cost for one kernel (the C++ build and link)
COMPILE_SECONDS_PER_OP = 0.05  # and per ATen call of the step (the seed step: 121 calls, about 15 s in all)
SETUP_SECONDS = 20.0  # a cache's first compile also builds inductor's instruction-set probe and headers
CONTINUED_WEIGHT = 16  # the weight of the steps a continued run took before this call (bench_route: 3 left
# the seed problem continued in 2,048-step segments at 1.4x to 1.6x compile=True, 4 to 6 eager segments)


class StepCost(NamedTuple):
    """What one eager step does: ATen calls, numbers written, and a signature of its calls and shapes."""

    ops: int
    numbers: int
    signature: str


class Route(NamedTuple):
    """How a run's steps are computed, and why.

    Attributes:
        compiled: True for the compiled loop, False for eager steps.
        reason: One line that says why (shown by ``Progress`` and ``choose_route``).
        eager_s: The rule's estimate of the steps' seconds eagerly (0 where no estimate was made).
        compiled_s: Its estimate with compiling (compile or load included).
    """

    compiled: bool
    reason: str
    eager_s: float = 0.0
    compiled_s: float = 0.0

    def __str__(self) -> str:
        return f"{'compiled' if self.compiled else 'eager'} ({self.reason})"


class _Counter(TorchDispatchMode):
    """Counts the ATen calls below every ``torch.func`` transform and the numbers they write."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch 2.13 wraps a mode's __torch_dispatch__ in dynamo.disable, whose first call imports dynamo (4 s):
        # a counted eager step must not pay for a compiler it may never use
        return False

    def __init__(self) -> None:
        super().__init__()
        self.ops, self.numbers = 0, 0
        self.digest = hashlib.sha256()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        self.digest.update(str(func).encode())
        for leaf in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(leaf, torch.Tensor):
                self.numbers += leaf.numel()
                self.digest.update(f"{tuple(leaf.shape)}{leaf.dtype}".encode())
        return out


def count_step(step: Callable[[], Any], key: str = "") -> tuple[Any, StepCost]:
    """``step()`` run once eagerly, counted: (its output, its ``StepCost``); ``key`` names what else the kernel
    depends on (dt, options) for the signature."""
    counter = _Counter()
    with counter:
        out = step()
    counter.digest.update(f"{key}|{torch.__version__}|{cache.machine()}".encode())
    return out, StepCost(counter.ops, counter.numbers, counter.digest.hexdigest()[:32])


def as_carry(cost: StepCost) -> dict[str, torch.Tensor]:
    """``cost`` as tensors, for a history's carry (a continued run reads it back with ``from_carry``)."""
    return {
        "route_ops": torch.tensor(cost.ops, dtype=torch.int64),
        "route_numbers": torch.tensor(cost.numbers, dtype=torch.int64),
        "route_signature": torch.tensor(list(bytes.fromhex(cost.signature)), dtype=torch.uint8),
    }


def from_carry(carry: dict | None) -> StepCost | None:
    """The ``StepCost`` a history's carry holds (``as_carry``), or None."""
    if not carry or not all(name in carry for name in ("route_ops", "route_numbers", "route_signature")):
        return None
    signature = bytes(carry["route_signature"].to(torch.uint8).tolist()).hex()
    return StepCost(int(carry["route_ops"]), int(carry["route_numbers"]), signature)


def kernel_events() -> int:
    """The kernels this process has compiled or loaded so far (``cache.events``)."""
    events = cache.events()
    return events["compiles"] + events["loads"]


def _marker(signature: str) -> Any:
    return cache.cache_dir() / "routes" / signature


def on_disk(cost: StepCost) -> bool:
    """Whether a compiled run of a step with this signature left its kernel in the cache (``mark_built``)."""
    return _marker(cost.signature).is_file()


def mark_built(cost: StepCost) -> None:
    """Leave the marker of ``on_disk`` (best effort: a read-only cache only loses the shortcut)."""
    path = _marker(cost.signature)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        pass


def _spent_file(signature: str) -> Any:
    return cache.cache_dir() / "routes" / f"{signature}.eager"


def eager_spent(cost: StepCost) -> int:
    """The steps that "auto" runs of a step with this signature kept eager in this cache (``spend_eager``)."""
    try:
        return max(int(_spent_file(cost.signature).read_text()), 0)
    except (OSError, ValueError):
        return 0


def spend_eager(cost: StepCost, steps: int) -> None:
    """Add ``steps`` to ``eager_spent`` (best effort; processes racing may lose a count, never the cache)."""
    path = _spent_file(cost.signature)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(str(eager_spent(cost) + steps))
        os.replace(temporary, path)
    except OSError:
        pass


def compiler_set_up() -> bool:
    """Whether inductor was set up in the caches a compile would use (a compile there before)."""
    return _compat.compiler_set_up(cache.cache_dir())


def estimates(cost: StepCost, steps: int, warm: bool, set_up: bool = True) -> tuple[float, float]:
    """(eager seconds, compiled seconds) of ``steps`` steps by the rule (see the module docstring)."""
    eager_step = OP_SECONDS * cost.ops + NUMBER_SECONDS * cost.numbers
    compiled_step = COMPILED_NUMBER_SECONDS * cost.numbers
    build = LOAD_SECONDS if warm else COMPILE_SECONDS + COMPILE_SECONDS_PER_OP * cost.ops
    if not (warm or set_up):
        build += SETUP_SECONDS
    return steps * eager_step, TRACE_SECONDS + build + steps * compiled_step


def choose(cost: StepCost, steps: int, taken: int, warm: bool, set_up: bool = True, spent: int = 0) -> Route:
    """The rule: compiled iff S (E - K) > C, S = ``steps`` + max(CONTINUED_WEIGHT x ``taken``, ``spent``);
    ``taken``: the steps of the run before this call; ``spent``: the eager steps of earlier "auto" runs of this
    step in this cache; ``warm``: a kernel of this step is on disk; ``set_up``: inductor was set up here."""
    weighted = steps + max(CONTINUED_WEIGHT * taken, spent)
    eager_s, compiled_s = estimates(cost, weighted, warm, set_up)
    on = "kernel on disk" if warm else ("no kernel on disk" if set_up else "no kernel on disk, compiler not set up")
    counted = f"{cost.ops} ATen calls a step, {weighted} steps weighed, {on}"
    if compiled_s < eager_s:
        return Route(
            True, f"{counted}: about {compiled_s:.3g} s compiled against {eager_s:.3g} s eager", eager_s, compiled_s
        )
    return Route(
        False, f"{counted}: about {eager_s:.3g} s eager against {compiled_s:.3g} s compiled", eager_s, compiled_s
    )


def fixed(compiled: bool) -> Route:
    """The route of ``compile=True`` or ``False``."""
    return Route(compiled, f"compile={compiled}")


__all__ = [
    "COMPILED_NUMBER_SECONDS",
    "COMPILE_SECONDS",
    "COMPILE_SECONDS_PER_OP",
    "CONTINUED_WEIGHT",
    "LOAD_SECONDS",
    "NUMBER_SECONDS",
    "OP_SECONDS",
    "SETUP_SECONDS",
    "TRACE_SECONDS",
    "Route",
    "StepCost",
    "as_carry",
    "choose",
    "compiler_set_up",
    "count_step",
    "eager_spent",
    "estimates",
    "fixed",
    "from_carry",
    "kernel_events",
    "mark_built",
    "on_disk",
    "spend_eager",
]
