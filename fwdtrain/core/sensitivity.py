"""Total derivatives of the coefficients along the sensitivity Xtilde = dX/dtheta.

For any h(x, theta) the derivative along the sensitivity is

    D h = h_x Xtilde + h_theta = d/dtheta' h(X + Xtilde (theta' - theta), theta') |_{theta'=theta}

The coefficients of one particle are named terms: ``mu`` (d,), ``sigma`` ((d, m), or (d,) for
diagonal noise), ``cost`` () and, for the Milstein scheme, ``correction`` (see
``fwdtrain.core.problem``). A problem evaluates them as a dict; the functions here
differentiate the terms asked for, in one of two routes and two modes (``torch.func``):

Generic (any coefficients function):

- reverse (``reverse_jacobian``: one vjp, one pullback per output number): the partial
  Jacobians h_x and h_theta in one pass over both arguments, then D h = h_x Xtilde + h_theta
  by one contraction. (Differentiating the composed function instead is the same maths, but
  under ``vmap`` its pullback through the shift Xtilde (theta' - theta) broadcasts Xtilde over
  the output basis: 10x slower on the 10-D benchmark.)
- forward (``jacfwd``, one forward pass per parameter): the composed function above, whose
  tangent along e_j is (Xtilde e_j, e_j), so no contraction at all.

Structure-aware (u = f(theta, x), mu = b(x, u), sigma = s(x, u), c = r(x, u)): the control is
differentiated once, D u = u_x Xtilde + u_theta (reverse: one pass per control output k;
forward: one per parameter), and then by the chain rule

    D b = b_x Xtilde + b_u D u,   D s = s_x Xtilde + s_u D u,   D r = r_x Xtilde + r_u D u

with the theta-free Jacobians of the (x, u) functions (one ``reverse_jacobian`` over (x, u)).

Which route pays: per particle and parameter the structured route costs k (B + d) + n (d + k)
flops against the generic n (B + d), with n output numbers and B ~ 3 the cost of one pullback
(``structured_pays``). Modes count passes through the theta-dependent function
(``resolve_mode``): reverse n (or k on the structured route), forward p.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple, Protocol, get_args

import torch
from torch.func import jacfwd, vjp, vmap

from .. import _compat as compat
from ._tree import contract, dot, flatten, tree_map, unflatten

Theta = Any  # a pytree (dict, list, tuple, NamedTuple) of tensors
Terms = dict[str, torch.Tensor]  # named coefficients of one particle (or of N particles, each with a leading N)
TermsFn = Callable[[Theta, torch.Tensor], Terms]

Mode = Literal["auto", "reverse", "forward"]
MODES: tuple[str, ...] = get_args(Mode)
Route = Literal["auto", "structured", "generic"]
ROUTES: tuple[str, ...] = get_args(Route)


class Coefficients(NamedTuple):
    """The SDE's coefficients at one point: mu (d,), sigma (d, m) or (d,), c ()."""

    mu: torch.Tensor
    sigma: torch.Tensor
    cost: torch.Tensor


class Linearisation(NamedTuple):
    """Coefficients at (x, theta) and their total derivatives D mu, D sigma, D c.

    For a parameter leaf of shape s: D mu (d, *s); D sigma (d, m, *s) or (d, *s) for diagonal
    noise; D c (*s). With particles every tensor gains a leading N. ``total.sigma`` is None when
    sigma is declared additive (D sigma = 0, not computed).
    """

    value: Coefficients
    total: Any  # Coefficients whose sigma may be None (additive noise: D sigma not computed)


class Plan(NamedTuple):
    """How a problem's coefficients are differentiated, decided once per run: ``mode`` ("reverse" or
    "forward") and ``route`` ("generic" or "structured")."""

    mode: str
    route: str = "generic"


class Linearisable(Protocol):
    """What ``linearise`` differentiates: a problem that evaluates and linearises its named terms."""

    def linearise_terms(
        self, theta: Theta, x: torch.Tensor, x_tilde: Any, plan: Plan, names: tuple[str, ...]
    ) -> tuple[Terms, Terms]: ...


