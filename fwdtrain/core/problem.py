"""What the SDE is: drift, diffusion and running cost of ONE particle.

    dX = mu(X, theta) dt + sigma(X, theta) dW,      cost c(X, theta)

with X in R^d, W an m-dimensional Brownian motion and theta a pytree. ``sigma`` is a (d, m)
matrix, or a (d,) vector for diagonal noise (m = d).

The noise type (torchsde's vocabulary) may be declared with ``noise_type=``:

- "additive": sigma depends on neither x nor theta, so D sigma = 0 and the step neither
  differentiates sigma nor forms sum_k D sigma_k dW^k; (d,) or (d, m).
- "diagonal": sigma is a (d,) vector, the diagonal of a d x d matrix (m = d).
- "general":  sigma is a (d, m) matrix.

None (the default) infers "diagonal" or "general" from sigma's shape. ``check_noise_type``
verifies a declaration at a point; ``fwdtrain.init`` calls it.

A problem evaluates its coefficients as named terms (``terms``) and linearises them along the
sensitivity (``linearise_terms``, see ``fwdtrain.core.sensitivity``); ``plan_at`` decides once how
(mode and route). Besides mu, sigma and c, a solver may ask for the Milstein ``correction``

    g_i = sigma_i d sigma_i / d x_i  (diagonal noise),   g = (d sigma / d x) sigma  (one noise, m = 1),

so that sum over the noise of (L^k sigma) (dW^2 - h) / 2 is g (dW^2 - h) / 2.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, get_args

import torch
from torch.func import jacfwd, jacrev, jvp

from .. import _compat
from ._tree import leaves_with_paths, size
from .jumps import Jumps, likelihood
from .sensitivity import (
    SENSITIVITY_ROUTES,
    Coefficients,
    Plan,
    Terms,
    Theta,
    linearise_generic,
    linearise_structured,
    resolve_mode,
    structured_pays,
)

Drift = Callable[[Theta, torch.Tensor], torch.Tensor]
Diffusion = Callable[[Theta, torch.Tensor], torch.Tensor]
Cost = Callable[[Theta, torch.Tensor], torch.Tensor]
Control = Callable[[Theta, torch.Tensor], torch.Tensor]
NoiseType = Literal["additive", "diagonal", "general"]
NOISE_TYPES: tuple[str, ...] = get_args(NoiseType)
JUMP_NAMES = ("jump", "likelihood")  # the terms of an event: size(X_n, z) dN and the indicator's log-probability


class Event(NamedTuple):
    """One particle's draws of a step: dN (0-d, 0 or 1), the mark z (*event_shape) and the step h."""

    dn: torch.Tensor
    z: torch.Tensor
    dt: Any


def _check_jumps(jumps: Any, owner: str) -> None:
    if jumps is not None and not isinstance(jumps, Jumps):
        raise TypeError(
            f"{owner}(jumps=...) must be a fwdtrain.Jumps(size, rate, marks) or None, got {type(jumps).__name__}"
        )


def _check_declared(noise_type: Any, owner: str) -> None:
    if noise_type is not None and noise_type not in NOISE_TYPES:
        raise ValueError(
            f"{owner}(noise_type=...) must be one of {NOISE_TYPES} or None (inferred from "
            f"the diffusion's shape), got {noise_type!r}"
        )


