"""Total derivatives of the coefficients along the sensitivity Xtilde = dX/dtheta.

For any h(x, theta) the derivative along the sensitivity is

    D h = h_x Xtilde + h_theta = d/dtheta' h(X + Xtilde (theta' - theta), theta') |_{theta'=theta}

Two routes, each in two modes (``torch.func``):

Generic (an ``SDE``, or any coefficients function): mu, sigma and c differentiated together.

- reverse (``reverse_jacobian``: one vjp, one pullback per output number): the partial
  Jacobians h_x and h_theta of (mu, sigma, c) in one pass over both arguments,
  then D h = h_x Xtilde + h_theta by one contraction. Differentiating the
  composed function instead is the same maths, but under ``vmap`` its backward
  pass through the shift Xtilde (theta' - theta) broadcasts Xtilde over the
  output basis: 10x slower for the 10-D benchmark, one thread
  (benchmarks/bench_strategies.py).
- forward (``jacfwd``, one forward pass per parameter): the composed function
  above, whose tangent along e_j is (Xtilde e_j, e_j), so no contraction at all.

Structure-aware (a ``ControlledSDE``: u = f(theta, x), mu = b(x, u), sigma = s(x, u), c = r(x, u)):
the control is differentiated once, D u = u_x Xtilde + u_theta (reverse: one pass per
control output k; forward: one per parameter p), and then by the chain rule

    D b = b_x Xtilde + b_u D u,   D s = s_x Xtilde + s_u D u,   D r = r_x Xtilde + r_u D u

with b_x, b_u, ... the Jacobians of the user's (x, u) functions: theta-free, small and
cheap (one ``reverse_jacobian`` over (x, u)). Only the control's passes touch the network.

Known zeros are skipped: with ``noise_type="additive"`` sigma is evaluated but never
differentiated, and ``total.sigma`` is None (the Euler update then drops its term).

Which route: the structured one saves pullbacks through the network (k instead of n) but adds
the contractions h_u D u; per parameter it costs k (B + d) + n (d + k) flops against the generic
n (B + d), B ~ 3 the cost of one pullback. It pays only for controls of fewer than B outputs with
many coefficient outputs (``structured_pays``), so ``route="auto"`` takes it there and the generic
route elsewhere (measured compiled: structured 1.6x faster on lqr-1d at N >= 100, generic 2.1x faster
on the 10-D LQR);
``route="structured"`` forces it. Modes ("auto", ``resolve_mode``) count passes through the
theta-dependent function: reverse n = d + numel(sigma) + 1 (numel(sigma) = 0 when additive) or k
on the structured route, forward p.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, NamedTuple, Union

import torch
from torch.func import jacfwd, vjp, vmap

from ._tree import contract, size, tree_map
from .problem import SDE, Coefficients, ControlledSDE, Theta

CoefficientsFn = Callable[[Theta, torch.Tensor], Coefficients]
Problem = Union[SDE, CoefficientsFn]

Mode = Literal["auto", "reverse", "forward"]
MODES = ("auto", "reverse", "forward")


class Linearisation(NamedTuple):
    """Coefficients at (x, theta) and their total derivatives D mu, D sigma, D c.

    For a parameter leaf of shape s: D mu (d, *s); D sigma (d, m, *s) or (d, *s)
    for diagonal noise; D c (*s). With particles every tensor gains a leading N.
    ``total.sigma`` is None when sigma is declared additive (D sigma = 0, not computed).
    """

    value: Coefficients
    total: Coefficients


UNROLLED_ROWS = 4  # up to this many output numbers, pull back row by row instead of under vmap


def reverse_jacobian(fn: Callable[..., tuple[tuple[torch.Tensor, ...], Any]], *args: Any
                     ) -> tuple[tuple[tuple[Any, ...], ...], Any]:
    """``jacrev(fn, argnums=all, has_aux=True)(*args)`` for fn -> (outputs tuple, aux): (J, aux) with
    J[i][j] the Jacobian of output i w.r.t. argument j (a pytree: leaf s -> (*out_i.shape, *s)).

    One ``vjp``; its pullback once per output number: a Python loop for up to
    ``UNROLLED_ROWS`` numbers (in eager mode a vmap over the basis costs more than
    a few pullbacks), a ``vmap`` over the basis beyond. Shapes only decide, so it stays
    transformable.
    """
    def flat(*args_: Any) -> tuple[torch.Tensor, tuple[tuple[torch.Tensor, ...], Any]]:
        outputs, aux = fn(*args_)
        return torch.cat([out.reshape(-1) for out in outputs]), (outputs, aux)

    y, pullback, (outputs, aux) = vjp(flat, *args, has_aux=True)
    basis = torch.eye(y.numel(), dtype=y.dtype, device=y.device)
    if y.numel() <= UNROLLED_ROWS:
        rows = tree_map(lambda *row: torch.stack(row), *[pullback(e) for e in basis])
    else:
        rows = vmap(pullback)(basis)
    sizes = [out.numel() for out in outputs]
    jacobians = tuple(
        tuple(tree_map(lambda leaf: leaf.split(sizes)[i].reshape(out.shape + leaf.shape[1:]), per_arg)
              for per_arg in rows)
        for i, out in enumerate(outputs)
    )
    return jacobians, aux


Route = Literal["auto", "structured", "generic"]
PULLBACK_COST = 3.0  # B: one pullback through the control costs ~ B flops per parameter (one forward, two backward)


def structured_pays(mode: str, control_outputs: int, dim: int, outputs: int) -> bool:
    """Whether the structured route costs fewer flops than the generic one, per particle and parameter p.

    Reverse: generic n (B + d) (n pullbacks through the network, then h_x Xtilde) against structured
    k (B + d) + n (d + k) (k pullbacks and D u, then h_x Xtilde + h_u D u): structured pays iff
    k (B + d) <= n (B - k), i.e. only for a control of k < B outputs (ties go to the structured route).
    Forward: both take p passes, the structured one adds the contractions: never.
    Measured (bench_step, compiled and fused, one thread): on lqr-1d (k = 1, n = 2, a tie in flops) the
    structured route ran 1.6x the generic one's particle-steps/s at N = 100 and N = 10^4 (equal at N = 1);
    on the 10-D LQR (k = 10, n = 21) the generic route ran 2.1x the structured one's.
    """
    if mode != "reverse":
        return False
    return control_outputs * (PULLBACK_COST + dim) <= outputs * (PULLBACK_COST - control_outputs)


def _structured(sde: ControlledSDE, theta: Theta, x: torch.Tensor, mode: str) -> bool:
    """``structured_pays`` for this ControlledSDE at one particle x (d,): k and n read off shapes (the
    control and diffusion evaluated once; dead code under torch.compile)."""
    u = sde.control(theta, x)
    sigma = 0 if sde.noise_type == "additive" else sde.controlled_diffusion(x, u).numel()
    return structured_pays(mode, u.numel(), x.shape[-1], x.shape[-1] + sigma + 1)


def linearise(
    problem: Problem,
    theta: Theta,
    x: torch.Tensor,
    x_tilde: Any,
    mode: Literal["reverse", "forward"] = "reverse",
    route: Route = "auto",
) -> Linearisation:
    """(mu, sigma, c) at (x, theta) and D(mu, sigma, c) along ``x_tilde``, one particle.

    ``problem`` is an ``SDE`` (an additive noise type skips D sigma) or a coefficients function
    (theta, x) -> (mu, sigma, c), differentiated as a whole (the generic route). A ``ControlledSDE``
    may take the structure-aware route instead: ``route="structured"``, or "auto" when
    ``structured_pays`` (rarely, for MLP controls: see there).
    """
    if route not in ("auto", "structured", "generic"):
        raise ValueError(f"route must be 'auto', 'structured' or 'generic', got {route!r}")
    if isinstance(problem, ControlledSDE) and (
            route == "structured" or (route == "auto" and _structured(problem, theta, x, mode))):
        return _linearise_controlled(problem, theta, x, x_tilde, mode)
    if isinstance(problem, SDE):
        coefficients, additive = problem.coefficients, problem.noise_type == "additive"
    else:
        coefficients, additive = problem, False
    if mode == "reverse":
        return _linearise_reverse(coefficients, theta, x, x_tilde, additive)
    return _linearise_forward(coefficients, theta, x, x_tilde, additive)


def _differentiated(value: Coefficients, additive: bool) -> tuple[torch.Tensor, ...]:
    """The coefficients to differentiate: (mu, sigma, c), or (mu, c) when sigma is additive."""
    return (value.mu, value.cost) if additive else tuple(value)


def _as_total(derivatives: tuple[Any, ...], additive: bool) -> Coefficients:
    """Coefficients(D mu, D sigma, D c) from ``_differentiated``'s order; D sigma None when additive."""
    if additive:
        return Coefficients(derivatives[0], None, derivatives[1])
    return Coefficients(*derivatives)