UNROLLED_ROWS = 4  # up to this many output numbers, pull back row by row instead of under vmap
PULLBACK_COST = 3.0  # B: one pullback through the control costs ~ B flops per parameter


def reverse_jacobian(
    fn: Callable[..., tuple[tuple[torch.Tensor, ...], Any]], *args: Any
) -> tuple[tuple[tuple[Any, ...], ...], Any]:
    """``jacrev(fn, argnums=all, has_aux=True)(*args)`` for fn -> (outputs tuple, aux): (J, aux) with
    J[i][j] the Jacobian of output i w.r.t. argument j (a pytree: leaf s -> (*out_i.shape, *s)).

    One ``vjp``; its pullback once per output number: a Python loop for up to ``UNROLLED_ROWS``
    numbers (in eager mode a vmap over the basis costs more than a few pullbacks), a ``vmap``
    over the basis beyond. Shapes alone decide, so it stays transformable.
    """

    def flat(*args_: Any) -> tuple[torch.Tensor, tuple[tuple[torch.Tensor, ...], Any]]:
        outputs, aux = fn(*args_)
        return torch.cat([out.reshape(-1) for out in outputs]), (outputs, aux)

    if not (compat.transforms_active() or compat.tracing()):
        return _reverse_jacobian_eager(fn, *args)
    y, pullback, (outputs, aux) = vjp(flat, *args, has_aux=True)  # type: ignore[misc]  # torch's stub lacks has_aux
    basis = torch.eye(y.numel(), dtype=y.dtype, device=y.device)
    if y.numel() <= UNROLLED_ROWS:
        rows = tree_map(lambda *row: torch.stack(row), *[pullback(e) for e in basis])
    else:
        rows = vmap(pullback)(basis)
    sizes = [out.numel() for out in outputs]
    jacobians = tuple(
        tuple(
            tree_map(lambda leaf: leaf.split(sizes)[i].reshape(out.shape + leaf.shape[1:]), per_arg) for per_arg in rows
        )
        for i, out in enumerate(outputs)
    )
    return jacobians, aux


def _or_zeros(gradient: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like) if gradient is None else gradient


def _reverse_jacobian_eager(
    fn: Callable[..., tuple[tuple[torch.Tensor, ...], Any]], *args: Any
) -> tuple[tuple[tuple[Any, ...], ...], Any]:
    """``reverse_jacobian`` outside every transform and trace: the same pullbacks, taken by ``torch.autograd``
    on detached copies of the arguments (a third of the cost of ``vjp``'s wrapping at one particle, where the
    Python around a few small kernels is the step's cost). Nothing it returns has a ``grad_fn``."""
    leaves, spec = flatten(args)
    with torch.enable_grad():
        inputs = [leaf.detach().requires_grad_() for leaf in leaves]
        outputs, aux = fn(*unflatten(spec, inputs))
        y = torch.cat([out.reshape(-1) for out in outputs])
        count = y.numel()
        basis = torch.eye(count, dtype=y.dtype, device=y.device)
        rows = [
            torch.autograd.grad(y, inputs, e, retain_graph=i < count - 1, allow_unused=True)
            if y.requires_grad
            else (None,) * len(inputs)
            for i, e in enumerate(basis)
        ]
    per_input = [torch.stack([_or_zeros(row[j], leaf) for row in rows]) for j, leaf in enumerate(leaves)]
    per_arg = unflatten(spec, per_input)
    sizes = [out.numel() for out in outputs]
    jacobians = tuple(
        tuple(
            tree_map(lambda leaf: leaf.split(sizes)[i].reshape(out.shape + leaf.shape[1:]), arg_rows)
            for arg_rows in per_arg
        )
        for i, out in enumerate(outputs)
    )
    detach = lambda tree: tree_map(lambda v: v.detach() if isinstance(v, torch.Tensor) else v, tree)
    return jacobians, detach(aux)


