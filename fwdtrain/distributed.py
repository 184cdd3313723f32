"""Particles across processes with torch.distributed (gloo on CPU, nccl on CUDA).

Rank r of R simulates its own N_r particles with its own noise stream; every rank
holds the same theta, and the gradient used in the update is the particle-weighted
mean over the whole group,

    G_n = sum_r N_r Gbar_n^r / sum_r N_r,     Gbar_n^r = (1/N_r) sum_i D c(X_n^{r,i}),

all-reduced every step. So R ranks with N particles each are the single-process
algorithm with R N particles, driven by the ranks' noise streams concatenated along
the particle axis (rank 0's particles first).

Pieces (each usable on its own, e.g. inside ``fwdtrain.run``):
  ``init_process_group``  join the group torchrun describes in the environment, with a timeout;
  ``gradient_mean``       the ``reduce`` hook for ``fwdtrain.step.advance``;
  ``rank_seed``           a per-rank seed derived from (seed, rank);
  ``check_group``         one collective that stops every rank if any rank failed,
                          diverged or holds a different theta;
  ``distributed_run``     the loop over ``advance`` with all of the above;
  ``launch``              run a function in R local processes (tests, benchmarks).

Under ``torchrun --nproc-per-node 2 train.py``, with train.py::

    from fwdtrain import distributed as D
    D.init_process_group(timeout=60)                  # gloo on CPU, nccl for CUDA inputs
    state = ft.init(sde, D.broadcast(theta), x0, particles=N)
    state, history = D.distributed_run(sde, state, steps, dt, lr, seed=0, verbose=True)
    if D.is_main():
        ...                                           # print, save, plot once
    D.destroy_process_group()

or in one's own loop: ``advance(..., reduce=D.gradient_mean(weight=N))`` with noise from
``torch.Generator().manual_seed(D.rank_seed(seed))`` and ``D.check_group(state)`` every k steps.
"""

from __future__ import annotations

import datetime
import math
import os
import pickle
import socket
import time
import traceback
from queue import Empty
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch
import torch.distributed as dist

from . import _checks
from ._tree import leaves, squared_norm, tree_map
from .driver import History
from .problem import SDE
from .sensitivity import Mode
from .state import State, noise_dim
from .step import LearningRate, _resolve_mode, advance, check_step_inputs, learning_rate

DEFAULT_TIMEOUT = 60.0  # seconds; for rendezvous and for every collective


