"""Ensembles: E independent experiments stepped as one batched computation.

A member is an ordinary training run: its own theta0, x0, noise seed and learning rate.
The ensemble's state is the same ``State`` NamedTuple with a leading member axis E on every
leaf (``t`` included), and its step is ``torch.func.vmap`` of the member's step:

    state  = (x (E, N, d), x_tilde (E, N, d, *s), theta (E, *s), t (E,))
    advance_E(state, dW (E, N, m), alpha (E,)) = vmap(advance)(state, dW, alpha)

Members never interact: member e of the ensemble is the run of its theta0, x0, lr and seed
alone, with the noise ``BrownianNoise(seed_e)`` a single run draws. Batching changes only
the order in which BLAS sums a matrix product (mm for one run, bmm for E): a problem with
a matrix product (an MLP control) agrees with the single runs to a few ulp per step, an
elementwise problem bitwise (tests/test_ensemble.py).

``Ensemble(problem, E)`` is a ``fwdtrain.problems.Trainable`` whose member hooks (``within``,
``freeze``, ``gradient_norm``, ``schedule``, ``noise_source``) describe E members, so
``fwdtrain.run``, compilation, checkpoints and resume work unchanged. At a check
a member that is non-finite (or beyond ``bound``) is frozen at its state of the last passed
check (``freeze``: ``torch.where`` per member, no branch in the step) and flagged in
``History.diverged`` / ``History.frozen_at``; the others go on. ``run`` raises
``DivergenceError`` only when every member has diverged.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.func import vmap

from ..core import _checks
from ..core._tree import leaves, leaves_with_paths, squared_norm, tree_map
from ..core.history import FIELDS, History
from ..core.noise import BrownianNoise, NoiseLike, stream_at
from ..core.schedules import Schedule
from ..core.solvers import Solver
from ..core.state import State
from ..core.state import init as _init_member
from ..core.step import StepInfo
from ..optim import GradientTransformation
from .cost import as_trainable
from .trainable import Trainable

Tree = Any


# ---- pytrees with a member axis ----


def stack(trees: Sequence[Tree]) -> Tree:
    """The pytrees ``trees`` (same structure) stacked along a new leading member axis."""
    if len(trees) < 1:
        raise ValueError("an ensemble needs at least one member, got none")
    return tree_map(lambda *parts: torch.stack(parts), *trees)


def size(tree: Tree) -> int:
    """E, the leading member axis shared by every leaf; ValueError naming the leaves if they disagree."""
    pairs = leaves_with_paths(tree)
    sizes = {leaf.shape[0] if leaf.ndim else None for _, leaf in pairs}
    if len(sizes) != 1 or None in sizes:
        shapes = ", ".join(f"{path}: {tuple(leaf.shape)}" for path, leaf in pairs[:8])
        raise ValueError(f"an ensemble needs one leading member axis E on every leaf (t included), got {shapes}")
    return int(sizes.pop())  # type: ignore[arg-type]


def member(tree: Tree, index: int) -> Tree:
    """Member ``index`` of an ensemble pytree (every leaf indexed on its leading axis)."""
    return tree_map(lambda leaf: leaf[index], tree)


def unstack(tree: Tree) -> list[Tree]:
    """The members of an ensemble pytree, as a list."""
    return [member(tree, e) for e in range(size(tree))]


def init(
    sde: Any,
    theta: Tree,
    x0: torch.Tensor,
    particles: int | None = None,
    *,
    members: int | None = None,
    stacked: bool = False,
    **options: Any,
) -> State:
    """The ensemble's state at t = 0: ``fwdtrain.init`` per member, stacked on a leading axis E.

    Args:
        sde: The problem of every member.
        theta: Shared parameters (copied E times), or with ``stacked=True`` leaves with a leading member
            axis E (theta0_e per member).
        x0: (d,) shared; with ``stacked=True`` also (E, d), one per member.
        particles: N per member.
        members: Keyword only. E; required unless ``stacked=True`` (then, if given, it must equal E).
        stacked: Keyword only. Whether theta (and possibly x0) carry the member axis.
        **options: ``fwdtrain.init``'s keywords, per member: ``optimizer=``, ``average_from=``,
            ``allow_low_precision=``.

    Returns:
        The ensemble's ``State``: every leaf with a leading axis E, t of shape (E,).

    Raises:
        ValueError: No ``members`` for shared theta, sizes that disagree, or what ``fwdtrain.init`` raises.
    """
    if not stacked:
        if members is None:
            raise ValueError("ensemble.init needs members=E (or stacked=True with a member axis on theta)")
        count = _checks.check_count(members, "members (the ensemble size E)")
        return stack([_init_member(sde, theta, x0, particles, **options) for _ in range(count)])
    count = size(theta)
    if members is not None and _checks.check_count(members, "members (the ensemble size E)") != count:
        raise ValueError(f"members={members} but theta's leaves have a member axis of {count}")
    if not isinstance(x0, torch.Tensor) or x0.ndim not in (1, 2) or (x0.ndim == 2 and x0.shape[0] != count):
        raise ValueError(
            f"x0 must be a shared (d,) or one row per member ({count}, d), "
            f"got {getattr(x0, 'shape', type(x0).__name__)}"
        )
    return stack(
        [_init_member(sde, member(theta, e), x0 if x0.ndim == 1 else x0[e], particles, **options) for e in range(count)]
    )


def member_history(history: History, index: int) -> History:
    """Member ``index``'s own History: what its run alone would have recorded.

    Args:
        history: An ensemble's ``History`` (per-record fields (R, E)).
        index: The member e.

    Returns:
        A single run's ``History`` (per-record fields (R,)); with ``member(state, e)`` it continues with
        ``fwdtrain.run``.
    """
    per_record = {name: getattr(history, name)[:, index] for name in FIELDS[1:] if getattr(history, name) is not None}
    carry = history.carry
    if carry is not None:
        carry = {
            **carry,
            **{
                key: carry[key] if carry[key].ndim == 0 else carry[key][index]  # 0-d: before any step
                for key in ("cost_total", "window_total")
            },
        }
        noise = carry.get("noise")
        if noise is not None and EnsembleNoise.kind in noise:
            carry["noise"] = noise[EnsembleNoise.kind]["members"][index]
    theta_average = history.theta_average
    if theta_average is not None:
        theta_average = tree_map(lambda leaf: leaf[:, index], theta_average)
    return history._replace(
        **per_record,
        theta=tree_map(lambda leaf: leaf[:, index], history.theta),
        carry=carry,
        diverged=None,
        frozen_at=None,
        theta_average=theta_average,
    )


# ---- learning rates per member ----


class PerMember(NamedTuple):
    """A schedule with per-member parameters: ``alpha_e(t_e) = factory(**{k: params[k][e]})(t_e)``.

    ``PerMember(schedules.inverse_time, {"scale": torch.tensor([1., 5., 10.]), "offset": torch.full((3,), 20.)})``.
    Called on the members' clocks t (E,) it returns alpha (E,) (``vmap`` over the members).
    """

    factory: Callable[..., Callable[[torch.Tensor], Any]]
    params: dict

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        """alpha (..., E) on clocks t (..., E): member e's schedule on the last axis."""
        per_member = vmap(lambda ti, p: _as_rate(self.factory(**p)(ti), ti))
        rows = t.reshape(-1, t.shape[-1])
        return vmap(lambda row: per_member(row, self.params))(rows).reshape(t.shape)