def linearise_generic(
    fn: TermsFn, theta: Theta, x: torch.Tensor, x_tilde: Any, mode: str, names: tuple[str, ...]
) -> tuple[Terms, Terms]:
    """(values, totals) at one particle: ``fn(theta, x)``'s terms, and D h for h in ``names``.

    reverse: D h = h_x Xtilde + h_theta from the partial Jacobians over (theta, x);
    forward: ``jacfwd`` of theta' -> h(x + Xtilde (theta' - theta), theta').
    """
    if mode == "reverse":

        def evaluate(theta_: Theta, x_: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], Terms]:
            out = fn(theta_, x_)
            return tuple(out[name] for name in names), out

        jacobians, value = reverse_jacobian(evaluate, theta, x)
        total = {
            name: tree_map(lambda h_theta, xt: h_theta + dot(h_x, xt), h_theta_tree, x_tilde)
            for name, (h_theta_tree, h_x) in zip(names, jacobians, strict=True)
        }
        return value, total

    def along_sensitivity(theta_prime: Theta) -> tuple[tuple[torch.Tensor, ...], Terms]:
        shift = tree_map(torch.sub, theta_prime, theta)
        out = fn(theta_prime, x + contract(x_tilde, shift))
        return tuple(out[name] for name in names), out

    totals, value = jacfwd(along_sensitivity, has_aux=True)(theta)
    return value, {name: compat.in_dtype(d, value[name].dtype) for name, d in zip(names, totals, strict=True)}


def control_sensitivity(
    control: Callable[[Theta, torch.Tensor], torch.Tensor],
    theta: Theta,
    x: torch.Tensor,
    x_tilde: Any,
    mode: str = "reverse",
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
        return u, tree_map(lambda ut, xt: ut + dot(u_x, xt), u_theta, x_tilde)

    def along_sensitivity(theta_prime: Theta) -> tuple[torch.Tensor, torch.Tensor]:
        shift = tree_map(torch.sub, theta_prime, theta)
        u = control(theta_prime, x + contract(x_tilde, shift))
        return u, u

    d_u, u = jacfwd(along_sensitivity, has_aux=True)(theta)
    return u, compat.in_dtype(d_u, u.dtype)


def linearise_structured(
    control: Callable[[Theta, torch.Tensor], torch.Tensor],
    terms_xu: Callable[[torch.Tensor, torch.Tensor], Terms],
    theta: Theta,
    x: torch.Tensor,
    x_tilde: Any,
    mode: str,
    names: tuple[str, ...],
) -> tuple[Terms, Terms]:
    """The structure-aware route, one particle: D h = h_x Xtilde + h_u D u for the terms h of
    ``terms_xu(x, u)`` named in ``names``, the control differentiated once."""
    u, d_u = control_sensitivity(control, theta, x, x_tilde, mode)

    def evaluate(x_: torch.Tensor, u_: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], Terms]:
        out = terms_xu(x_, u_)
        return tuple(out[name] for name in names), out

    jacobians, value = reverse_jacobian(evaluate, x, u)
    total = {
        name: tree_map(lambda xt, du: dot(h_x, xt) + dot(h_u, du, u.ndim), x_tilde, d_u)
        for name, (h_x, h_u) in zip(names, jacobians, strict=True)
    }
    return value, total


def over_particles(
    linearise_one: Callable[[torch.Tensor, Any], tuple[Terms, Terms]], x: torch.Tensor, x_tilde: Any
) -> tuple[Terms, Terms]:
    """``linearise_one(x_i, x_tilde_i)`` for N particles x (N, d): one ``vmap``; none for a single
    eager particle (vmap's overhead is a third of an eager step at N = 1; in a traced graph the
    vmapped form compiles to the faster kernel)."""
    if x.shape[0] == 1 and not compat.tracing():
        value, total = linearise_one(x[0], tree_map(lambda leaf: leaf[0], x_tilde))
        return tree_map(lambda t: t.unsqueeze(0), value), tree_map(lambda t: t.unsqueeze(0), total)
    return vmap(linearise_one)(x, x_tilde)


def evaluate_particles(evaluate_one: Callable[[torch.Tensor], Terms], x: torch.Tensor) -> Terms:
    """``evaluate_one(x_i)`` for N particles x (N, d), one ``vmap`` (theta frozen, no derivatives)."""
    return vmap(evaluate_one)(x)


