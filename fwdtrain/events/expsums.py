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


def strict_sums(
    decays: torch.Tensor, times: torch.Tensor, types: torch.Tensor, mask: torch.Tensor, end: torch.Tensor, count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(S (R, n, U, K), S_end (R, U, K)): S_uj(t_i-) = sum over the type-j events strictly before t_i of
    exp(-b_u (t_i - t_m)), from 0 at each realization's start, and the same sum over all type-j events at ``end``
    (R,). Events with mask False add nothing (their own rows hold no meaning).

    Each (realization, type) stream alone: A_l = 1 + exp(-b (tau_l - tau_{l-1})) A_{l-1}, the sum just after its
    l-th event (``linear_scan`` over n U numbers, not n U K), then each event reads its stream's last event strictly
    before it (the stream's count before the event's tie began), S = A_l exp(-b (t_i - tau_l)): ties need no
    correction. Not for torch.func (the layout depends on the data); ``exponential_sums`` is the differentiable
    form."""
    r, n = times.shape
    u = decays.shape[0]
    onehot = torch.nn.functional.one_hot(types, count) * mask[..., None]  # (R, n, K)
    running = torch.cumsum(onehot, 1)  # each stream's events up to i
    length = max(int(running[:, -1].max()), 1)
    rank = torch.gather(running, 2, types[..., None])[..., 0]  # each event's place in its stream, from 1
    dump = r * count * (length + 1)  # where the padding is written
    device = times.device
    slot = torch.where(mask, (torch.arange(r, device=device)[:, None] * count + types) * (length + 1) + rank, dump)
    streams = times.new_zeros(dump + 1).scatter_(0, slot.reshape(-1), times.reshape(-1))
    streams = streams[:-1].reshape(r * count, length + 1)  # place 0: before the stream's first event
    sizes = running[:, -1].reshape(-1)  # (R K,)
    inside = torch.arange(1, length, device=device) < sizes[:, None]
    gaps = torch.where(inside, torch.diff(streams[:, 1:], dim=1), 0.0)
    fades = torch.cat([times.new_zeros((r * count, 1, u)), torch.exp(-gaps[..., None] * decays)], 1)
    after = linear_scan(fades, torch.ones_like(fades))  # (R K, L, U): A_l
    after = torch.cat([after.new_zeros((r * count, 1, u)), after], 1)  # A_0 = 0: no event yet
    tied = torch.cat([torch.zeros_like(mask[:, :1]), times[:, 1:] == times[:, :-1]], 1)
    places = torch.arange(n, device=device).expand(r, n)
    first = torch.cummax(torch.where(tied, 0, places), 1).values  # each tie's first event
    before = torch.gather(running - onehot, 1, first[..., None].expand(r, n, count))  # (R, n, K) strictly earlier
    before = before.permute(0, 2, 1).reshape(r * count, n)
    since = times[:, None, :].expand(r, count, n).reshape(r * count, n) - streams.gather(1, before)
    sums = after.gather(1, before[..., None].expand(-1, -1, u)) * torch.exp(-since[..., None] * decays)
    since = end.repeat_interleave(count) - streams.gather(1, sizes[:, None])[:, 0]
    at_end = after.gather(1, sizes[:, None, None].expand(-1, 1, u))[:, 0] * torch.exp(-since[:, None] * decays)
    return sums.reshape(r, count, n, u).permute(0, 2, 3, 1), at_end.reshape(r, count, u).permute(0, 2, 1)


__all__ = ["exponential_sum_jets", "exponential_sums", "linear_scan", "strict_sums"]