def _linearise_reverse(coefficients: CoefficientsFn, theta: Theta, x: torch.Tensor, x_tilde: Any,
                       additive: bool = False) -> Linearisation:
    """D h = h_x Xtilde + h_theta from the partial Jacobians over (theta, x) (``reverse_jacobian``)."""

    def evaluate(theta_: Theta, x_: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], Coefficients]:
        out = Coefficients(*coefficients(theta_, x_))
        return _differentiated(out, additive), out

    jacobians, value = reverse_jacobian(evaluate, theta, x)
    total = tuple(
        tree_map(lambda h_theta, xt: h_theta + torch.tensordot(h_x, xt, dims=1), h_theta_tree, x_tilde)
        for h_theta_tree, h_x in jacobians
    )
    return Linearisation(value, _as_total(total, additive))


def _linearise_forward(coefficients: CoefficientsFn, theta: Theta, x: torch.Tensor, x_tilde: Any,
                       additive: bool = False) -> Linearisation:
    """D h by ``jacfwd`` of the composed function theta' -> h(x + Xtilde (theta' - theta), theta')."""

    def along_sensitivity(theta_prime: Theta) -> tuple[tuple[torch.Tensor, ...], Coefficients]:
        shift = tree_map(torch.sub, theta_prime, theta)
        out = Coefficients(*coefficients(theta_prime, x + contract(x_tilde, shift)))
        return _differentiated(out, additive), out

    total, value = jacfwd(along_sensitivity, has_aux=True)(theta)
    return Linearisation(value, _as_total(tuple(total), additive))