def structured_pays(mode: str, control_outputs: int, dim: int, outputs: int) -> bool:
    """Whether the structured route costs fewer flops than the generic one, per particle and parameter.

    Reverse: generic n (B + d) (n pullbacks through the network, then h_x Xtilde) against structured
    k (B + d) + n (d + k) (k pullbacks and D u, then h_x Xtilde + h_u D u): structured pays iff
    k (B + d) <= n (B - k), i.e. only for a control of k < B outputs (ties go to the structured route).
    Forward: both take p passes and the structured one adds the contractions: never.
    """
    if mode != "reverse":
        return False
    return control_outputs * (PULLBACK_COST + dim) <= outputs * (PULLBACK_COST - control_outputs)


def resolve_mode(mode: Mode | str, outputs: int, parameters: int) -> str:
    """``mode`` itself, or for "auto" the cheaper one: reverse costs one pass per output number,
    forward one per parameter."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode != "auto":
        return mode
    return "reverse" if outputs <= parameters else "forward"


def linearise(
    problem: Linearisable | Callable[[Theta, torch.Tensor], Any],
    theta: Theta,
    x: torch.Tensor,
    x_tilde: Any,
    mode: str = "reverse",
    route: Route = "auto",
) -> Linearisation:
    """Coefficients of one particle x (d,) and their total derivatives along x_tilde (leaf s -> (d, *s)); for
    N particles x (N, d) and x_tilde leaves (N, d, *s), shared theta, one ``vmap`` (every tensor gains a
    leading N; an "auto" route decided once, at the first particle).

    ``problem`` is an ``SDE`` (or ``ControlledSDE``, whose ``route`` "auto" takes the structure-aware
    route where it pays, "structured" forces it) or a plain function (theta, x) -> (mu, sigma, c).
    ``mode`` is "reverse" or "forward". Returns ``Linearisation(Coefficients, Coefficients)``;
    ``total.sigma`` is None for a diffusion declared additive.
    """
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    if mode not in ("reverse", "forward"):
        raise ValueError(f"mode must be 'reverse' or 'forward', got {mode!r}")
    if x.ndim == 2:
        return _linearise_particles(problem, theta, x, x_tilde, mode, route)
    if not hasattr(problem, "linearise_terms"):
        function = problem

        def terms(theta_: Theta, x_: torch.Tensor) -> Terms:
            return dict(zip(("mu", "sigma", "cost"), function(theta_, x_), strict=True))

        value, total = linearise_generic(terms, theta, x, x_tilde, mode, ("mu", "sigma", "cost"))
    else:
        plan = problem.plan_at(theta, x, mode, route)  # type: ignore[union-attr]
        value, total = problem.linearise_terms(theta, x, x_tilde, plan, ("mu", "sigma", "cost"))
    return Linearisation(
        Coefficients(value["mu"], value["sigma"], value["cost"]),
        Coefficients._make((total["mu"], total.get("sigma"), total["cost"])),
    )


def _linearise_particles(
    problem: Any, theta: Theta, x: torch.Tensor, x_tilde: Any, mode: str, route: str
) -> Linearisation:
    """``linearise`` for N particles x (N, d), shared theta: one ``vmap``; the "auto" route decided at the first."""
    if route == "auto" and hasattr(problem, "plan_at"):
        route = problem.plan_at(theta, x[0], mode, route).route

    def one(xi: torch.Tensor, xti: Any) -> tuple[Terms, Terms]:
        value, total = linearise(problem, theta, xi, xti, mode, route)  # type: ignore[arg-type]
        return dict(value._asdict()), {k: v for k, v in total._asdict().items() if v is not None}

    value, total = over_particles(one, x, x_tilde)
    return Linearisation(Coefficients(**value), Coefficients._make((total["mu"], total.get("sigma"), total["cost"])))


linearise_particles = linearise  # the same function: x (N, d) and x_tilde leaves (N, d, *s) give N particles


__all__ = [
    "MODES",
    "ROUTES",
    "Coefficients",
    "Linearisation",
    "Mode",
    "Plan",
    "Route",
    "Terms",
    "control_sensitivity",
    "evaluate_particles",
    "linearise",
    "linearise_generic",
    "linearise_particles",
    "linearise_structured",
    "over_particles",
    "resolve_mode",
    "reverse_jacobian",
    "structured_pays",
]