class GroupError(RuntimeError):
    """Raised on every rank when the group cannot go on.

    reason: "failed" (a rank raised), "non-finite" (a rank's state is NaN/inf),
    "theta-mismatch" (ranks hold different theta), "out-of-step" (ranks are at
    different times) or "lost" (a collective failed: a rank exited or hung past the timeout).
    ranks: the ranks at fault (empty when unknown); step: the step count at the
    check (None when unknown); state: this rank's last state that passed a check
    (None before the first check).
    """

    def __init__(self, message: str, *, reason: str, ranks: Sequence[int] = (), step: int | None = None,
                 state: State | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.ranks = tuple(ranks)
        self.step = step
        self.state = state


# ---------------------------------------------------------------------------------------------
# The process group


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank: from the process group, else torchrun's RANK, else 0."""
    if is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", 0))


def world_size() -> int:
    """The number of processes R: from the process group, else torchrun's WORLD_SIZE, else 1."""
    if is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", 1))


_this_rank = rank


def is_main() -> bool:
    """True on rank 0 (and in a single process): the one that prints, writes and plots."""
    return rank() == 0


def print_main(*args: Any, **kwargs: Any) -> None:
    """``print`` on rank 0 only."""
    if is_main():
        print(*args, **kwargs)


def backend_for(device: torch.device | str | None = None) -> str:
    """The backend for tensors on ``device``: gloo for CPU; for CUDA, nccl (gloo kept for CPU tensors).

    With no device, CUDA is used when it is available.
    """
    if device is None:
        cuda = torch.cuda.is_available()
    else:
        cuda = torch.device(device).type == "cuda"
    return "cpu:gloo,cuda:nccl" if cuda else "gloo"


def local_device() -> torch.device:
    """cuda:LOCAL_RANK when CUDA is available, else cpu: where this rank's inputs usually belong."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    return torch.device("cpu")


_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def init_process_group(backend: str | None = None, *, device: torch.device | str | None = None,
                       timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Join the process group that torchrun describes in RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.

    ``timeout`` (seconds) bounds the rendezvous and every later collective, so a
    rank that never arrives or hangs makes the others raise instead of waiting
    forever. The backend follows ``device`` (see ``backend_for``); for a CUDA
    device this process is bound to it (cuda:LOCAL_RANK when no index is given).
    Returns True when a group is initialised (already or now), False when the
    environment names no group (a plain single process).
    """
    if is_initialized():
        return True
    if not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        return False
    missing = [name for name in _ENV if name not in os.environ]
    if missing:
        raise ValueError(f"the environment describes a process group only in part: {', '.join(missing)} "
                         f"missing; launch with torchrun, or set all of {', '.join(_ENV)}")
    try:
        r, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except ValueError as error:
        raise ValueError(f"RANK and WORLD_SIZE must be integers, got RANK={os.environ['RANK']!r}, "
                         f"WORLD_SIZE={os.environ['WORLD_SIZE']!r}") from error
    if not 0 <= r < size:
        raise ValueError(f"need 0 <= RANK < WORLD_SIZE, got RANK={r}, WORLD_SIZE={size}")
    if device is not None and torch.device(device).type == "cuda":
        device = torch.device(device)
        torch.cuda.set_device(device if device.index is not None else int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend=backend or backend_for(device), init_method="env://", rank=r,
                            world_size=size, timeout=datetime.timedelta(seconds=timeout))
    return True


def destroy_process_group() -> None:
    """Leave the process group, if any."""
    if is_initialized():
        dist.destroy_process_group()


def _all_reduce(tensor: torch.Tensor, what: str, step: int | None = None, state: State | None = None) -> None:
    """In-place all_reduce (sum) with a GroupError when the group is broken."""
    try:
        dist.all_reduce(tensor)
    except RuntimeError as error:
        raise GroupError(
            f"rank {rank()}: the all_reduce of {what} failed; another rank has probably failed, exited or "
            f"hung past the process group's timeout. Check the other ranks' output. ({error})",
            reason="lost", step=step, state=state) from error


def broadcast(tree: Any, src: int = 0) -> Any:
    """A copy of rank ``src``'s pytree of tensors on every rank (e.g. theta, to start from one model)."""
    copies = tree_map(lambda leaf: leaf.detach().clone(), tree)
    if is_initialized() and dist.get_world_size() > 1:
        for leaf in leaves(copies):
            dist.broadcast(leaf, src)
    return copies


def group_mean(tree: Any, weight: float | None = None, *, what: str = "a group mean") -> Any:
    """sum_r w_r tree_r / sum_r w_r over the group, leaf by leaf, with one all_reduce of all leaves.

    ``weight`` is this rank's w_r (e.g. its particle count; 1 when None). Without a
    process group, ``tree`` itself. Every rank must call it with the same structure.
    """
    if not is_initialized():
        return tree
    parts = leaves(tree)
    w = 1.0 if weight is None else float(weight)
    flat = torch.cat([part.reshape(-1) * w for part in parts]
                     + [torch.full((1,), w, dtype=parts[0].dtype, device=parts[0].device)])
    _all_reduce(flat, what)
    values = (flat[:-1] / flat[-1]).split([part.numel() for part in parts])
    means = iter(value.reshape(part.shape) for value, part in zip(values, parts))
    return tree_map(lambda _: next(means), tree)


def gather_to_main(obj: Any) -> list[Any] | None:
    """[obj of rank 0, ..., obj of rank R-1] on rank 0, None elsewhere (any picklable object, e.g.
    each rank's particles and generator state for a checkpoint that rank 0 writes). [obj] without a group."""
    if not is_initialized():
        return [obj]
    gathered = [None] * dist.get_world_size() if is_main() else None
    try:
        dist.gather_object(obj, gathered, dst=0)
    except RuntimeError as error:
        raise GroupError(f"rank {rank()}: gathering objects on rank 0 failed ({error})", reason="lost") from error
    return gathered


# ---------------------------------------------------------------------------------------------
# Noise and the gradient hook


def rank_seed(seed: int, rank: int | None = None) -> int:
    """A 63-bit seed for ``rank``'s noise (default: this process's rank), from SeedSequence(seed, spawn_key=(rank,)).

    Deterministic, different for every rank, and independent of the world size,
    so rank r's stream is the same in a group of 2 or of 8.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    r = _this_rank() if rank is None else rank
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0:
        raise ValueError(f"rank must be a non-negative integer, got {r!r}")
    high, low = np.random.SeedSequence(int(seed), spawn_key=(int(r),)).generate_state(2, np.uint32)
    return ((int(high) << 32) | int(low)) & (2**63 - 1)


def rank_generator(seed: int, device: torch.device | str = "cpu", rank: int | None = None) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``rank_seed(seed, rank)``."""
    return torch.Generator(device=device).manual_seed(rank_seed(seed, rank))


NOISE_BLOCK = 64  # steps per generator call; part of the definition of a rank's noise stream


def brownian_block(generator: torch.Generator, steps: int, particles: int, m: int, dt: float,
                   dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(steps, N, m) Brownian increments N(0, dt) from one generator call."""
    return torch.randn((steps, particles, m), generator=generator, dtype=dtype, device=device) * math.sqrt(dt)


class GradientMean:
    """The ``reduce`` hook for ``advance``: the group's mean of the particle-mean gradient.

    every = 1: each step, G = sum_r w_r g_r / sum_r w_r with one all_reduce of p + 1
    numbers (w_r = ``weight``, this rank's particle count; the plain mean over ranks
    when None). Exactly the single-process gradient over all the ranks' particles.

    every = k > 1 (gradient accumulation, theta held over windows of k steps): the
    hook returns 0 for k - 1 steps, so theta stays put, and at the k-th step the
    group mean of the window's summed gradients, so that

        theta_{s+k} = theta_s - alpha(t_{s+k-1}) h sum_{j=s}^{s+k-1} G_j,

    every G_j evaluated at the held theta_s; one all_reduce per k steps. Theta is
    identical on every rank at every step. It is the forward-propagation
    algorithm with theta updated every k h time units instead of every h: for
    constant alpha the same drift to first order in alpha k h, with an O(alpha k h)
    lag (the continuous-time limit k h -> 0 is unchanged); with a schedule the
    window's sum is applied with alpha at the window's last step. Windows count
    calls from the hook's creation, so resume from a checkpoint at a multiple of k.

    Without a process group (a single process) the mean is over this process alone.
    ``calls`` and ``collectives`` count calls and all_reduces made.
    """

    def __init__(self, every: int = 1, *, weight: float | None = None) -> None:
        self.every = _checks.check_count(every, "every")
        if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float))
                                   or not math.isfinite(weight) or weight <= 0):
            raise ValueError(f"weight must be a positive number (this rank's particle count) or None, got {weight!r}")
        self.weight = weight
        self.calls = 0
        self.collectives = 0
        self._window: Any = None

    def __call__(self, gradient: Any) -> Any:
        self.calls += 1
        if self.every == 1:
            return self._group_mean(gradient)
        self._window = gradient if self._window is None else tree_map(torch.add, self._window, gradient)
        if self.calls % self.every:
            return tree_map(torch.zeros_like, gradient)
        window, self._window = self._window, None
        return self._group_mean(window)

    def _group_mean(self, tree: Any) -> Any:
        self.collectives += int(is_initialized())
        return group_mean(tree, self.weight, what="the gradient")


def gradient_mean(every: int = 1, *, weight: float | None = None) -> GradientMean:
    """``reduce=`` for ``advance`` / ``run``: the group mean of the gradient (see ``GradientMean``)."""
    return GradientMean(every, weight=weight)


# ---------------------------------------------------------------------------------------------
# The group check: one collective that every rank makes at the same steps

# status bits a rank reports at a check
OK, NON_FINITE_PARTICLES, NON_FINITE_THETA, FAILED = 0, 1, 2, 4
_FIELDS = 7  # code, t, particles, weighted cost sum, weight of the cost, theta checksums (2)


def _theta_checksums(theta: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """sum theta_i and sum theta_i (i + 1) / p over the flattened theta, in float64."""
    flat = torch.cat([leaf.reshape(-1).to(torch.float64) for leaf in leaves(theta)])
    weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64, device=flat.device) / flat.numel()
    return flat.sum(), (flat * weights).sum()


def _finite_code(state: State) -> int:
    particles = all(bool(torch.isfinite(leaf).all()) for leaf in leaves((state.x, state.x_tilde)))
    theta = all(bool(torch.isfinite(leaf).all()) for leaf in leaves(state.theta))
    return (0 if particles else NON_FINITE_PARTICLES) | (0 if theta else NON_FINITE_THETA)


class GroupStatus(NamedTuple):
    """What a check learned about the whole group: the particle-weighted mean cost since the last check."""

    cost: float


def _exchange(state: State, code: int, cost_sum: torch.Tensor | float, cost_count: float,
              step: int | None, last_good: State | None) -> torch.Tensor:
    """Every rank writes its row of a (R, fields) table; one all_reduce (sum) gives everyone all rows."""
    theta0 = leaves(state.theta)[0]
    size = world_size() if is_initialized() else 1
    table = torch.zeros((size, _FIELDS), dtype=torch.float64, device=theta0.device)
    own = rank() if is_initialized() else 0
    checksum_a, checksum_b = _theta_checksums(state.theta)
    row = torch.stack([
        torch.tensor(float(code), dtype=torch.float64, device=theta0.device),
        state.t.to(torch.float64).reshape(()),
        torch.tensor(float(state.particles), dtype=torch.float64, device=theta0.device),
        torch.as_tensor(cost_sum, dtype=torch.float64, device=theta0.device).reshape(()) * state.particles,
        torch.tensor(float(cost_count * state.particles), dtype=torch.float64, device=theta0.device),
        checksum_a, checksum_b,
    ])
    table[own] = row
    if is_initialized():
        _all_reduce(table, "the group check", step, last_good)
    return table.cpu()


def _describe(code: int) -> str:
    parts = [text for bit, text in ((FAILED, "raised an exception (see its output)"),
                                    (NON_FINITE_PARTICLES, "has NaN/inf in x or x_tilde"),
                                    (NON_FINITE_THETA, "has NaN/inf in theta")) if code & bit]
    return " and ".join(parts)


def _judge(table: torch.Tensor, step: int | None, last_good: State | None) -> GroupStatus:
    where = f" at step {step}" if step is not None else ""
    codes = table[:, 0].long().tolist()
    bad = [r for r, c in enumerate(codes) if c != OK]
    if bad:
        reason = "failed" if any(codes[r] & FAILED for r in bad) else "non-finite"
        detail = "; ".join(f"rank {r} {_describe(codes[r])}" for r in bad)
        raise GroupError(f"the process group stops{where}: {detail}", reason=reason, ranks=bad, step=step,
                         state=last_good)
    times = table[:, 1]
    if not bool((times == times[0]).all()):
        raise GroupError(f"the ranks are out of step{where}: times {times.tolist()}; every rank must run "
                         f"the same steps with the same dt", reason="out-of-step",
                         ranks=[r for r in range(len(times)) if times[r] != times[0]], step=step, state=last_good)
    sums = table[:, 5:7]
    differ = [r for r in range(len(sums)) if not bool((sums[r] == sums[0]).all())]
    if differ:
        raise GroupError(f"theta differs across ranks{where}: checksums {sums[:, 0].tolist()}; ranks {differ} "
                         f"disagree with rank 0. Start every rank from the same theta "
                         f"(fwdtrain.distributed.broadcast) and reduce every gradient with gradient_mean",
                         reason="theta-mismatch", ranks=differ, step=step, state=last_good)
    weight = float(table[:, 4].sum())
    return GroupStatus(cost=float(table[:, 3].sum()) / weight if weight > 0 else math.nan)


def check_group(state: State, step: int | None = None, *, cost: torch.Tensor | float = 0.0,
                cost_steps: int = 0, failed: bool = False, last_good: State | None = None) -> GroupStatus:
    """One collective that every rank must make at the same step; raises ``GroupError`` on every rank if

    any rank is ``failed`` or holds a non-finite state, the ranks' times differ, or
    their theta checksums differ (theta must be bitwise equal). ``cost`` /
    ``cost_steps`` are this rank's summed particle-mean cost over ``cost_steps``
    steps, and the result carries the group's particle-weighted mean. Usable as a
    callback ``lambda state: check_group(state)`` in any loop that runs in lockstep.
    """
    code = FAILED if failed else _finite_code(state)
    table = _exchange(state, code, cost, float(cost_steps), step, last_good)
    return _judge(table, step, last_good if last_good is not None else (state if code == OK else None))


# ---------------------------------------------------------------------------------------------
# The loop


def distributed_run(
    sde: SDE,
    state: State,
    steps: int,
    dt: float,
    lr: LearningRate,
    seed: int = 0,
    *,
    record_every: int = 100,
    mode: Mode = "auto",
    every: int = 1,
    check_every: int = 100,
    verbose: bool = False,
) -> tuple[State, History]:
    """``steps`` steps of the algorithm with this rank's particles and the group's theta.

    Every rank calls it with its own ``state`` (its particles, the same theta);
    rank r draws its noise from ``rank_generator(seed, device, r)`` in blocks of
    ``NOISE_BLOCK`` steps (a stream that does not depend on ``steps``), and the
    gradient is reduced by ``gradient_mean(every, weight=particles)``. Every ``check_every`` steps (and at steps 0 and
    ``steps``) one ``check_group`` collective confirms that every rank is finite,
    in step and holds the same theta; if not, or if a rank raised, every rank
    raises ``GroupError`` there (the rank that raised re-raises its own error),
    carrying this rank's last checked state. ``verbose`` prints a line per check
    on rank 0 only. Works without a process group (a single process).

    Returns this rank's final ``State`` and the group's ``History`` (the same on
    every rank; costs are means over all ranks' particles; with ``every`` > 1,
    grad_norm is the norm of the applied direction: 0 inside a window, the
    window's sum at its last step).
    """
    steps = _checks.check_count(steps, "steps", minimum=0)
    record_every = _checks.check_count(record_every, "record_every")
    check_every = _checks.check_count(check_every, "check_every")
    if world_size() > 1 and not is_initialized():
        raise ValueError(f"WORLD_SIZE is {world_size()} but this process has not joined the group: call "
                         f"fwdtrain.distributed.init_process_group() first (each rank would train alone)")
    try:
        m = noise_dim(sde, state.theta, state.x)
        dtype, device = state.x.dtype, state.x.device
        check_step_inputs(sde, state, torch.zeros((state.particles, m), dtype=dtype, device=device), dt, lr)
        resolved = _resolve_mode(mode, state, m)
        reduce = gradient_mean(every, weight=state.particles)
        generator = rank_generator(seed, device)
    except Exception:
        _report_failure(state, 0)  # bad input on this rank only: the others stop at the first check too
        raise
    check_group(state, 0)
    last_good, started = state, time.perf_counter()
    records: dict[str, list] = {"step": [], "t": [], "cost": [], "grad_norm": [], "theta": []}
    cost_sum, cost_count = torch.zeros((), dtype=dtype, device=device), 0
    check_sum, check_count = torch.zeros((), dtype=dtype, device=device), 0
    n = 0
    try:
        while n < steps:
            block = brownian_block(generator, NOISE_BLOCK, state.particles, m, dt, dtype, device)
            for dw in block[: steps - n]:
                state, info = advance(sde, state, dw, dt, learning_rate(lr, state.t), resolved, reduce=reduce)
                n += 1
                cost_sum, cost_count = cost_sum + info.cost, cost_count + 1
                check_sum, check_count = check_sum + info.cost, check_count + 1
                if n % record_every == 0 or n == steps:
                    records["step"].append(n)
                    records["t"].append(state.t)
                    records["cost"].append(cost_sum / cost_count)
                    records["grad_norm"].append(squared_norm(info.gradient).sqrt())
                    records["theta"].append(state.theta)
                    cost_sum, cost_count = torch.zeros_like(cost_sum), 0
                if n % check_every == 0 or n == steps:
                    status = check_group(state, n, cost=check_sum, cost_steps=check_count, last_good=last_good)
                    last_good = state
                    check_sum, check_count = torch.zeros_like(check_sum), 0
                    if verbose:
                        print_main(f"step {n:>8d}  t {float(state.t):10.3f}  cost {status.cost:.5f}  "
                                   f"|G| {float(squared_norm(info.gradient).sqrt()):.3e}  "
                                   f"{n / (time.perf_counter() - started):8.1f} steps/s  ranks {world_size()}")
    except GroupError:
        raise
    except Exception as error:
        _fail_at_next_check(error, state, n, steps, check_every, reduce, last_good)
    return state, _history(records, state, dtype)


def _fail_at_next_check(error: Exception, state: State, n: int, steps: int, check_every: int,
                        reduce: GradientMean, last_good: State) -> None:
    """This rank raised during step n + 1: make the collectives the others make up to their next check
    (zero gradients), then report the failure there, so that no rank is left waiting; re-raise."""
    next_check = min(steps, (n // check_every + 1) * check_every)
    zeros = tree_map(torch.zeros_like, state.theta)
    try:
        while reduce.calls < next_check:
            reduce(zeros)
    except GroupError:
        raise error
    _report_failure(state, next_check, last_good)
    raise error


def _report_failure(state: Any, step: int, last_good: State | None = None) -> None:
    """Take part in the check at ``step`` as a failed rank (the caller then raises its own error)."""
    if not isinstance(state, State):
        return  # nothing to report with; the others stop when this process exits or at the timeout
    try:
        check_group(state, step, failed=True, last_good=last_good)
    except GroupError:
        pass


def _history(records: dict[str, list], state: State, dtype: torch.dtype) -> History:
    """The group's History: record costs weighted by particles over every rank (one all_reduce)."""
    device = state.x.device
    cost = torch.stack(records["cost"]) if records["cost"] else torch.zeros(0, dtype=dtype, device=device)
    if records["cost"]:
        cost = group_mean(cost, state.particles, what="the cost history")
    return History(
        step=torch.tensor(records["step"], dtype=torch.long),
        t=torch.stack(records["t"]) if records["t"] else torch.zeros(0, dtype=dtype, device=device),
        cost=cost,
        grad_norm=torch.stack(records["grad_norm"]) if records["grad_norm"]
        else torch.zeros(0, dtype=dtype, device=device),
        theta=tree_map(lambda *xs: torch.stack(xs), *records["theta"]) if records["theta"]
        else tree_map(lambda leaf: leaf[None][:0], state.theta),
    )


# ---------------------------------------------------------------------------------------------
# Local launcher


class LaunchError(RuntimeError):
    """Some local process raised, exited without a result, or overran.

    ``errors`` maps rank -> message (a traceback), ``results`` rank -> result for the ranks that finished.
    """

    def __init__(self, message: str, errors: dict[int, str], results: dict[int, Any]) -> None:
        super().__init__(message)
        self.errors = errors
        self.results = results


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _child(fn: Callable[..., Any], r: int, size: int, port: int, args: tuple, queue: Any,
           backend: str | None, timeout: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(size),
                      LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(size))
    try:
        init_process_group(backend, device=local_device() if torch.cuda.is_available() else None, timeout=timeout)
        # plain pickle: tensors by value (torch's ForkingPickler would share memory owned by this process)
        queue.put((r, True, pickle.dumps(fn(*args))))
    except BaseException:  # report everything, including SystemExit, to the parent
        queue.put((r, False, traceback.format_exc()))
    finally:
        destroy_process_group()


def launch(fn: Callable[..., Any], world_size: int, args: tuple = (), *, timeout: float = 120.0,
           group_timeout: float = 30.0, backend: str | None = None) -> list[Any]:
    """Run ``fn(*args)`` in ``world_size`` local processes joined into one process group.

    The processes rendezvous on 127.0.0.1 at a free port through the same
    environment variables torchrun sets, with ``group_timeout`` on the group.
    ``fn`` must be picklable (defined at module level); processes are forked from
    a server that has imported torch once ("forkserver"), so later launches are
    quick. Returns [result on rank 0, ..., rank R-1]. Raises ``LaunchError`` when
    a rank raises or exits without a result, and kills every process still alive
    after ``timeout`` seconds.
    """
    import multiprocessing

    size = _checks.check_count(world_size, "world_size")
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(["torch", "torch._dynamo", "fwdtrain"])  # torch.func imports dynamo
    queue = context.Queue()
    port = _free_port()
    processes = [context.Process(target=_child, args=(fn, r, size, port, args, queue, backend, group_timeout),
                                 daemon=True) for r in range(size)]
    for process in processes:
        process.start()
    deadline = time.monotonic() + timeout
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    try:
        while len(results) + len(errors) < size and time.monotonic() < deadline:
            try:
                r, ok, payload = queue.get(timeout=0.05)
                if ok:
                    results[r] = pickle.loads(payload)
                else:
                    errors[r] = payload
            except Empty:  # look for ranks that died without a word
                for r, process in enumerate(processes):
                    if (process.exitcode is not None and r not in results and r not in errors
                            and queue.empty()):
                        errors[r] = f"exited with code {process.exitcode} without a result"
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
    finally:
        alive = [r for r, process in enumerate(processes) if process.is_alive()]
        for r in alive:
            processes[r].kill()
            processes[r].join(5)
            errors.setdefault(r, f"still running after {timeout} s; killed")
        queue.close()
    if errors:
        detail = "\n".join(f"--- rank {r}:\n{errors[r]}" for r in sorted(errors))
        raise LaunchError(f"{len(errors)} of {size} processes failed:\n{detail}", errors, results)
    return [results[r] for r in range(size)]


__all__ = [
    "GroupError", "GroupStatus", "GradientMean", "LaunchError", "NOISE_BLOCK", "DEFAULT_TIMEOUT",
    "rank", "world_size", "is_main", "is_initialized", "print_main", "backend_for", "local_device",
    "init_process_group", "destroy_process_group", "broadcast", "group_mean", "gather_to_main",
    "rank_seed", "rank_generator",
    "brownian_block", "gradient_mean", "check_group", "distributed_run", "launch",
]
