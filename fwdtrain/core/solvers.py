"""Solvers: how one step of X and of its sensitivity Xtilde = dX/dtheta is taken.

A solver is the one-step map X_{n+1} = Phi(X_n, theta, dW_n, h) of a scheme, and its sensitivity
is the exact derivative of that map (discretise, then differentiate):

    Xtilde_{n+1} = Phi_x Xtilde_n + Phi_theta

so that with theta frozen the forward estimate equals backpropagation through the discrete chain,
for every solver. Each solver builds Phi from the problem's coefficients and their total
derivatives D h = h_x Xtilde + h_theta (``fwdtrain.core.sensitivity``), evaluated where the scheme
evaluates them:

- ``Euler()``, Euler-Maruyama (strong order 1/2, weak order 1), any noise, and jumps
  (``fwdtrain.core.jumps``: the term J = size(X, z) dN, taken at X = X(t-)):
      X' = X + mu h + sigma dW [+ J]
      Xtilde' = Xtilde + D mu h + sum_k D sigma_k dW^k [+ D J]
- ``Heun()``, predictor-corrector (weak order 2 for additive noise), sigma independent of x
  (it may depend on theta); two linearisations, at X and at the predictor X*:
      X* = X + mu(X) h + sigma dW,               Xtilde* = Xtilde + D mu(X) h + D sigma dW
      X' = X + (mu(X) + mu(X*)) h / 2 + sigma dW,
      Xtilde' = Xtilde + (D mu(X) + D mu(X*)) h / 2 + D sigma dW   (D mu(X*) along Xtilde*)
- ``Milstein()``, Ito Milstein (strong order 1), diagonal noise or one noise (m = 1):
      X' = X + mu h + sigma dW + g (dW^2 - h) / 2,      g the ``correction`` (``fwdtrain.core.problem``)
      Xtilde' = Xtilde + D mu h + D sigma dW + D g (dW^2 - h) / 2   (D g: a second derivative)

A solver's scheme is written once, over ``Dual`` numbers: a value of N particles with its tangent along
theta (a pytree shaped like Xtilde, or None for a constant). The same scheme then gives X_{n+1} alone
(theta frozen: every tangent None, nothing differentiated) or X_{n+1} and Xtilde_{n+1} (the tangent of
the map, which is Phi_x Xtilde + Phi_theta by the chain rule). It sees the problem through one function
``terms(x, x_tilde, names) -> (values, totals)`` of N particles (totals ``{}`` when x_tilde is None), so
calibration, the cost form, ensembles and the frozen-theta evaluation share it. A new scheme is one
subclass with a ``name``; it registers itself in ``SOLVERS``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from torch.func import jacrev

from ._tree import tree_map
from .sensitivity import Terms

TermsAt = Callable[[torch.Tensor, Any, tuple[str, ...]], tuple[Terms, Terms]]
NAMES = ("mu", "sigma", "cost")


def _scaled(leaf: torch.Tensor, factor: Any) -> torch.Tensor:
    """leaf (N, d, *s) times a number, a 0-d tensor or a (N, d) tensor broadcast over the parameter axes *s."""
    if isinstance(factor, torch.Tensor) and factor.ndim:
        return leaf * factor.reshape(factor.shape + (1,) * (leaf.ndim - factor.ndim))
    return leaf * factor


class Dual:
    """A value of N particles and its tangent along theta, ``tangent`` a pytree of leaves (N, d, *s) or None
    (a constant). Sums (``+``, ``-``) and scalings (``times``) act on both, in the order written, so a
    scheme written over duals gives the same floating-point operations as the map and its derivative
    written out by hand."""

    __slots__ = ("tangent", "value")

    def __init__(self, value: torch.Tensor, tangent: Any = None) -> None:
        self.value = value
        self.tangent = tangent

    def __add__(self, other: Dual) -> Dual:
        if self.tangent is None or other.tangent is None:
            tangent = self.tangent if other.tangent is None else other.tangent
        else:
            tangent = tree_map(torch.add, self.tangent, other.tangent)
        return Dual(self.value + other.value, tangent)

    def __sub__(self, other: Dual) -> Dual:
        return self + other.times(-1)

    def times(self, factor: Any) -> Dual:
        """Scaled by a constant: a number, a 0-d tensor or a (N, d) tensor (per particle and coordinate).
        A method, not ``*``: dynamo would send ``dual * tensor`` to the tensor's product."""
        tangent = None if self.tangent is None else tree_map(lambda leaf: _scaled(leaf, factor), self.tangent)
        return Dual(self.value * factor, tangent)

    def __repr__(self) -> str:
        return f"Dual(value={self.value!r}, tangent={'None' if self.tangent is None else '...'})"