@dataclass(frozen=True)
class SDE:
    """A parametric SDE with a running cost, all functions of one particle:

        dX = mu(X, theta) dt + sigma(X, theta) dW,      running cost c(X, theta)

    with X in R^d, W an m-dimensional Brownian motion and theta a pytree of tensors (e.g. a dict).
    The three functions must be pure and built from torch operations (no ``.item()``, no in-place
    changes of their inputs), so that ``torch.func`` can differentiate them and ``vmap`` them over
    particles; they keep the dtype and device of x and theta.

    Args:
        drift: ``drift(theta, x) -> mu``, x of shape (d,), mu of shape (d,).
        diffusion: ``diffusion(theta, x) -> sigma``, a (d, m) matrix, or a (d,) vector for diagonal
            noise (m = d).
        cost: ``cost(theta, x) -> c``, a 0-d tensor (e.g. ``(x * x).sum()``).
        noise_type: Keyword only. ``"additive"`` (sigma depends on neither x nor theta: the step skips
            D sigma), ``"diagonal"`` ((d,) sigma), ``"general"`` ((d, m) sigma) or None (inferred from
            sigma's shape). ``fwdtrain.init`` checks a declaration at x0.
        jumps: Keyword only. A ``fwdtrain.Jumps(size, rate, marks)``: dX gains size(theta, X(t-), z) dN, N a
            point process of intensity ``rate`` with marks z (``fwdtrain.core.jumps``); None (default): none.

    Raises:
        TypeError: A function that is not callable; ``jumps`` not a ``Jumps``.
        ValueError: An unknown ``noise_type``.
    """

    drift: Drift
    diffusion: Diffusion
    cost: Cost
    noise_type: NoiseType | None = field(default=None, kw_only=True)
    jumps: Jumps | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        for name in ("drift", "diffusion", "cost"):
            if not callable(getattr(self, name)):
                raise TypeError(
                    f"SDE({name}=...) must be a function (theta, x) -> tensor, got {type(getattr(self, name)).__name__}"
                )
        _check_declared(self.noise_type, type(self).__name__)
        _check_jumps(self.jumps, type(self).__name__)

    def coefficients(self, theta: Theta, x: torch.Tensor) -> Coefficients:
        """The coefficients at one particle.

        Args:
            theta: The parameters.
            x: One particle, shape (d,).

        Returns:
            ``Coefficients(mu, sigma, cost)``: mu (d,), sigma (d, m) or (d,), cost 0-d.
        """
        return Coefficients(self.drift(theta, x), self.diffusion(theta, x), self.cost(theta, x))

    def parts(self) -> tuple[tuple[str, Callable[[Theta, torch.Tensor], torch.Tensor]], ...]:
        """The user's functions of (theta, x), named: drift, diffusion, cost (a control first, when there is one)."""
        return (("drift", self.drift), ("diffusion", self.diffusion), ("cost", self.cost))

    # ---- how the step sees the problem: named terms, their derivatives, and the plan ----
    @property
    def additive(self) -> bool:
        """sigma declared constant (``noise_type="additive"``): D sigma = 0 and no Milstein correction."""
        return self.noise_type == "additive"

    def jump_size(self, theta: Theta, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The jump (d,) at an event with mark z, from the state x (d,) before it: ``jumps.size(theta, x, z)``."""
        assert self.jumps is not None
        return self.jumps.size_of(theta, x, z, x=x)

    def jump_rate(self, theta: Theta, x: torch.Tensor) -> torch.Tensor:
        """The intensity lambda (0-d) at one particle x (d,): ``jumps.rate(theta, x)``, or the constant."""
        assert self.jumps is not None
        return self.jumps.rate_of(theta, x, like=x)

    def terms(self, theta: Theta, x: torch.Tensor, names: tuple[str, ...] = (), event: Event | None = None) -> Terms:
        """mu, sigma and cost at one particle x (d,), the ``correction`` when ``names`` asks for it, and for
        an ``event`` the ``jump`` size(x, z) dN and (when asked) the indicator's ``likelihood``."""
        value = dict(zip(("mu", "sigma", "cost"), self.coefficients(theta, x), strict=True))
        if "correction" in names:
            value["correction"] = milstein_correction(self.diffusion, theta, x, value["sigma"])
        if event is not None:
            value["jump"] = self.jump_size(theta, x, event.z) * event.dn
            if "likelihood" in names:
                value["likelihood"] = likelihood(event.dn, self.jump_rate(theta, x), event.dt)
        return value

    def differentiated(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The terms of ``names`` that have a derivative to compute (an additive sigma has none)."""
        return tuple(n for n in names if not (self.additive and n in ("sigma", "correction")))

    def linearise_terms(
        self,
        theta: Theta,
        x: torch.Tensor,
        x_tilde: Any,
        plan: Plan,
        names: tuple[str, ...],
        event: Event | None = None,
    ) -> tuple[Terms, Terms]:
        """(values, totals) at one particle: every term, and D h = h_x Xtilde + h_theta for h in ``names``."""
        return linearise_generic(
            lambda th, x_: self.terms(th, x_, names, event), theta, x, x_tilde, plan.mode, self.differentiated(names)
        )

    def output_count(self, theta: Theta, x: torch.Tensor, names: tuple[str, ...]) -> int:
        """n, the numbers a reverse pass pulls back for ``names`` at one particle (sigma's only when not additive)."""
        sigma = self.diffusion(theta, x)
        d = x.shape[-1]
        counts = {"mu": d, "sigma": sigma.numel(), "cost": 1, "correction": d, "jump": d, "likelihood": 1}
        return sum(counts[n] for n in self.differentiated(names))

    def plan_at(
        self,
        theta: Theta,
        x: torch.Tensor,
        mode: str = "auto",
        route: str = "auto",
        names: tuple[str, ...] = ("mu", "sigma", "cost"),
    ) -> Plan:
        """The mode ("auto": reverse when n <= p outputs than parameters, else forward) and route at x (d,);
        an SDE that is not a ``ControlledSDE`` has the generic route only (``route`` is then ignored). An
        SDE with jumps counts its event terms (``JUMP_NAMES``) among the outputs."""
        if route not in SENSITIVITY_ROUTES:
            raise ValueError(f"route must be one of {SENSITIVITY_ROUTES}, got {route!r}")
        if self.jumps is not None:
            extra = ("jump",) if self.jumps.constant else JUMP_NAMES
            names = names + tuple(n for n in extra if n not in names)
        return self.route_plan(theta, x, mode, route, names)

    def route_plan(self, theta: Theta, x: torch.Tensor, mode: str, route: str, names: tuple[str, ...]) -> Plan:
        """``plan_at`` for a checked ``route``: the generic route, the mode by output count."""
        return Plan(resolve_mode(mode, self.output_count(theta, x, names), size(theta)), "generic")


@dataclass(frozen=True, init=False)
class ControlledSDE(SDE):
    """A controlled SDE: the parameters enter through a control u = f(theta, x),

        dX = b(X, u) dt + s(X, u) dW,      running cost r(X, u),      u = f(theta, X).

    It *is* an ``SDE``: its ``drift``, ``diffusion`` and ``cost`` are the composed functions of
    (theta, x), so everything that takes an SDE takes it; the (x, u) functions are kept as
    ``controlled_drift``, ``controlled_diffusion`` and ``controlled_cost``. ``coefficients`` evaluates the
    control once per point. The step may take the structure-aware route: differentiate the control once,
    D u = u_x Xtilde + u_theta, then D b = b_x Xtilde + b_u D u (and likewise s, r), where that costs fewer
    flops than differentiating the composed functions (``plan_at``).

    Args:
        control: ``control(theta, x) -> u``, x of shape (d,), u of shape (k,) (e.g. ``ft.mlp(...).apply``).
        drift: ``b(x, u) -> (d,)``.
        diffusion: ``s(x, u) -> (d, m)`` or (d,) for diagonal noise.
        cost: ``r(x, u) -> 0-d``.
        noise_type: Keyword only, as for ``SDE``; ``"additive"`` means s depends on neither x nor u.
        jumps: Keyword only, as for ``SDE``, with ``size(x, u, z)`` and a rate that is a number or ``rate(x, u)``.

    Raises:
        TypeError: A function that is not callable.
        ValueError: An unknown ``noise_type``.
    """

    control: Control = field(default=None)  # type: ignore[assignment]
    controlled_drift: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(default=None, repr=False)  # type: ignore[assignment]
    controlled_diffusion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(default=None, repr=False)  # type: ignore[assignment]
    controlled_cost: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(default=None, repr=False)  # type: ignore[assignment]

    def __init__(
        self,
        control: Control,
        drift: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        diffusion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        cost: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        *,
        noise_type: NoiseType | None = None,
        jumps: Jumps | None = None,
    ) -> None:
        _check_declared(noise_type, "ControlledSDE")
        _check_jumps(jumps, "ControlledSDE")
        for name, fn in (("control", control), ("drift", drift), ("diffusion", diffusion), ("cost", cost)):
            if not callable(fn):
                raise TypeError(f"ControlledSDE({name}=...) must be a function, got {type(fn).__name__}")
        set_field = object.__setattr__
        set_field(self, "control", control)
        set_field(self, "controlled_drift", drift)
        set_field(self, "controlled_diffusion", diffusion)
        set_field(self, "controlled_cost", cost)
        set_field(self, "noise_type", noise_type)
        set_field(self, "jumps", jumps)
        set_field(self, "drift", lambda theta, x: drift(x, control(theta, x)))
        set_field(self, "diffusion", lambda theta, x: diffusion(x, control(theta, x)))
        set_field(self, "cost", lambda theta, x: cost(x, control(theta, x)))

    def coefficients(self, theta: Theta, x: torch.Tensor) -> Coefficients:
        u = self.control(theta, x)
        return Coefficients(self.controlled_drift(x, u), self.controlled_diffusion(x, u), self.controlled_cost(x, u))

    def parts(self) -> tuple[tuple[str, Callable[[Theta, torch.Tensor], torch.Tensor]], ...]:
        return (("control", self.control), *super().parts())

    def jump_size(self, theta: Theta, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``jumps.size(x, u, z)`` with u = control(theta, x), x the state before the jump."""
        assert self.jumps is not None
        return self.jumps.size_of(x, self.control(theta, x), z, x=x)

    def jump_rate(self, theta: Theta, x: torch.Tensor) -> torch.Tensor:
        """``jumps.rate(x, u)`` with u = control(theta, x), or the constant rate."""
        jumps = self.jumps
        assert jumps is not None
        return jumps.rate_of(x, None if jumps.constant else self.control(theta, x), like=x)

    def terms_xu(
        self, x: torch.Tensor, u: torch.Tensor, names: tuple[str, ...] = (), event: Event | None = None
    ) -> Terms:
        """b, s and r at (x, u): the theta-free functions the structure-aware route differentiates; for an
        ``event`` also the ``jump`` size(x, u, z) dN and (when asked) the indicator's ``likelihood``."""
        value = {
            "mu": self.controlled_drift(x, u),
            "sigma": self.controlled_diffusion(x, u),
            "cost": self.controlled_cost(x, u),
        }
        if event is not None:
            assert self.jumps is not None
            value["jump"] = self.jumps.size_of(x, u, event.z, x=x) * event.dn
            if "likelihood" in names:
                value["likelihood"] = likelihood(event.dn, self.jumps.rate_of(x, u, like=x), event.dt)
        return value

    def linearise_terms(
        self,
        theta: Theta,
        x: torch.Tensor,
        x_tilde: Any,
        plan: Plan,
        names: tuple[str, ...],
        event: Event | None = None,
    ) -> tuple[Terms, Terms]:
        """The generic route, or on ``plan.route == "structured"`` the control differentiated once."""
        if plan.route != "structured":
            return super().linearise_terms(theta, x, x_tilde, plan, names, event)
        return linearise_structured(
            self.control,
            lambda x_, u_: self.terms_xu(x_, u_, names, event),
            theta,
            x,
            x_tilde,
            plan.mode,
            self.differentiated(names),
        )

    def route_plan(self, theta: Theta, x: torch.Tensor, mode: str, route: str, names: tuple[str, ...]) -> Plan:
        """Mode and route at one particle x (d,). The structure-aware route is taken when forced
        (``route="structured"``) or, for "auto", when it costs fewer flops (``structured_pays``); with
        it, "auto" counts k control outputs per reverse pass. The Milstein correction (a derivative of
        sigma in x through the control) is differentiated on the generic route only."""
        if route == "structured" and "correction" in names:
            raise ValueError(
                "the Milstein correction is differentiated on the generic route only; "
                "use route='auto' or 'generic' with Milstein()"
            )
        if route == "generic" or "correction" in names:
            return super().route_plan(theta, x, mode, "generic", names)
        outputs = self.output_count(theta, x, names)
        k = self.control(theta, x).numel()
        if route == "auto" and mode in ("auto", "reverse") and structured_pays("reverse", k, x.shape[-1], outputs):
            resolved = resolve_mode(mode, k, size(theta))
        else:
            resolved = resolve_mode(mode, outputs, size(theta))
        structured = route == "structured" or structured_pays(resolved, k, x.shape[-1], outputs)
        return Plan(resolved, "structured" if structured else "generic")


def milstein_correction(
    diffusion: Callable[[Theta, torch.Tensor], torch.Tensor], theta: Theta, x: torch.Tensor, sigma: torch.Tensor
) -> torch.Tensor:
    """g (d,): sigma_i d sigma_i / d x_i for diagonal noise (sigma (d,)), (d sigma / d x) sigma for one
    noise (sigma (d, 1)); forward mode in x (reverse mode while dynamo traces), so it stays differentiable."""
    forward = _compat.forward_mode_traceable()
    if sigma.ndim == 1:
        jacobian = (jacfwd if forward else jacrev)(lambda x_: diffusion(theta, x_))(x)
        return sigma * _compat.in_dtype(jacobian.diagonal(), sigma.dtype)
    column = lambda x_: diffusion(theta, x_)[:, 0]
    if not forward:
        return jacrev(column)(x) @ sigma[:, 0]
    _, derivative = jvp(column, (x,), (sigma[:, 0],))  # type: ignore[misc]
    return _compat.in_dtype(derivative, sigma.dtype)


def inferred_noise_type(sigma: torch.Tensor) -> NoiseType:
    """ "diagonal" for a (d,) sigma of one particle, "general" for a (d, m) one."""
    return "diagonal" if sigma.ndim == 1 else "general"


def check_noise_type(sde: SDE, theta: Theta, x0: torch.Tensor) -> NoiseType:
    """The noise type of ``sde`` at one point x0 (d,): the declared one, checked, or the inferred one.

    "diagonal" needs a (d,) sigma and "general" a (d, m) one. "additive" needs
    sigma_x = 0 and sigma_theta = 0 at (x0, theta) (one ``jacrev``); a zero Jacobian
    at one point cannot prove sigma constant everywhere, so declare it only for a
    sigma that is constant by construction. Raises ValueError on a wrong declaration.
    """
    sigma = sde.diffusion(theta, x0)
    declared = sde.noise_type
    if declared is None:
        return inferred_noise_type(sigma)
    shape = tuple(sigma.shape)
    if declared == "diagonal" and sigma.ndim != 1:
        raise ValueError(
            f"noise_type='diagonal' but the diffusion returned shape {shape}; a diagonal "
            f"diffusion returns the ({x0.shape[-1]},) diagonal, or declare noise_type='general'"
        )
    if declared == "general" and sigma.ndim != 2:
        raise ValueError(
            f"noise_type='general' but the diffusion returned shape {shape}; a general "
            f"diffusion returns a (d, m) matrix, or declare noise_type='diagonal'"
        )
    if declared == "additive":
        d_theta, d_x = jacrev(sde.diffusion, argnums=(0, 1))(theta, x0)
        for name, jacobian in (("x", d_x), *((f"theta{path}", leaf) for path, leaf in leaves_with_paths(d_theta))):
            if bool((jacobian != 0).any()):
                raise ValueError(
                    f"noise_type='additive' but the diffusion depends on {name}: its derivative "
                    f"at x0 is not zero (max |.| = {float(jacobian.abs().max()):.3g}); declare "
                    f"noise_type=None (inferred) or make sigma a constant"
                )
    return declared
