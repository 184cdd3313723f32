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
from ._tree import contract, flatten, leaves, tree_map, unflatten

Theta = Any  # a pytree (dict, list, tuple, NamedTuple) of tensors
Terms = dict[str, torch.Tensor]  # named coefficients of one particle (or of N particles, each with a leading N)
TermsFn = Callable[[Theta, torch.Tensor], Terms]

Mode = Literal["auto", "reverse", "forward"]
MODES: tuple[str, ...] = get_args(Mode)
SensitivityRoute = Literal["auto", "structured", "generic"]
SENSITIVITY_ROUTES: tuple[str, ...] = get_args(SensitivityRoute)


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
) -> tuple[tuple[list[torch.Tensor], ...], tuple[torch.Tensor, ...], Any]:
    """The Jacobian of fn -> (outputs tuple, aux) w.r.t. every argument: (J, outputs, aux) with J[j] one
    block (n, numel) per leaf of argument j (a pytree, in ``flatten`` order), n the output numbers (outputs
    raveled and concatenated). Blocks per leaf, not one matrix per argument: a traced graph contracts each
    block where it is made, where a concatenation would copy every particle's rows (30% of the compiled
    N = 10^4 seed step).

    One pullback per output number: a Python loop for up to ``UNROLLED_ROWS`` numbers (in eager mode a
    vmap over the basis costs more than a few pullbacks), a ``vmap`` over the basis beyond. Outside every
    transform and trace the pullbacks are ``torch.autograd``'s on detached copies of the arguments (a third
    of the cost of ``vjp``'s wrapping at one particle); inside, ``torch.func.vjp``'s, so it stays
    transformable. Shapes alone decide. Nothing it returns has a ``grad_fn``.
    """
    if not (compat.transforms_active() or compat.tracing()):
        return _reverse_jacobian_eager(fn, *args)

    def flat(*args_: Any) -> tuple[torch.Tensor, tuple[tuple[torch.Tensor, ...], Any]]:
        outputs, aux = fn(*args_)
        return _ravel(outputs), (outputs, aux)

    y, pullback, (outputs, aux) = vjp(flat, *args, has_aux=True)  # type: ignore[misc]  # torch's stub lacks has_aux
    count = y.numel()
    basis = torch.eye(count, dtype=y.dtype, device=y.device)
    if count <= UNROLLED_ROWS:
        rows = [leaves(pullback(e)) for e in basis]
        blocks = [torch.stack([row[i].reshape(-1) for row in rows]) for i in range(len(rows[0]))]
    else:
        blocks = [leaf.reshape(count, -1) for leaf in leaves(vmap(pullback)(basis))]
    return _per_argument(blocks, [len(leaves(arg)) for arg in args]), outputs, aux


def _ravel(tensors: Any) -> torch.Tensor:
    """The numbers of a sequence of tensors in one vector (a lone tensor: a view of it)."""
    if len(tensors) == 1:
        return tensors[0].reshape(-1)
    return torch.cat([t.reshape(-1) for t in tensors])


def _per_argument(blocks: list[torch.Tensor], counts: list[int]) -> tuple[list[torch.Tensor], ...]:
    """The blocks of every leaf grouped by argument, ``counts[j]`` leaves for argument j."""
    grouped, start = [], 0
    for count in counts:
        grouped.append(blocks[start : start + count])
        start += count
    return tuple(grouped)


def _reverse_jacobian_eager(
    fn: Callable[..., tuple[tuple[torch.Tensor, ...], Any]], *args: Any
) -> tuple[tuple[list[torch.Tensor], ...], tuple[torch.Tensor, ...], Any]:
    """``reverse_jacobian`` outside every transform and trace, by ``torch.autograd.grad`` on detached leaves.

    Each output is pulled back on its own (a scalar with a seed of one, a vector number by number): the
    engine walks only the part of the graph that output depends on, where a pullback of all outputs
    concatenated walks every part with zeros (twice the cost for the 1-D LQR's drift and cost)."""
    inputs, at, counts = [], [], []
    with torch.enable_grad():
        for arg in args:
            if isinstance(arg, torch.Tensor):  # a lone tensor needs no pytree round trip
                leaf = arg.detach().requires_grad_()
                inputs.append(leaf)
                at.append(leaf)
                counts.append(1)
                continue
            arg_leaves, spec = flatten(arg)
            copies = [leaf.detach().requires_grad_() for leaf in arg_leaves]
            inputs.extend(copies)
            at.append(unflatten(spec, copies))
            counts.append(len(copies))
        outputs, aux = fn(*at)
        seeded = [(out.reshape(-1), i) for out in outputs for i in range(out.numel())]
        rows = [_pullback(y, i, inputs, retain=j < len(seeded) - 1) for j, (y, i) in enumerate(seeded)]
    if len(rows) == 1:
        blocks = [g.reshape(1, -1) for g in rows[0]]
    else:
        blocks = [torch.stack([row[i].reshape(-1) for row in rows]) for i in range(len(inputs))]
    return _per_argument(blocks, counts), tuple(out.detach() for out in outputs), _detached(aux)