def noise(sigma: Dual, dw: torch.Tensor) -> Dual:
    """sigma dW and its tangent sum_k D sigma_k dW^k: sigma (N, d) diagonal or (N, d, m), dW (N, m)."""
    diagonal = sigma.value.ndim == 2
    tangent = None
    if sigma.tangent is not None:
        tangent = tree_map(lambda d_s: noise_sensitivity_term(d_s, dw, diagonal), sigma.tangent)
    return Dual(noise_term(sigma.value, dw), tangent)


Evaluate = Callable[[Dual, tuple[str, ...]], dict[str, Dual]]


class Moved(NamedTuple):
    """What a solver's step gives: X_{n+1}, Xtilde_{n+1}, and the terms at time n (values, totals)
    from which the problem forms its gradient estimate (the cost's, or a calibration's observables)."""

    x: torch.Tensor
    x_tilde: Any
    value: Terms
    total: Terms


def noise_term(sigma: torch.Tensor, dw: torch.Tensor) -> torch.Tensor:
    """sigma dW for N particles: sigma (N, d) diagonal or (N, d, m), dW (N, m) -> (N, d)."""
    if sigma.ndim == 2:
        return sigma * dw
    return torch.einsum("ndm,nm->nd", sigma, dw)


def noise_sensitivity_term(d_sigma: torch.Tensor, dw: torch.Tensor, diagonal: bool) -> torch.Tensor:
    """sum_k D sigma_k dW^k for one parameter leaf: (N, d, [m,] *s) -> (N, d, *s)."""
    if diagonal:
        return d_sigma * dw.reshape(dw.shape + (1,) * (d_sigma.ndim - 2))
    return torch.einsum("ndm...,nm->nd...", d_sigma, dw)


SOLVERS: dict[str, type[Solver]] = {}  # name -> class, filled by ``Solver.__init_subclass__``


@dataclass(frozen=True)
class Solver(abc.ABC):
    """One step of X and Xtilde; subclasses define the scheme (see the module docstring).

    ``mode`` says how the total derivatives are computed: "reverse" (one pullback per output number),
    "forward" (one pass per parameter) or "auto" (the one with fewer passes). ``names`` are the terms
    the step needs at time n.
    """

    mode: str = "auto"
    name: ClassVar[str] = "solver"
    summary: ClassVar[str] = ""  # one line for the command line's help
    names: ClassVar[tuple[str, ...]] = NAMES
    takes_jumps: ClassVar[bool] = False  # whether the scheme adds the ``jump`` term an SDE with jumps gives it

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "reverse", "forward"):
            raise ValueError(
                f"{type(self).__name__}(mode=...) must be 'auto', 'reverse' or 'forward', got {self.mode!r}"
            )

    def check(self, sde: Any, theta: Any, x0: torch.Tensor) -> None:
        """Raise a clear ``ValueError`` if this scheme cannot integrate ``sde`` (checked at x0 (d,))."""
        if getattr(sde, "jumps", None) is not None and not self.takes_jumps:
            raise ValueError(
                f"{type(self).__name__}() does not take jumps (its order rests on continuous paths); "
                f"integrate an SDE with jumps by Euler()"
            )
        self.check_shape(sde.diffusion(theta, x0), sde.noise_type)

    def check_shape(self, sigma: torch.Tensor, noise_type: str | None) -> None:
        """Raise a clear ``ValueError`` for a diffusion of one particle (sigma (d,) or (d, m)) this
        scheme does not take; a structure check, cheap enough for every step."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass that names itself (``name = "..."`` in its body) is listed in ``SOLVERS``."""
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            SOLVERS[cls.name] = cls

    @abc.abstractmethod
    def scheme(self, evaluate: Evaluate, x: Dual, dw: torch.Tensor, dt: Any) -> tuple[Dual, dict[str, Dual]]:
        """The one-step map over duals: (X_{n+1}, the terms at time n), from ``evaluate(point, names)``, the
        named terms at N particles (``names`` among ``self.names``), each a ``Dual``."""

    def step(self, terms: TermsAt, x: torch.Tensor, x_tilde: Any, dw: torch.Tensor, dt: Any) -> Moved:
        """X_{n+1} and Xtilde_{n+1} of N particles, and the terms at time n (values, totals).

        ``terms(x, x_tilde, names) -> (values, totals)``; x_tilde None: theta frozen, Xtilde_{n+1} None and
        the totals ``{}``.
        """

        def evaluate(point: Dual, names: tuple[str, ...]) -> dict[str, Dual]:
            value, total = terms(point.value, point.tangent, names)
            return {name: Dual(v, total.get(name)) for name, v in value.items()}

        new, at = self.scheme(evaluate, Dual(x, x_tilde), dw, dt)
        value = {name: term.value for name, term in at.items()}
        total = {name: term.tangent for name, term in at.items() if term.tangent is not None}
        return Moved(new.value, new.tangent, value, total)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()" if self.mode == "auto" else f"{type(self).__name__}(mode={self.mode!r})"