def _as_rate(alpha: Any, t: torch.Tensor) -> torch.Tensor:
    return alpha if isinstance(alpha, torch.Tensor) else torch.as_tensor(alpha, dtype=t.dtype)


def rates(lr: Any, members: int) -> Any:
    """The ensemble's learning rate from what a user passes, for ``fwdtrain.run`` of an ``Ensemble``.

    A number or 0-d tensor: the same for every member. A sequence or (E,) tensor: one constant per
    member. A ``PerMember``: as it is. Any other schedule t -> alpha: the same schedule, evaluated on
    each member's clock (``vmap`` over t (E,)). Wrong lengths raise before anything is stepped.
    """
    if isinstance(lr, PerMember):
        if not callable(lr.factory) or not isinstance(lr.params, dict) or not lr.params:
            raise TypeError("PerMember(factory, params) needs a schedule factory and a non-empty dict of tensors")
        for name, value in lr.params.items():
            if not isinstance(value, torch.Tensor) or value.ndim == 0 or value.shape[0] != members:
                raise ValueError(
                    f"PerMember params[{name!r}] must be a tensor with a leading axis of {members} "
                    f"members, got {getattr(value, 'shape', type(value).__name__)}"
                )
        return lr
    if callable(lr):
        return _Shared(lr)
    if isinstance(lr, (list, tuple)):
        lr = torch.tensor([float(v) for v in lr], dtype=torch.float64)
    if isinstance(lr, torch.Tensor) and lr.ndim == 1:
        if lr.shape[0] != members:
            raise ValueError(
                f"a per-member learning rate needs {members} entries (one per member), got shape {tuple(lr.shape)}"
            )
        if not lr.is_floating_point():
            raise TypeError(f"per-member learning rates must be floating, got dtype {lr.dtype}")
        if _checks.is_concrete(lr) and not bool((torch.isfinite(lr) & (lr >= 0)).all()):
            raise ValueError(f"per-member learning rates must be finite and >= 0, got {lr.tolist()}")
        return lr
    _checks.check_lr(lr)
    return lr