def _pullback(y: torch.Tensor, i: int, inputs: list[torch.Tensor], retain: bool) -> list[torch.Tensor]:
    """Row i of the Jacobian of the vector y w.r.t. ``inputs``: one gradient per input (zeros where unused)."""
    if not y.requires_grad:
        return [torch.zeros_like(leaf) for leaf in inputs]
    if y.numel() == 1:
        seed = torch.ones_like(y)
    else:
        seed = torch.zeros_like(y)
        seed[i] = 1
    grads = compat.pullback(y, inputs, seed, retain)
    return [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(grads, inputs, strict=True)]


def _detached(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.detach()
    if isinstance(tree, dict):
        return {name: value.detach() for name, value in tree.items()}
    return tree_map(lambda v: v.detach() if isinstance(v, torch.Tensor) else v, tree)


def columns(x_tilde: Any) -> list[torch.Tensor]:
    """Xtilde of one particle as one (d, numel) matrix per leaf (d, *s), in theta's order."""
    tilde_leaves = leaves(x_tilde)
    d = tilde_leaves[0].shape[0]
    return [leaf.reshape(d, -1) for leaf in tilde_leaves]


def per_leaf(blocks: list[torch.Tensor], outer: tuple[int, ...], theta: Theta) -> Any:
    """Blocks (prod(outer), numel) of derivatives, one per leaf, as a pytree like theta with leaves (*outer, *s)."""
    theta_leaves, spec = flatten(theta)
    return unflatten(spec, [b.reshape(outer + leaf.shape) for b, leaf in zip(blocks, theta_leaves, strict=True)])


def per_output(
    total: list[torch.Tensor], outputs: tuple[torch.Tensor, ...], names: tuple[str, ...], theta: Theta
) -> dict[str, Any]:
    """D h of every named output from their rows, one block (n, numel) per leaf: name -> pytree like theta,
    leaves (*h.shape, *s)."""
    theta_leaves, spec = flatten(theta)
    if len(outputs) == 1:
        return {names[0]: per_leaf(total, outputs[0].shape, theta)}
    sizes = [out.numel() for out in outputs]
    cut = [block.split(sizes, 0) for block in total]  # per leaf, per output
    return {
        name: unflatten(spec, [cut[j][i].reshape(out.shape + leaf.shape) for j, leaf in enumerate(theta_leaves)])
        for i, (name, out) in enumerate(zip(names, outputs, strict=True))
    }


def shifted(x: torch.Tensor, x_tilde: Any, theta: Theta, theta_prime: Theta) -> torch.Tensor:
    """X + Xtilde (theta' - theta): the point that moves with theta' along the sensitivity, whose derivative in
    theta' at theta' = theta is Xtilde (what forward mode pushes each parameter through)."""
    return x + contract(x_tilde, tree_map(torch.sub, theta_prime, theta))


def linearise_generic(
    fn: TermsFn, theta: Theta, x: torch.Tensor, x_tilde: Any, mode: str, names: tuple[str, ...]
) -> tuple[Terms, Terms]:
    """(values, totals) at one particle: ``fn(theta, x)``'s terms, and D h for h in ``names``.

    reverse: D h = h_theta + h_x Xtilde from the partial Jacobians over (theta, x), as rows (n, numel) per
    leaf and (n, d): one matrix product per leaf for every term at once;
    forward: ``jacfwd`` of theta' -> h(x + Xtilde (theta' - theta), theta').
    """
    if mode == "reverse":

        def evaluate(theta_: Theta, x_: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], Terms]:
            out = fn(theta_, x_)
            return tuple(out[name] for name in names), out

        (h_theta, (h_x,)), outputs, value = reverse_jacobian(evaluate, theta, x)
        total = [torch.addmm(ht, h_x, xt) for ht, xt in zip(h_theta, columns(x_tilde), strict=True)]
        return value, per_output(total, outputs, names, theta)

    def along_sensitivity(theta_prime: Theta) -> tuple[tuple[torch.Tensor, ...], Terms]:
        out = fn(theta_prime, shifted(x, x_tilde, theta, theta_prime))
        return tuple(out[name] for name in names), out

    totals, value = jacfwd(along_sensitivity, has_aux=True)(theta)
    return value, {name: compat.in_dtype(d, value[name].dtype) for name, d in zip(names, totals, strict=True)}


