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
``torch.func`` transform) and returns the two differentiated steps: any transform of a pass through it is exact.

The batch fit's gradient and Hessian take a cheaper road (``derivatives``): the sensitivities forward and the
adjoint backward along the path, two linear scans, and the second derivatives of the one-event maps only, so
nothing is differentiated through the solve (the two differentiated steps hold Jacobians, whose second
derivatives are third derivatives of the user's functions).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import _compat


def matrix_scan(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """x (R, n, d) with x_i = a_i x_{i-1} + c_i and x_{-1} = 0, for a (R, n, d, d), by recursive doubling; c may
    have columns, (R, n, d, m), and x has them too."""
    if c.dim() == 3:
        return matrix_scan(a, c[..., None])[..., 0]
    n = c.shape[1]
    times = torch.mul if a.shape[-1] == 1 else torch.matmul  # d = 1: elementwise, no batch of 1x1 products
    shift = 1
    while shift < n:
        c = torch.cat([c[:, :shift], times(a[:, shift:], c[:, :-shift]) + c[:, shift:]], 1)
        a = torch.cat([a[:, :shift], times(a[:, shift:], a[:, :-shift])], 1)
        shift *= 2
    return c


def jacobians(
    after: Callable[[torch.Tensor], torch.Tensor], previous: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(after(previous) (R, n, d), J_i = d after_i / d previous_i (R, n, d, d)) of a row-wise map, by reverse mode:
    one pullback per output coordinate (forward mode meets a slow path in torch 2.13 wherever a tangent meets a
    constant, e.g. ``1 + y``)."""
    value, pullback = torch.func.vjp(after, previous)[:2]
    d = value.shape[-1]
    if d == 1:  # one pullback of ones, no vmap
        return value, pullback(torch.ones_like(value))[0][..., None]
    basis = torch.eye(d, dtype=value.dtype, device=value.device)[:, None, None, :].expand(d, *value.shape)
    rows = torch.func.vmap(pullback)(basis)[0]  # (d_out, R, n, d_in)
    return value, rows.permute(1, 2, 0, 3)


def newton_step(
    after: Callable[[torch.Tensor], torch.Tensor], x0: torch.Tensor, path: torch.Tensor, clip: bool = False
) -> torch.Tensor:
    """One Newton step for x_i = after(x_{i-1})_i (``after`` maps the previous states (R, n, d), row by row,
    to the next), x_{-1} = x0 (R, d), from the current path (R, n, d). ``clip``: each J_i scaled to Frobenius
    norm at most 1 (the same fixed point, and after k steps still the first k entries exact, but corrections
    that cannot grow along the chain: far from the solution, a chain of Jacobians above 1 makes plain Newton
    diverge)."""
    previous = torch.cat([x0[:, None], path[:, :-1]], 1)
    value, jacobian = jacobians(after, previous)
    if clip:
        jacobian = jacobian / jacobian.flatten(-2).norm(dim=-1).clamp(min=1.0)[..., None, None]
    offset = value - (jacobian @ previous[..., None])[..., 0]
    offset = torch.cat([value[:, :1], offset[:, 1:]], 1)  # x_{-1} = x0 is exact: no linearisation
    return matrix_scan(jacobian, offset)


def _search(
    plain: Callable[[torch.Tensor, slice], torch.Tensor],
    x0: torch.Tensor,
    n: int,
    tolerance: float,
    floor: float,
    patience: int,
    block: int,
) -> tuple[torch.Tensor, int, bool]:
    """The clipped Newton steps on the plain numbers of ``solve``: (the path found, the steps taken, whether every
    stretch settled to ``tolerance``, not at the rounding floor)."""
    with _compat.outside_transforms(), torch.no_grad():
        start = _compat.primal(x0)
        path = start[:, None].expand(start.shape[0], n, start.shape[-1]).clone()
        steps, low, size, exact = 0, 0, n, True
        while low < n:
            high = min(n, low + size)
            window, long = slice(low, high), high - low > block
            first = start if low == 0 else path[:, low - 1]
            segment, settled, shrinking, last, taken = path[:, window], False, False, float("inf"), 0
            while taken < (patience if long else high - low) or (long and shrinking and taken < 4 * patience):
                steps, taken = steps + 1, taken + 1
                moved = newton_step(lambda previous: plain(previous, window), first, segment, clip=True)
                change = (moved - segment).abs().amax((0, 2))  # (m,)
                segment = moved
                scale, largest = 1.0 + float(segment.abs().max()), float(change.max())
                if largest <= tolerance * scale or (largest <= floor * scale and largest > last / 2):
                    settled = True  # converged, or at the floor rounding sets where the chain amplifies errors
                    exact = exact and largest <= tolerance * scale
                    break
                shrinking = largest < last / 4  # Newton's quadratic phase: a few more steps end it
                last = largest
            path[:, window] = segment
            if settled or not long:
                low, size = high, 2 * size if taken <= 2 else block  # a stretch that settled at once: longer windows
            else:
                if not bool(torch.isfinite(segment).all()):  # no finite path: log L is not finite either
                    exact = False
                    break
                moving = torch.nonzero(~(change <= tolerance * (1.0 + float(segment.abs().max()))))
                low, size = low + int(moving[0, 0]), block
    return path, steps, exact


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
    not get there (far from the solution, Newton's corrections travel slowly along the chain) and the moves are
    not shrinking fourfold a step (Newton's quadratic phase, given up to 4 ``patience`` steps), the entries that
    have settled are kept and the rest is solved in windows: of ``block`` events, each exact in at most ``block``
    steps, and twice as long after one that settled in at most two steps (a window longer than ``block`` is
    treated as the whole was). Then two differentiated steps over all events from the path found (see the
    module's docstring)."""
    path, steps, _ = _search(plain, x0, n, tolerance, floor, patience, block)
    every = slice(0, n)
    for _ in range(2):
        path = newton_step(lambda previous: after(previous, every), x0, path)
    return path, steps


def settle(plain: Callable[[torch.Tensor, slice], torch.Tensor], x0: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    """``solve`` on the plain numbers only (nothing to differentiate): the same path; the two last steps only where
    the search stopped at the rounding floor."""
    path, steps, exact = _search(plain, x0, n, 1e-14, 1e-8, 12, 64)
    if not exact:
        every = slice(0, n)
        with torch.no_grad():
            for _ in range(2):
                path = newton_step(lambda previous: plain(previous, every), x0, path)
    return path, steps


def derivatives(
    after: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    objective: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x0: torch.Tensor,
    path: torch.Tensor,
    u: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(F, dF/du (p,), d^2F/du^2 (p, p)) of F(u) = objective(u, X(u)), X(u) (R, n, d) the path of
    x_i = after(u, x_{i-1})_i from x0 (constant), given at u as ``path``; ``after(u, previous)`` is row-wise.

    With J_i = d after_i / d x_{i-1} at the path, the sensitivities X'_i = J_i X'_{i-1} + d after_i / du (a linear
    recursion, ``matrix_scan`` with p columns) and the adjoint l_i = dF/dX_i + J_{i+1}' l_{i+1} (the same scan,
    reversed): the Lagrangian L(u, X) = F(u, X) + l . (after(u, shift(X)) - X) equals F(u) on the path for any l,
    and this l makes it stationary in X, so dF/du = dL/du and d^2F/du^2 = W' (d^2 L) W with W = (I; X') (the
    term in X'' drops out): p Hessian-vector products of L in (u, X) at the path, by reverse over reverse. Only
    second derivatives of the one-event maps are taken, all events at once; nothing is differentiated through
    the recursion."""
    shift = lambda states: torch.cat([x0[:, None], states[:, :-1]], 1)
    previous = shift(path)
    with torch.no_grad():
        _, jacobian = jacobians(lambda states: after(u, states), previous)  # (R, n, d, d)
        eye = torch.eye(u.numel(), dtype=u.dtype, device=u.device)
        direct = torch.func.vmap(lambda e: torch.func.jvp(lambda w: after(w, previous), (u,), (e,))[1])(eye)
        sensitivities = matrix_scan(jacobian, direct.permute(1, 2, 3, 0))  # (R, n, d, p)
    slope, value = torch.func.grad_and_value(objective, argnums=(0, 1))(u, path)
    with torch.no_grad():
        following = torch.cat([jacobian[:, 1:], torch.zeros_like(jacobian[:, :1])], 1).transpose(-1, -2)
        adjoint = matrix_scan(following.flip(1), slope[1].flip(1)).flip(1)  # (R, n, d)
    gradient = slope[0] + torch.einsum("prnd,rnd->p", direct, adjoint)
    lagrangian = lambda w, states: objective(w, states) + (adjoint * (after(w, shift(states)) - states)).sum()
    first = torch.func.grad(lagrangian, argnums=(0, 1))

    def product(direction: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        along = lambda w, states: sum((g * v).sum() for g, v in zip(first(w, states), (e, direction), strict=True))
        return torch.func.grad(along, argnums=(0, 1))(u, path)

    in_u, in_x = torch.func.vmap(product)(sensitivities.permute(3, 0, 1, 2), eye)  # (p, p), (p, R, n, d)
    hessian = in_u + torch.einsum("jrnd,rndk->jk", in_x, sensitivities)
    return value.detach(), gradient.detach(), ((hessian + hessian.T) / 2).detach()


__all__ = ["derivatives", "jacobians", "matrix_scan", "newton_step", "settle", "solve"]
