"""Nonlinear recursions over the events, x_i = G_i(x_{i-1}), solved for all events at once by Newton's method.

Each Newton step linearises every G_i at the current path, x_i = J_i x_{i-1} + (G_i(p_i) - J_i p_i) with
p_i the current x_{i-1} and J_i = dG_i/dx (d, d): a linear recursion, solved by recursive doubling over the
events (``matrix_scan``). After k steps the first k entries are exact (each step makes one more entry exact given
the exact ones before it), and the convergence is quadratic, so a few steps reach machine precision. On the way
to the solution each Jacobian's norm is clipped to 1: the same fixed point, but corrections that cannot grow
along the chain.

Derivatives: Newton's map N has dN/dx = 0 at its fixed point, so from the converged path x* held constant, one
step x1 = N(x*, theta) has the exact first derivative in theta and a second step x2 = N(x1, theta) the exact
second derivative (x2'' = N_tt - N_xx x' x' = x''). ``solve`` finds x* on the plain numbers (outside any
``torch.func`` transform) and returns the two differentiated steps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import _compat


def matrix_scan(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """x (R, n, d) with x_i = a_i x_{i-1} + c_i and x_{-1} = 0, for a (R, n, d, d), by recursive doubling."""
    n = c.shape[1]
    shift = 1
    while shift < n:
        c = torch.cat([c[:, :shift], (a[:, shift:] @ c[:, :-shift, :, None])[..., 0] + c[:, shift:]], 1)
        a = torch.cat([a[:, :shift], a[:, shift:] @ a[:, :-shift]], 1)
        shift *= 2
    return c


def newton_step(
    after: Callable[[torch.Tensor], torch.Tensor], x0: torch.Tensor, path: torch.Tensor, clip: bool = False
) -> torch.Tensor:
    """One Newton step for x_i = after(x_{i-1})_i (``after`` maps the previous states (R, n, d), row by row,
    to the next), x_{-1} = x0 (R, d), from the current path (R, n, d). ``clip``: each J_i scaled to Frobenius
    norm at most 1 (the same fixed point, and after k steps still the first k entries exact, but corrections
    that cannot grow along the chain: far from the solution, a chain of Jacobians above 1 makes plain Newton
    diverge)."""
    previous = torch.cat([x0[:, None], path[:, :-1]], 1)
    d = path.shape[-1]
    value = after(previous)
    basis = torch.eye(d, dtype=path.dtype, device=path.device)[:, None, None, :].expand(d, *previous.shape)
    columns = torch.func.vmap(lambda t: torch.func.jvp(after, (previous,), (t,))[1])(basis)  # (d, R, n, d)
    jacobian = columns.permute(1, 2, 3, 0)  # (R, n, d_out, d_in)
    if clip:
        jacobian = jacobian / jacobian.flatten(-2).norm(dim=-1).clamp(min=1.0)[..., None, None]
    offset = value - (jacobian @ previous[..., None])[..., 0]
    offset = torch.cat([value[:, :1], offset[:, 1:]], 1)  # x_{-1} = x0 is exact: no linearisation
    return matrix_scan(jacobian, offset)


def solve(
    after: Callable[[torch.Tensor, slice], torch.Tensor],
    x0: torch.Tensor,
    n: int,
    plain: Callable[[torch.Tensor, slice], torch.Tensor],
    tolerance: float = 1e-14,
    floor: float = 1e-8,
    patience: int = 12,
    block: int = 64,
) -> tuple[torch.Tensor, int]:
    """(the path (R, n, d) of x_i = after(x_{i-1})_i from x0, the Newton steps taken on the plain numbers).

    ``after(previous, window)`` maps the previous states of the events in ``window`` (a slice of 0..n-1) to the
    next; ``plain`` is the same on the plain numbers (theta and the data unwrapped by ``_compat.primal``). Newton
    steps over all events stop when no entry moves by more than ``tolerance`` (relative), or by more than ``floor``
    while the moves stop halving (rounding, amplified along a chain whose Jacobians exceed 1, sets a floor; the
    two differentiated steps after it correct the path to first order again); if ``patience`` steps do
    not get there (far from the solution, Newton's corrections travel slowly along the chain), the entries that
    have settled are kept and the rest is solved in windows of ``block`` events, each exact in at most ``block``
    steps. Then two differentiated steps over all events from the path found (see the module's docstring)."""
    with _compat.outside_transforms(), torch.no_grad():
        start = _compat.primal(x0)
        path = start[:, None].expand(start.shape[0], n, start.shape[-1]).clone()
        steps, low, whole = 0, 0, True
        while low < n:
            high = n if whole else min(n, low + block)
            window = slice(low, high)
            first = start if low == 0 else path[:, low - 1]
            segment, settled, last = path[:, window], False, float("inf")
            for _ in range(patience if whole else high - low):
                steps += 1
                moved = newton_step(lambda previous: plain(previous, window), first, segment, clip=True)
                change = (moved - segment).abs().amax((0, 2))  # (m,)
                segment = moved
                scale, largest = 1.0 + float(segment.abs().max()), float(change.max())
                if largest <= tolerance * scale or (largest <= floor * scale and largest > last / 2):
                    settled = True  # converged, or at the floor rounding sets where the chain amplifies errors
                    break
                last = largest
            path[:, window] = segment
            if settled or not whole:
                low = high
            else:
                moving = torch.nonzero(~(change <= tolerance * (1.0 + float(segment.abs().max()))))
                if not bool(torch.isfinite(segment).all()):  # no finite path: log L is not finite either
                    break
                low, whole = low + int(moving[0, 0]), False
    every = slice(0, n)
    for _ in range(2):
        path = newton_step(lambda previous: after(previous, every), x0, path)
    return path, steps


__all__ = ["matrix_scan", "newton_step", "solve"]