def control_sensitivity(control: Callable[[Theta, torch.Tensor], torch.Tensor], theta: Theta,
                        x: torch.Tensor, x_tilde: Any, mode: Literal["reverse", "forward"] = "reverse",
                        ) -> tuple[torch.Tensor, Any]:
    """(u, D u) with D u = u_x Xtilde + u_theta, one particle; a leaf of shape s gives D u (*u.shape, *s).

    reverse: ``reverse_jacobian`` over (theta, x), one pullback per control output;
    forward: ``jacfwd`` of theta' -> u(theta', x + Xtilde (theta' - theta)), one pass per parameter.
    """
    if mode == "reverse":
        def evaluate(theta_: Theta, x_: torch.Tensor) -> tuple[tuple[torch.Tensor], torch.Tensor]:
            u = control(theta_, x_)
            return (u,), u

        ((u_theta, u_x),), u = reverse_jacobian(evaluate, theta, x)
        return u, tree_map(lambda ut, xt: ut + torch.tensordot(u_x, xt, dims=1), u_theta, x_tilde)

    def along_sensitivity(theta_prime: Theta) -> tuple[torch.Tensor, torch.Tensor]:
        shift = tree_map(torch.sub, theta_prime, theta)
        u = control(theta_prime, x + contract(x_tilde, shift))
        return u, u

    d_u, u = jacfwd(along_sensitivity, has_aux=True)(theta)
    return u, d_u


def _linearise_controlled(sde: ControlledSDE, theta: Theta, x: torch.Tensor, x_tilde: Any,
                          mode: Literal["reverse", "forward"]) -> Linearisation:
    """The structure-aware route: D h = h_x Xtilde + h_u D u for h in (b, s, r), the control differentiated once."""
    additive = sde.noise_type == "additive"
    u, d_u = control_sensitivity(sde.control, theta, x, x_tilde, mode)

    def evaluate(x_: torch.Tensor, u_: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], Coefficients]:
        out = Coefficients(sde.controlled_drift(x_, u_), sde.controlled_diffusion(x_, u_), sde.controlled_cost(x_, u_))
        return _differentiated(out, additive), out

    jacobians, value = reverse_jacobian(evaluate, x, u)
    total = tuple(
        tree_map(lambda xt, du: torch.tensordot(h_x, xt, dims=1) + torch.tensordot(h_u, du, dims=u.ndim),
                 x_tilde, d_u)
        for h_x, h_u in jacobians
    )
    return Linearisation(value, _as_total(total, additive))


def linearise_particles(
    problem: Problem,
    theta: Theta,
    x: torch.Tensor,
    x_tilde: Any,
    mode: Literal["reverse", "forward"] = "reverse",
    route: Route = "auto",
) -> Linearisation:
    """``linearise`` for N particles, ``x`` (N, d), shared ``theta``: one ``vmap`` (none for N = 1).
    An "auto" route is decided once, at the first particle."""
    if route == "auto" and isinstance(problem, ControlledSDE):
        route = "structured" if _structured(problem, theta, x[0], mode) else "generic"
    if x.shape[0] == 1 and not torch.compiler.is_compiling():
        # one eager particle: no vmap (its overhead is a third of an eager step at N = 1). Compiled, the
        # vmapped form is the faster graph (fused lqr-1d at N = 1: 24-30 us/step against 42 without vmap)
        value, total = linearise(problem, theta, x[0], tree_map(lambda leaf: leaf[0], x_tilde), mode, route)
        return Linearisation(tree_map(lambda t: t.unsqueeze(0), value), tree_map(lambda t: t.unsqueeze(0), total))

    additive = isinstance(problem, SDE) and problem.noise_type == "additive"

    def one_particle(xi: torch.Tensor, xti: Any) -> tuple[Coefficients, Coefficients]:
        value, total = linearise(problem, theta, xi, xti, mode, route)
        return value, total._replace(sigma=()) if additive else total  # vmap returns no None

    value, total = vmap(one_particle)(x, x_tilde)
    return Linearisation(value, total._replace(sigma=None) if additive else total)


def resolve_mode(mode: Mode, outputs: int, parameters: int) -> Literal["reverse", "forward"]:
    """``mode`` itself, or for "auto" the cheaper one: reverse mode costs one pass per output
    number, forward mode one per parameter."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode != "auto":
        return mode
    return "reverse" if outputs <= parameters else "forward"


def choose_mode(mode: Mode, theta: Theta, value: Coefficients) -> Literal["reverse", "forward"]:
    """``resolve_mode`` with outputs d + numel(sigma) + numel(c) read off evaluated coefficients."""
    return resolve_mode(mode, value.mu.numel() + value.sigma.numel() + value.cost.numel(), size(theta))