def control_rows(
    control: Callable[[Theta, torch.Tensor], torch.Tensor],
    theta: Theta,
    x: torch.Tensor,
    x_tilde: Any,
    mode: str = "reverse",
    x_tilde_blocks: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(u, D u) with D u = u_theta + u_x Xtilde as one (k, numel) block per leaf (k the control's numbers),
    one particle; ``x_tilde_blocks`` is ``columns(x_tilde)`` when the caller has it.

    reverse: ``reverse_jacobian`` over (theta, x), one pullback per control output;
    forward: ``jacfwd`` of theta' -> u(theta', x + Xtilde (theta' - theta)), one pass per parameter.
    """
    if mode == "reverse":

        def evaluate(theta_: Theta, x_: torch.Tensor) -> tuple[tuple[torch.Tensor], torch.Tensor]:
            u = control(theta_, x_)
            return (u,), u

        (u_theta, (u_x,)), _, u = reverse_jacobian(evaluate, theta, x)
        blocks = columns(x_tilde) if x_tilde_blocks is None else x_tilde_blocks
        return u, [torch.addmm(ut, u_x, xt) for ut, xt in zip(u_theta, blocks, strict=True)]

    def along_sensitivity(theta_prime: Theta) -> tuple[torch.Tensor, torch.Tensor]:
        u = control(theta_prime, shifted(x, x_tilde, theta, theta_prime))
        return u, u

    d_u, u = jacfwd(along_sensitivity, has_aux=True)(theta)
    d_u = compat.in_dtype(d_u, u.dtype)
    return u, [leaf.reshape(u.numel(), -1) for leaf in leaves(d_u)]


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
    ``terms_xu(x, u)`` named in ``names``, the control differentiated once (``control_rows``); every
    term's rows in one matrix product per argument."""
    x_tilde_blocks = columns(x_tilde)
    u, d_u = control_rows(control, theta, x, x_tilde, mode, x_tilde_blocks)

    def evaluate(x_: torch.Tensor, u_: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], Terms]:
        out = terms_xu(x_, u_)
        return tuple(out[name] for name in names), out

    ((h_x,), (h_u,)), outputs, value = reverse_jacobian(evaluate, x, u)
    total = [torch.addmm(h_x @ xt, h_u, du) for xt, du in zip(x_tilde_blocks, d_u, strict=True)]
    return value, per_output(total, outputs, names, theta)


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
    route: SensitivityRoute = "auto",
) -> Linearisation:
    """Coefficients of one particle x (d,) and their total derivatives along x_tilde (leaf s -> (d, *s)); for
    N particles x (N, d) and x_tilde leaves (N, d, *s), shared theta, one ``vmap`` (every tensor gains a
    leading N; an "auto" route decided once, at the first particle).

    ``problem`` is an ``SDE`` (or ``ControlledSDE``, whose ``route`` "auto" takes the structure-aware
    route where it pays, "structured" forces it) or a plain function (theta, x) -> (mu, sigma, c).
    ``mode`` is "reverse" or "forward". Returns ``Linearisation(Coefficients, Coefficients)``;
    ``total.sigma`` is None for a diffusion declared additive.
    """
    if route not in SENSITIVITY_ROUTES:
        raise ValueError(f"route must be one of {SENSITIVITY_ROUTES}, got {route!r}")
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
    "SENSITIVITY_ROUTES",
    "Coefficients",
    "Linearisation",
    "Mode",
    "Plan",
    "SensitivityRoute",
    "Terms",
    "columns",
    "control_rows",
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
