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


def _doubling(a: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, the prefix products of a) along dim 1 by recursive doubling: log2(n) vectorised steps."""
    n = c.shape[1]
    shift = 1
    while shift < n:
        c = torch.cat([c[:, :shift], a[:, shift:] * c[:, :-shift] + c[:, shift:]], 1)
        a = torch.cat([a[:, :shift], a[:, shift:] * a[:, :-shift]], 1)
        shift *= 2
    return c, a


def linear_scan(a: torch.Tensor, c: torch.Tensor, block: int = 16) -> torch.Tensor:
    """x along dim 1 with x_0 = c_0 and x_i = a_i x_{i-1} + c_i (a (R, n, ...) broadcastable to c).

    Two levels: recursive doubling inside blocks of ``block`` events (log2(block) steps over all events), the
    same scan over the blocks' last values (n / block of them), then x_i += (a's product from the block's start
    to i) x(the previous block's end): O(n log block) work instead of O(n log n)."""
    n = c.shape[1]
    a = a.expand(*c.shape[:2], *a.shape[2:])
    if n <= block:
        return _doubling(a, c)[0]
    blocks = -(-n // block)
    pad = blocks * block - n
    if pad:
        c = torch.cat([c, c.new_zeros((c.shape[0], pad, *c.shape[2:]))], 1)
        a = torch.cat([a, a.new_ones((a.shape[0], pad, *a.shape[2:]))], 1)
    r = c.shape[0]
    local, products = _doubling(a.reshape(r * blocks, block, *a.shape[2:]), c.reshape(r * blocks, block, *c.shape[2:]))
    local = local.reshape(r, blocks, block, *c.shape[2:])
    products = products.reshape(r, blocks, block, *a.shape[2:])
    ends = linear_scan(products[:, :, -1], local[:, :, -1], block)  # x at each block's last event
    carried = torch.cat([torch.zeros_like(ends[:, :1]), ends[:, :-1]], 1)  # x before each block
    out = local + products * carried[:, :, None]
    return out.reshape(c.shape)[:, :n]


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


def exponential_sum_jets(
    decays: torch.Tensor,
    times: torch.Tensor,
    onehot: torch.Tensor,
    t0: torch.Tensor,
    s0: tuple[torch.Tensor, ...],
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """``exponential_sums`` with the first two derivatives of each S_u in its decay b_u: ((S, S', S'') before each
    event, the same just after the last event), s0 = (S_0, S_0', S_0'').

    With x_i = f_i y_i, y_i = x_{i-1} + p_i (f_i = exp(-b gap_i), p the jumps, p_0 = s0), f' = -gap f and
    f'' = gap^2 f, so x' = scan(f, f' y + f p') and x'' = scan(f, f'' y + 2 f' y' + f p''): three scans with the
    same factors, each right-hand side known from the scan before."""
    gaps = torch.diff(times, dim=1, prepend=t0[:, None])[..., None, None]  # (R, n, 1, 1)
    fades = torch.exp(-gaps * decays[:, None])  # (R, n, U, 1)
    slopes, curves = -gaps * fades, gaps * gaps * fades
    jumps = onehot[:, :-1, None, :].expand(-1, -1, decays.shape[0], -1)
    p = [torch.cat([s0[0][:, None], jumps], 1)] + [torch.cat([d[:, None], torch.zeros_like(jumps)], 1) for d in s0[1:]]

    def lift(x: torch.Tensor, order: int) -> torch.Tensor:  # y_i = x_{i-1} + p_i
        return p[order] + torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)

    x0 = linear_scan(fades, fades * p[0])
    y0 = lift(x0, 0)
    x1 = linear_scan(fades, slopes * y0 + fades * p[1])
    x2 = linear_scan(fades, curves * y0 + 2 * slopes * lift(x1, 1) + fades * p[2])
    return (x0, x1, x2), (x0[:, -1] + onehot[:, -1, None, :], x1[:, -1], x2[:, -1])


__all__ = ["exponential_sum_jets", "exponential_sums", "linear_scan"]
