"""The online fit: one pass over the events in blocks, a second-order update after each block, continued as
new events arrive.

The pass walks the events in blocks of ``block`` events of every realization at once (the realizations are
independent, so one block of R realizations is R times the information of one, in one vectorised step). The
state Y and its sensitivity dY/du go with the pass (forward mode: a jvp of each block with tangents (I, dY/du)),
so each block m gives, at the estimate u_m of its time, its score s_m = d log L_m / du and the Fisher
information of its events,

    F_m = sum over the block's events of g_i g_i',   g_i = d log lambda_{k_i}(t_i-) / du,

an unbiased estimate of the block's information E[-d^2 log L_m / du^2] = E[int grad lambda grad lambda' / lambda dt]
that is positive semi-definite by construction (the Hessian in u is not: log-decays). The estimate after block n
maximises the sum of the blocks' quadratic models of log L, each about the estimate of its time, and a prior
N(u_0, 1 / prior) per entry that only the first blocks feel:

    u_{n+1} = argmax_{u >= bounds}  sum_{m <= n} [ s_m' (u - u_m) - (u - u_m)' F_m (u - u_m) / 2 ]
                                      - prior |u - u_0|^2 / 2,

a bounded quadratic (``newton.projected_newton``, one or a few steps), so an entry whose MLE is 0 sits at 0. Without
bounds this is the recursive Newton step u_{n+1} = u_n + A_n^{-1} s_n, A_n = prior I + sum F_m: each block moves the
estimate by its own score scaled by all the information so far, which is what a batch Newton step from u_n would
do with the information of the data seen. No learning rate, no averaging; a move per block is capped at ``radius``
(max |u_{n+1} - u_n|) against the first blocks' thin information.

What carries to the next call (``OnlineState``): the pass at its last whole block (u, A and b = prior u_0 +
sum (s_m + F_m u_m), the state and its sensitivity, the last event's time) and the events after that block. The
next call's blocks begin with those events, so a continued fit walks the same blocks as one pass over the
concatenated events of one realization and equals it; the result of each call also includes its last, partial
block, as an update on top of the kept state. (With R realizations the blocks are columns of the padded layout,
so a split leaves the result within the pass's noise of one pass, not equal to it.)

The models are taken where the pass stood, and from a far start (a decay 25 to 75 times the default's, the
event rate) the first blocks' models, taken far from the MLE, would bias the end by 9 to 30 standard errors. So
the first blocks' models are taken again: after block n = 1, 2, 4, ..., ``PREFIX_BLOCKS``, one pass over all the
blocks so far at the present estimate u (from the origin: Y = 0, dY/du = 0) gives their scores and information
about u, and A, b, Y and dY/du are replaced by theirs; the maximiser of that sum is a Newton step of the
prefix's log L from u, repeated while it moves u by more than ``SETTLED`` (at most ``RELINEARISATIONS``). The
prefix's models then sit about one estimate from half the prefix or more, the later blocks' about estimates
that have settled; the cost is at most twice the prefix's blocks per repetition, once, and the state keeps the
prefix's events only until ``PREFIX_BLOCKS``. The decisions depend only on the block count, so a continued fit
still walks as one pass does.

The result's information is A in natural units (without the prior), its standard errors sqrt(diag(A^-1)); its
log-likelihood is the prequential sum_m log L_m(u_m) of the pass (each block at the estimate of its time).
The compensator from a realization's last event to its window's end enters with the next call's first event.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch.func import jvp, vmap

from .likelihood import Carry, Piece, Prepared, chunk, general_chunk_about, init
from .models import AdditiveModel, EventModel, GeneralModel, pack, unpack
from .newton import project, projected_newton


class Origin(NamedTuple):
    """The pass before any event: the start u_0 (the prior's centre), the carry and its sensitivity."""

    u: torch.Tensor
    carry: Carry
    tangents: tuple[torch.Tensor, ...]


class OnlineState(NamedTuple):
    """Where an online pass stands after its last whole block: the estimate u (p,), the quadratic model's A (p, p)
    (prior included) and b (p,) (its maximiser solves A u = b), the carried model state and its sensitivity dY/du,
    the events in the blocks by realization (R,), the blocks and the prequential log L so far, the prior (the
    start's information), and the events after the last whole block (the next call's first block begins with them)."""

    u: torch.Tensor
    information: torch.Tensor
    target: torch.Tensor
    carry: Carry
    tangents: tuple[torch.Tensor, ...]
    seen: torch.Tensor
    blocks: int
    log_likelihood: float
    prior: float
    pending: Piece | None = None  # the events after the last whole block, not yet in u, A and b
    origin: Origin | None = None  # the pass before any event: the models of its first blocks are taken again
    prefix: tuple[Piece, ...] = ()  # the blocks so far, while their models may still be taken again


class Block(NamedTuple):
    """What one block gives at u: the moved carry and its sensitivity, log L_m, the score s_m and F_m."""

    carry: Carry
    tangents: tuple[torch.Tensor, ...]
    log_likelihood: torch.Tensor
    score: torch.Tensor
    fisher: torch.Tensor


def block_step(model: EventModel, piece: Piece, u: torch.Tensor, carry: Carry, tangents: tuple) -> Block:
    """One block at u by forward mode (p tangents at once): see the module's docstring."""

    if isinstance(model, GeneralModel):  # the path solved once, moved by its sensitivities: no solve differentiated
        about = general_chunk_about(model, lambda w: unpack(model, w), u, carry, piece)
    else:
        about = lambda w, state: chunk(model, unpack(model, w), Carry(state, carry.time), piece)

    def run(w: torch.Tensor, state: tuple) -> tuple[tuple, torch.Tensor, torch.Tensor]:
        moved, log_rate, compensator = about(w, state)
        return moved.state, log_rate, compensator.sum()

    eye = torch.eye(u.numel(), dtype=u.dtype, device=u.device)
    state_dims = tuple(-1 for _ in carry.state)
    (state, log_rate, compensator), (d_state, d_log_rate, d_compensator) = vmap(  # type: ignore[misc]
        lambda du, ds: jvp(run, (u, carry.state), (du, ds)),
        in_dims=(0, state_dims),
        out_dims=(0, (state_dims, 0, 0)),  # type: ignore[arg-type]
    )(eye, tangents)
    per_event = d_log_rate.reshape(u.numel(), -1)  # (p, R b): zero on padding
    return Block(
        carry=Carry(tuple(s[0] for s in state), piece.times[:, -1]),
        tangents=d_state,
        log_likelihood=log_rate[0].sum() - compensator[0],
        score=per_event.sum(1) - d_compensator,
        fisher=per_event @ per_event.T,
    )


def begin(model: EventModel, prepared: Prepared, start: dict[str, Any], prior: float = 1.0) -> OnlineState:
    """The state before any event: u_0 = pack(start), A = prior I, b = prior u_0, Y = 0 at the windows' starts."""
    if not (math.isfinite(prior) and prior > 0):
        raise ValueError(f"online prior (the start's information per entry) must be a positive number, got {prior!r}")
    u = pack(model, start, prepared.data.times)
    carry = init(model, unpack(model, u), prepared.data)
    tangents = tuple(s.new_zeros((*s.shape, u.numel())) for s in carry.state)
    information = prior * torch.eye(u.numel(), dtype=u.dtype, device=u.device)
    seen = torch.zeros(prepared.data.realizations, dtype=torch.int64, device=u.device)
    return OnlineState(
        u=u,
        information=information,
        target=prior * u,
        carry=carry,
        tangents=tangents,
        seen=seen,
        blocks=0,
        log_likelihood=0.0,
        prior=prior,
        origin=Origin(u=u, carry=carry, tangents=tangents),
    )


def _last(state: OnlineState) -> tuple[torch.Tensor, torch.Tensor]:
    """(each realization's last event time (R,), whether it has had events), pending events included."""
    if state.pending is None:
        return state.carry.time, state.seen > 0
    mask = state.pending.mask
    column = (mask * torch.arange(1, mask.shape[1] + 1, device=mask.device)).argmax(
        1, keepdim=True
    )  # the last real event
    time = torch.where(mask.any(1), state.pending.times.gather(1, column)[:, 0], state.carry.time)
    return time, (state.seen > 0) | mask.any(1)


def check(state: OnlineState, prepared: Prepared) -> None:
    """The events continue the state's realizations: as many, and each one's first new event after its last."""
    data = prepared.data
    if data.realizations != state.seen.numel():
        raise ValueError(
            f"the online state follows {state.seen.numel()} realizations but the new events have {data.realizations}: "
            "continue with the next events of the same realizations, in the same order"
        )
    first = data.times[:, 0]
    time, had = _last(state)
    late = data.mask[:, 0] & ((first < time) | ((first == time) & had))
    if bool(late.any()):
        r = int(late.nonzero()[0, 0])
        raise ValueError(
            f"realization {r}: the new events start at {float(first[r]):g}, not after the state's last event at "
            f"{float(time[r]):g}: give only the events that came after it"
        )


def _take(piece: Piece, a: int, b: int) -> Piece:
    return Piece(
        times=piece.times[:, a:b],
        types=piece.types[:, a:b],
        marks=piece.marks[:, a:b],
        mask=piece.mask[:, a:b],
        earlier=piece.earlier[:, a:b],
        tied=piece.tied[:, a:b],
        substeps=piece.substeps[a:b],
    )


def _joined(model: EventModel, state: OnlineState, prepared: Prepared) -> Piece:
    """The state's pending events followed by ``prepared``'s, the first new interval's pieces counted from the
    last event before it (not from the new window's start)."""
    new = prepared.piece
    if new.substeps:
        assert isinstance(model, AdditiveModel | GeneralModel)  # only their intervals are cut into pieces
        time, _ = _last(state)
        gap = float((new.times[:, 0] - time).max())
        new = new._replace(substeps=(max(1, math.ceil(gap / float(model.step))), *new.substeps[1:]))
    if state.pending is None:
        return new
    old = state.pending
    return Piece(
        times=torch.cat([old.times, new.times], 1),
        types=torch.cat([old.types, new.types], 1),
        marks=torch.cat([old.marks, new.marks], 1),
        mask=torch.cat([old.mask, new.mask], 1),
        earlier=torch.cat([old.earlier, new.earlier], 1),
        tied=torch.cat([old.tied, new.tied], 1),
        substeps=old.substeps + new.substeps,
    )


def walk(
    model: EventModel, prepared: Prepared, state: OnlineState, bounded: torch.Tensor, block: int, radius: float
) -> tuple[OnlineState, OnlineState, list[torch.Tensor]]:
    """The pass over the state's pending events and ``prepared``'s: (the state after the last whole block, which
    holds the events after it, the state after those too (the result), the estimate after each block)."""
    events = _joined(model, state, prepared)
    n = events.times.shape[1]
    whole = n - n % block
    kept, path = advance(model, _take(events, 0, whole), state._replace(pending=None), bounded, block, radius)
    if whole == n:
        return kept, kept, path
    final, last = advance(model, _take(events, whole, n), kept, bounded, block, radius)
    return kept._replace(pending=_take(events, whole, n)), final, path + last


def _maximise(
    information: torch.Tensor, target: torch.Tensor, u: torch.Tensor, bounded: torch.Tensor, radius: float
) -> torch.Tensor:
    """argmax over u >= bounds of b'w - w'Aw/2, the move from u capped at ``radius`` per entry."""
    quadratic = lambda w: target @ w - w @ information @ w / 2
    derivatives = lambda w: (target - information @ w, -information)
    best = projected_newton(quadratic, derivatives, u, bounded, iterations=50, tolerance=1e-12).x
    return project(u + (best - u).clamp(-radius, radius), bounded)


def _relinearise(model: EventModel, state: OnlineState, bounded: torch.Tensor, radius: float) -> OnlineState:
    """The prefix's models all taken again about the present estimate u (one pass over the prefix at u from the
    origin) and the bounded maximiser of their sum, a Newton step of the prefix's log L from u, repeated while it
    moves u by more than ``SETTLED``: A, b, the carry and its sensitivity are replaced, the prequential log L kept."""
    assert state.origin is not None
    origin = state.origin
    eye = torch.eye(state.u.numel(), dtype=state.u.dtype, device=state.u.device)
    for _ in range(RELINEARISATIONS):
        u, carry, tangents = state.u, origin.carry, origin.tangents
        information, target = state.prior * eye, state.prior * origin.u
        for piece in state.prefix:
            step = block_step(model, piece, u, carry, tangents)
            carry, tangents = step.carry, step.tangents
            information = information + step.fisher
            target = target + step.score + step.fisher @ u
        state = state._replace(
            u=_maximise(information, target, u, bounded, radius),
            information=information,
            target=target,
            carry=carry,
            tangents=tangents,
        )
        if float((state.u - u).abs().max()) < SETTLED:
            break
    return state


def advance(
    model: EventModel, events: Piece, state: OnlineState, bounded: torch.Tensor, block: int, radius: float
) -> tuple[OnlineState, list[torch.Tensor]]:
    """The blocks of ``events`` from ``state``: (the state after them, the estimate after each block). After
    block n = 1, 2, 4, ..., ``PREFIX_BLOCKS``, the models of all blocks so far are taken again about the estimate
    (``_relinearise``); past that, the blocks' events are no longer kept."""
    log_likelihood, blocks, path = state.log_likelihood, state.blocks, list[torch.Tensor]()
    for a in range(0, events.times.shape[1], block):
        piece = _take(events, a, a + block)
        u = state.u
        step = block_step(model, piece, u, state.carry, state.tangents)
        log_likelihood += float(step.log_likelihood)
        information = state.information + step.fisher
        target = state.target + step.score + step.fisher @ u
        blocks += 1
        state = state._replace(
            u=_maximise(information, target, u, bounded, radius),
            information=information,
            target=target,
            carry=step.carry,
            tangents=step.tangents,
            prefix=state.prefix + (piece,) if state.origin is not None and blocks <= PREFIX_BLOCKS else (),
        )
        if state.prefix and blocks & (blocks - 1) == 0:  # a power of 2
            state = _relinearise(model, state, bounded, radius)
        path.append(state.u)
    moved = state._replace(
        seen=state.seen + events.mask.sum(1), blocks=blocks, log_likelihood=log_likelihood, pending=None
    )
    return moved, path


PREFIX_BLOCKS = 32  # the first blocks, whose models are taken again about later estimates
RELINEARISATIONS = 4  # Newton steps on the prefix at most, each time it is taken again
SETTLED = 1e-3  # a Newton step on the prefix that moves u less than this ends them


__all__ = ["Block", "OnlineState", "Origin", "advance", "begin", "block_step", "check", "walk"]