class _Shared(NamedTuple):
    """One schedule for every member, on each member's own clock: alpha (E,) = vmap(schedule)(t (E,))."""

    schedule: Callable[[torch.Tensor], Any]

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return vmap(lambda ti: _as_rate(self.schedule(ti), ti))(t.reshape(-1)).reshape(t.shape)


# ---- noise ----


class EnsembleNoise:
    """One ``BrownianNoise`` per member, drawn together: ``draw(count) -> (count, E, N, m)``.

    Member e's increments are exactly those its source gives alone (same seed, same stream),
    so member e sees the noise of ``fwdtrain.run(..., seed=seeds[e])``.
    """

    kind = "ensemble"

    def __init__(self, sources: Sequence[BrownianNoise]) -> None:
        if len(sources) < 1:
            raise ValueError("an ensemble needs at least one noise source")
        self.sources = [source.copy() for source in sources]
        self.shape = (len(self.sources), *self.sources[0].shape)

    @classmethod
    def brownian(
        cls,
        seeds: Sequence[int],
        shape: tuple[int, int],
        dt: float,
        *,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> EnsembleNoise:
        """Member e draws ``BrownianNoise(shape, dt, seed=seeds[e])``: the stream of a run with that seed."""
        return cls([BrownianNoise(shape, dt, seed=int(seed), dtype=dtype, device=device) for seed in seeds])

    @property
    def position(self) -> int:
        return self.sources[0].position

    def draw(self, count: int) -> torch.Tensor:
        return torch.stack([source.draw(count) for source in self.sources], dim=1)

    def state_dict(self, position: int | None = None) -> dict[str, Any]:
        """``{"ensemble": {"members": [member e's BrownianNoise.state_dict]}}`` at ``position``."""
        return {self.kind: {"members": [source.state_dict(position) for source in self.sources]}}

    @classmethod
    def from_state_dict(
        cls, data: dict[str, Any], dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> EnsembleNoise:
        if not isinstance(data, dict) or cls.kind not in data:
            kinds = ", ".join(data) if isinstance(data, dict) else type(data).__name__
            raise ValueError(
                f"the history's noise is not an ensemble's (it holds {kinds}); continue an ensemble "
                f"with the history its run returned"
            )
        return cls([BrownianNoise.from_state_dict(item, dtype, device) for item in data[cls.kind]["members"]])

    def copy(self) -> EnsembleNoise:
        return EnsembleNoise(self.sources)

    def seek(self, position: int, continued: bool) -> EnsembleNoise:
        """E streams: this source, if it is at step ``position``."""
        return stream_at(self, position, continued)

    def rewound(self, saved: dict, dtype: torch.dtype, device: torch.device) -> None:
        """Not rewound: a failed check of an ensemble freezes its members instead."""
        return None

    def __repr__(self) -> str:
        return f"EnsembleNoise({len(self.sources)} members, position={self.position})"


# ---- the Trainable ----


def _per_member(leaf: torch.Tensor) -> torch.Tensor:
    """max |.| over everything but the member axis: (E, ...) -> (E,)."""
    return leaf.detach().abs().reshape(leaf.shape[0], -1).amax(1)


@dataclass(frozen=True)
class Ensemble(Trainable):
    """E independent runs of ``problem`` as one ``Trainable``: its step is ``vmap`` of the member's step.

    ``seeds`` (optional, E ints): the members' noise seeds; None means seed, seed + 1, ..., seed + E - 1
    for the integer ``noise`` that ``run`` is given (or ``noise=[s_0, ..., s_{E-1}]``).
    """

    problem: Any
    size: int
    seeds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _checks.check_count(self.size, "ensemble size E")
        if self.seeds is not None:
            if len(self.seeds) != self.size or not all(
                isinstance(s, int) and not isinstance(s, bool) for s in self.seeds
            ):
                raise ValueError(f"seeds must be {self.size} ints (one per member), got {self.seeds!r}")
            object.__setattr__(self, "seeds", tuple(self.seeds))
        object.__setattr__(self, "problem", as_trainable(self.problem))

    @property
    def optimizer(self) -> GradientTransformation | None:  # type: ignore[override]
        return self.problem.optimizer

    def configure(
        self, solver: Solver | str | None = None, optimizer: GradientTransformation | None = None
    ) -> Ensemble:
        """Every member with ``solver`` and ``optimizer`` bound (its state per member in opt_state)."""
        return Ensemble(self.problem.configure(solver, optimizer), self.size, self.seeds)

    def with_optimizer(self, optimizer: GradientTransformation | None) -> Ensemble:
        return Ensemble(self.problem.with_optimizer(optimizer), self.size, self.seeds)

    def check_state(self, state: State) -> None:
        """Every leaf of ``state`` has the leading member axis E = ``size``."""
        if not isinstance(state, State):
            raise TypeError(
                f"an ensemble trains a fwdtrain.State with a member axis (ensemble.init), got {type(state).__name__}"
            )
        found = size(state)
        if found != self.size:
            raise ValueError(
                f"the state has {found} members (leading axis of every leaf) but the ensemble has size {self.size}"
            )
        if state.t.ndim != 1:
            raise ValueError(f"an ensemble state's t must be (E,) = ({self.size},), got {tuple(state.t.shape)}")

    def check(self, state: State, dt: Any, lr: Any) -> None:
        self.check_state(state)
        if not callable(lr):
            lr = rates(lr, self.size)
            lr = lr[0] if isinstance(lr, torch.Tensor) and lr.ndim == 1 else lr
        self.problem.check(member(state, 0), dt, lr)

    def plan(self, state: State, mode: str = "auto") -> Hashable:
        return self.problem.plan(member(state, 0), mode)

    def noise_shape(self, state: State) -> tuple[int, ...]:
        return (self.size, *self.problem.noise_shape(member(state, 0)))

    def propagate(self, state: State, dw: torch.Tensor, dt: Any, plan: Hashable) -> tuple[State, StepInfo]:
        """vmap of the member's propagate: (state, StepInfo(cost (E,), gradient leaves (E, *s)))."""
        return vmap(lambda s, d: self.problem.propagate(s, d, dt, plan))(state, dw)

    def update(self, moved: State, gradient: Any, alpha: Any, dt: Any) -> State:
        """vmap of the member's update; alpha is (E,) or one value for all."""
        if not isinstance(alpha, torch.Tensor):
            alpha = torch.tensor(alpha, dtype=moved.x.dtype, device=moved.x.device)
        alpha = torch.broadcast_to(alpha, (self.size,))
        return vmap(lambda s, g, a: self.problem.update(s, g, a, dt))(moved, gradient, alpha)

    def record(self, state: State) -> Any:
        return vmap(self.problem.record)(state)

    def schedule(self, lr: Any, state: State) -> Schedule:
        """Per-member learning rates (``rates``): alpha (E,) on the members' clocks t (E,)."""
        lr = rates(lr, self.size)
        return lr if callable(lr) else super().schedule(lr, state)

    # ---- the loop's member hooks ----
    def within(self, state: State, bound: float | None = None) -> torch.Tensor:
        """(E,) bool: member e's ``checked`` parts finite (and |.| <= bound when given)."""
        parts = [_per_member(leaf) for leaf in leaves(tuple(self.checked(state).values())) if leaf[0].numel()]
        peak = torch.stack(parts).amax(0)
        return torch.isfinite(peak) if bound is None else peak <= bound  # NaN compares False

    def freeze(self, good: State, new: State, running: torch.Tensor) -> State:
        """``new`` for the members where ``running`` (E,) is True, ``good`` for the others (branch-free)."""

        def pick(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
            return torch.where(running.reshape((-1,) + (1,) * (after.ndim - 1)), after, before)

        return tree_map(pick, good, new)

    def gradient_norm(self, gradient: Any) -> torch.Tensor:
        """(E,): |G_e| per member, computed as a single run computes it (so the records agree bitwise)."""
        return torch.stack([squared_norm(member(gradient, e)).sqrt() for e in range(self.size)])

    def noise_source(self, noise: NoiseLike | int | Sequence[int], dt: Any, state: State, saved: dict | None) -> Any:
        """The members' noise: ``BrownianNoise(seed_e)`` each (seed_e = seeds[e], noise[e], or noise + e),
        the saved positions of a continued run, or the user's (steps, E, N, m) tensor or function."""
        dtype, device = state.x.dtype, state.x.device
        if saved is not None and (isinstance(noise, (int, list, tuple)) and not isinstance(noise, bool)):
            source = EnsembleNoise.from_state_dict(saved, dtype, device)
            if len(source.sources) != self.size:
                raise ValueError(f"the history's noise has {len(source.sources)} members, the ensemble {self.size}")
            return source
        if isinstance(noise, (list, tuple)):
            seeds = tuple(int(s) for s in noise)
            if len(seeds) != self.size:
                raise ValueError(f"noise= gives {len(seeds)} seeds for an ensemble of {self.size} members")
        elif isinstance(noise, int) and not isinstance(noise, bool):
            seeds = self.seeds if self.seeds is not None else tuple(noise + e for e in range(self.size))
        else:
            return super().noise_source(noise, dt, state, saved)  # type: ignore[arg-type]  # not a seed list
        shape = tuple(self.problem.noise_shape(member(state, 0)))
        return EnsembleNoise.brownian(seeds, shape, float(dt), dtype=dtype, device=device)


__all__ = [
    "Ensemble",
    "EnsembleNoise",
    "PerMember",
    "init",
    "member",
    "member_history",
    "rates",
    "size",
    "stack",
    "unstack",
]