@dataclass(frozen=True, repr=False)
class Euler(Solver):
    """Euler-Maruyama, the default solver:

        X' = X + mu h + sigma dW,      Xtilde' = Xtilde + D mu h + sum_k D sigma_k dW^k.

    Any noise (additive, diagonal, general), and jumps (``+ size(X, z) dN``, ``fwdtrain.Jumps``).
    Strong order 1/2 (1 for additive noise), weak order 1. One linearisation per step.

    Args:
        mode: How the total derivatives are computed: ``"reverse"`` (one pullback per output number),
            ``"forward"`` (one pass per parameter) or ``"auto"`` (the one with fewer passes).

    Raises:
        ValueError: An unknown ``mode``.
    """

    name: ClassVar[str] = "euler"
    summary: ClassVar[str] = "Euler-Maruyama (the default; any noise; jumps)"
    takes_jumps: ClassVar[bool] = True

    def scheme(self, evaluate: Evaluate, x: Dual, dw: torch.Tensor, dt: Any) -> tuple[Dual, dict[str, Dual]]:
        at = evaluate(x, NAMES)
        moved = x + at["mu"].times(dt) + noise(at["sigma"], dw)
        return (moved + at["jump"], at) if "jump" in at else (moved, at)


@dataclass(frozen=True, repr=False)
class Heun(Solver):
    """Heun's predictor-corrector, for a diffusion independent of x (it may depend on theta):

        X* = X + mu(X) h + sigma dW,   X' = X + (mu(X) + mu(X*)) h / 2 + sigma dW

    with the exact sensitivity of this map (two linearisations: at X, and at X* along Xtilde*).
    Weak order 2 for such noise (the stationary law's bias is O(h^2) instead of Euler's O(h)).

    Args:
        mode: ``"auto"``, ``"reverse"`` or ``"forward"``, as for ``Euler``.

    Raises:
        ValueError: (when a run or step starts) a diffusion that depends on x: the scheme would converge
            to the Stratonovich solution, not the Ito one.
    """

    name: ClassVar[str] = "heun"
    summary: ClassVar[str] = "predictor-corrector (weak order 2; a diffusion that does not depend on x)"

    def check(self, sde: Any, theta: Any, x0: torch.Tensor) -> None:
        super().check(sde, theta, x0)
        if sde.additive:
            return
        d_x = jacrev(sde.diffusion, argnums=1)(theta, x0)
        if bool((d_x != 0).any()):
            raise ValueError(
                f"Heun() needs a diffusion that does not depend on x (it may depend on theta): "
                f"its Ito limit differs otherwise. This diffusion depends on x at x0 (max |d sigma/dx| "
                f"= {float(d_x.abs().max()):.3g}); use Euler(), or Milstein() for diagonal noise"
            )

    def scheme(self, evaluate: Evaluate, x: Dual, dw: torch.Tensor, dt: Any) -> tuple[Dual, dict[str, Dual]]:
        at = evaluate(x, NAMES)
        shock = noise(at["sigma"], dw)
        predictor = x + at["mu"].times(dt) + shock
        corrector = evaluate(predictor, ("mu",))
        return x + (at["mu"] + corrector["mu"]).times(dt / 2) + shock, at


