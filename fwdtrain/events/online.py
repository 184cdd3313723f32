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

What carries to the next call (``OnlineState``): u, A and b = prior u_0 + sum (s_m + F_m u_m) (the quadratic
model), the state and its sensitivity, the last event's time. Given the next events of the same realizations,
``online`` continues the pass: a fit continued block by block equals one pass over the concatenated events when
each call's events fill whole blocks (a call's last, partial block is an update of its own).

The models are taken where the pass stood, so the start must be within reach of the MLE (a decay within a factor
of a few): from a decay 20 to 50 times too small, the first blocks' models, taken far away, bias the end by many
standard errors. A batch fit of a first stretch of the events is such a start.

The result's information is A in natural units (without the prior), its standard errors sqrt(diag(A^-1)); its
log-likelihood is the prequential sum_m log L_m(u_m) of the pass (each block at the estimate of its time).
The compensator from a realization's last event to its window's end enters with the next call's first event.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch.func import jvp, vmap

from .likelihood import Carry, Piece, Prepared, chunk, init, pieces
from .models import EventModel, pack, unpack
from .newton import project, projected_newton


class OnlineState(NamedTuple):
    """Where an online pass stands: the estimate u (p,), the quadratic model's A (p, p) (prior included) and b
    (p,) (its maximiser solves A u = b), the carried model state and its sensitivity dY/du, the events seen
    by realization (R,), the blocks and the prequential log L so far, and the prior (the start's information)."""

    u: torch.Tensor
    information: torch.Tensor
    target: torch.Tensor
    carry: Carry
    tangents: tuple[torch.Tensor, ...]
    seen: torch.Tensor
    blocks: int
    log_likelihood: float
    prior: float


class Block(NamedTuple):
    """What one block gives at u: the moved carry and its sensitivity, log L_m, the score s_m and F_m."""

    carry: Carry
    tangents: tuple[torch.Tensor, ...]
    log_likelihood: torch.Tensor
    score: torch.Tensor
    fisher: torch.Tensor


def block_step(model: EventModel, piece: Piece, u: torch.Tensor, carry: Carry, tangents: tuple) -> Block:
    """One block at u by forward mode (p tangents at once): see the module's docstring."""

    def run(w: torch.Tensor, state: tuple) -> tuple[tuple, torch.Tensor, torch.Tensor]:
        moved, log_rate, compensator = chunk(model, unpack(model, w), Carry(state, carry.time), piece)
        return moved.state, log_rate, compensator.sum()

    eye = torch.eye(u.numel(), dtype=u.dtype)
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
    u = pack(model, start)
    carry = init(model, unpack(model, u), prepared.data)
    tangents = tuple(torch.zeros((*s.shape, u.numel()), dtype=s.dtype) for s in carry.state)
    information = prior * torch.eye(u.numel(), dtype=u.dtype)
    seen = torch.zeros(prepared.data.realizations, dtype=torch.int64)
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
    )


def check(state: OnlineState, prepared: Prepared) -> None:
    """The events continue the state's realizations: as many, and each one's first new event after its last."""
    data = prepared.data
    if data.realizations != state.seen.numel():
        raise ValueError(
            f"the online state follows {state.seen.numel()} realizations but the new events have {data.realizations}: "
            "continue with the next events of the same realizations, in the same order"
        )
    first = data.times[:, 0]
    late = data.mask[:, 0] & ((first < state.carry.time) | ((first == state.carry.time) & (state.seen > 0)))
    if bool(late.any()):
        r = int(late.nonzero()[0, 0])
        raise ValueError(
            f"realization {r}: the new events start at {float(first[r]):g}, not after the state's last event at "
            f"{float(state.carry.time[r]):g}: give only the events that came after it"
        )


def advance(
    model: EventModel, prepared: Prepared, state: OnlineState, bounded: torch.Tensor, block: int, radius: float
) -> tuple[OnlineState, list[torch.Tensor]]:
    """The pass over ``prepared``'s events from ``state``: (the state after them, the estimate after each block)."""
    u, information, target = state.u, state.information, state.target
    carry, tangents, log_likelihood, path = state.carry, state.tangents, state.log_likelihood, []
    for piece in pieces(prepared, block):
        step = block_step(model, piece, u, carry, tangents)
        carry, tangents = step.carry, step.tangents
        log_likelihood += float(step.log_likelihood)
        information = information + step.fisher
        target = target + step.score + step.fisher @ u
        quadratic = lambda w: target @ w - w @ information @ w / 2
        derivatives = lambda w: (target - information @ w, -information)
        best = projected_newton(quadratic, derivatives, u, bounded, iterations=50, tolerance=1e-12).x
        u = project(u + (best - u).clamp(-radius, radius), bounded)
        path.append(u)
    seen = state.seen + prepared.data.mask.sum(1)
    moved = OnlineState(
        u=u,
        information=information,
        target=target,
        carry=carry,
        tangents=tangents,
        seen=seen,
        blocks=state.blocks + len(path),
        log_likelihood=log_likelihood,
        prior=state.prior,
    )
    return moved, path


__all__ = ["Block", "OnlineState", "advance", "begin", "block_step", "check"]
