"""Exponential sums over past events, vectorised over events: the closed-form state of exponential kernels.

For decays beta (U,) and events (t_m, k_m) with one-hot rows e_m (K,),

    S_i = sum_{m < i} e_m exp(-beta (t_i - t_m)) + S_0 exp(-beta (t_i - t_0))     (R, n, U, K)

the state just before event i (in index order) given the state S_0 at time t_0 <= t_1. The linear recursion
S_{i+1} = exp(-beta dt) (S_i + e_i) is an associative scan, evaluated by recursive doubling in log2(n) vectorised
steps of products of factors exp(-beta dt) <= 1: no overflow for any number of events per unit time. (A
cumulative log-sum-exp would be O(n), but torch's forward-mode rule for logcumsumexp overflows.) Pure torch, so
torch.func differentiates it (forward mode: the sensitivity dS/dbeta carried along the events).
"""

from __future__ import annotations

import torch


def linear_scan(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """x along dim 1 with x_0 = c_0 and x_i = a_i x_{i-1} + c_i, by recursive doubling: log2(n) vectorised
    steps (a (R, n, ...) broadcastable to c)."""
    n = c.shape[1]
    a = a.expand(*c.shape[:2], *a.shape[2:])
    shift = 1
    while shift < n:
        c = torch.cat([c[:, :shift], a[:, shift:] * c[:, :-shift] + c[:, shift:]], 1)
        a = torch.cat([a[:, :shift], a[:, shift:] * a[:, :-shift]], 1)
        shift *= 2
    return c


def exponential_sums(
    decays: torch.Tensor, times: torch.Tensor, onehot: torch.Tensor, t0: torch.Tensor, s0: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(S (R, n, U, K) before each event, S_end (R, U, K) just after the last event, at times[:, -1]).

    decays (U,), times (R, n) sorted, onehot (R, n, K) (zero rows: no event), t0 (R,), s0 (R, U, K) at t0."""
    gaps = torch.diff(times, dim=1, prepend=t0[:, None])  # (R, n)
    fades = torch.exp(-gaps[..., None] * decays)[..., None]  # (R, n, U, 1): a_i = exp(-beta (t_i - t_{i-1}))
    previous = torch.cat([s0[:, None], onehot[:, :-1, None, :].expand(-1, -1, decays.shape[0], -1)], 1)
    sums = linear_scan(fades, fades * previous)
    return sums, sums[:, -1] + onehot[:, -1, None, :]


__all__ = ["exponential_sums", "linear_scan"]