@dataclass(frozen=True, repr=False)
class Milstein(Solver):
    """Ito-Milstein, for diagonal noise (sigma (d,)) or a single noise (sigma (d, 1)):

        X'_i = X_i + mu_i h + sigma_i dW_i + g_i (dW_i^2 - h) / 2,   g_i = sigma_i d sigma_i / d x_i

    (for m = 1, g = (d sigma / d x) sigma and dW the one increment), with its exact sensitivity,
    which needs D g, a second derivative of sigma. Strong order 1, weak order 1. For noise declared additive
    (``noise_type="additive"``, any m) it is Euler. Its derivatives always take the generic route.

    Args:
        mode: ``"auto"``, ``"reverse"`` or ``"forward"``, as for ``Euler``.

    Raises:
        ValueError: (when a run or step starts) general noise with m > 1 (unless declared additive),
            whose Milstein scheme needs Levy areas.
    """

    name: ClassVar[str] = "milstein"
    summary: ClassVar[str] = "Ito-Milstein (strong order 1; diagonal or one noise)"
    names: ClassVar[tuple[str, ...]] = NAMES + ("correction",)

    def check_shape(self, sigma: torch.Tensor, noise_type: str | None) -> None:
        if sigma.ndim == 2 and sigma.shape[1] > 1 and noise_type != "additive":
            raise ValueError(
                f"Milstein() takes diagonal noise (a diffusion of shape (d,)) or a single noise "
                f"(d, 1); this diffusion has shape {tuple(sigma.shape)} (general noise, m = "
                f"{sigma.shape[1]}), whose Milstein scheme needs Levy areas: use Euler()"
            )

    def scheme(self, evaluate: Evaluate, x: Dual, dw: torch.Tensor, dt: Any) -> tuple[Dual, dict[str, Dual]]:
        at = evaluate(x, self.names)
        square = self._square(dw, dt, at["sigma"].value.ndim == 2)
        correction = at["correction"].times(0.5).times(square)
        return x + at["mu"].times(dt) + noise(at["sigma"], dw) + correction, at

    @staticmethod
    def _square(dw: torch.Tensor, dt: Any, diagonal: bool) -> torch.Tensor:
        """dW^2 - h per coordinate: (N, d) for diagonal noise, (N, 1) for one noise."""
        return dw * dw - dt if diagonal else dw[:, :1] * dw[:, :1] - dt


EULER = Euler()  # the default solver


def as_solver(solver: Solver | str | None) -> Solver:
    """A solver from what a user passes: a ``Solver``, its name (a key of ``SOLVERS``) or None (Euler)."""
    if solver is None:
        return EULER
    if isinstance(solver, str):
        if solver.lower() not in SOLVERS:
            raise ValueError(f"unknown solver {solver!r}; choose one of {sorted(SOLVERS)}")
        return SOLVERS[solver.lower()]()
    if not isinstance(solver, Solver):
        raise TypeError(
            f"solver must be a fwdtrain solver ({', '.join(cls.__name__ + '()' for cls in SOLVERS.values())}) "
            f"or its name ({', '.join(sorted(SOLVERS))}), got {type(solver).__name__}"
        )
    return solver


__all__ = [
    "SOLVERS",
    "Dual",
    "Euler",
    "Heun",
    "Milstein",
    "Moved",
    "Solver",
    "as_solver",
    "noise",
    "noise_sensitivity_term",
    "noise_term",
]
