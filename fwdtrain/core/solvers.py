"""Solvers: how one step of X and of its sensitivity Xtilde = dX/dtheta is taken.

A solver is the one-step map X_{n+1} = Phi(X_n, theta, dW_n, h) of a scheme, and its sensitivity
is the exact derivative of that map (discretise, then differentiate):

    Xtilde_{n+1} = Phi_x Xtilde_n + Phi_theta

so that with theta frozen the forward estimate equals backpropagation through the discrete chain,
for every solver. Each solver builds Phi from the problem's coefficients and their total
derivatives D h = h_x Xtilde + h_theta (``fwdtrain.core.sensitivity``), evaluated where the scheme
evaluates them:

- ``Euler()``, Euler-Maruyama (strong order 1/2, weak order 1), any noise:
      X' = X + mu h + sigma dW
      Xtilde' = Xtilde + D mu h + sum_k D sigma_k dW^k
- ``Heun()``, predictor-corrector (weak order 2 for additive noise), sigma independent of x
  (it may depend on theta); two linearisations, at X and at the predictor X*:
      X* = X + mu(X) h + sigma dW,               Xtilde* = Xtilde + D mu(X) h + D sigma dW
      X' = X + (mu(X) + mu(X*)) h / 2 + sigma dW,
      Xtilde' = Xtilde + (D mu(X) + D mu(X*)) h / 2 + D sigma dW   (D mu(X*) along Xtilde*)
- ``Milstein()``, Ito Milstein (strong order 1), diagonal noise or one noise (m = 1):
      X' = X + mu h + sigma dW + g (dW^2 - h) / 2,      g the ``correction`` (``fwdtrain.core.problem``)
      Xtilde' = Xtilde + D mu h + D sigma dW + D g (dW^2 - h) / 2   (D g: a second derivative)

A solver sees the problem through two functions of N particles: ``linearise(x, x_tilde, names)
-> (values, totals)`` and ``evaluate(x, names) -> values`` (theta frozen), so calibration, the
cost form, ensembles and the frozen-theta evaluation share it. A new scheme is one more subclass.
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

Linearise = Callable[[torch.Tensor, Any, tuple[str, ...]], tuple[Terms, Terms]]
Evaluate = Callable[[torch.Tensor, tuple[str, ...]], Terms]
NAMES = ("mu", "sigma", "cost")


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


def _noise_sensitivity(total: Terms, dw: torch.Tensor, diagonal: bool) -> Any:
    """sum_k D sigma_k dW^k per parameter leaf; None when sigma is additive (no D sigma)."""
    d_sigma = total.get("sigma")
    if d_sigma is None:
        return None
    return tree_map(lambda d_s: noise_sensitivity_term(d_s, dw, diagonal), d_sigma)


@dataclass(frozen=True)
class Solver(abc.ABC):
    """One step of X and Xtilde; subclasses define the scheme (see the module docstring).

    ``mode`` says how the total derivatives are computed: "reverse" (one pullback per output number),
    "forward" (one pass per parameter) or "auto" (the one with fewer passes). ``names`` are the terms
    the step needs at time n; ``stages`` the linearisations per step.
    """

    mode: str = "auto"
    name: ClassVar[str] = "solver"
    stages: ClassVar[int] = 1
    names: ClassVar[tuple[str, ...]] = NAMES

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "reverse", "forward"):
            raise ValueError(
                f"{type(self).__name__}(mode=...) must be 'auto', 'reverse' or 'forward', got {self.mode!r}"
            )

    def check(self, sde: Any, theta: Any, x0: torch.Tensor) -> None:
        """Raise a clear ``ValueError`` if this scheme cannot integrate ``sde`` (checked at x0 (d,))."""
        self.check_shape(sde.diffusion(theta, x0), sde.noise_type)

    def check_shape(self, sigma: torch.Tensor, noise_type: str | None) -> None:
        """Raise a clear ``ValueError`` for a diffusion of one particle (sigma (d,) or (d, m)) this
        scheme does not take; a structure check, cheap enough for every step."""

    @abc.abstractmethod
    def step(self, linearise: Linearise, x: torch.Tensor, x_tilde: Any, dw: torch.Tensor, dt: Any) -> Moved:
        """X_{n+1} and Xtilde_{n+1} of N particles, and the terms at time n."""

    @abc.abstractmethod
    def step_frozen(self, evaluate: Evaluate, x: torch.Tensor, dw: torch.Tensor, dt: Any) -> tuple[torch.Tensor, Terms]:
        """X_{n+1} with theta frozen (no sensitivity), and the terms at time n."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()" if self.mode == "auto" else f"{type(self).__name__}(mode={self.mode!r})"


@dataclass(frozen=True, repr=False)
class Euler(Solver):
    """Euler-Maruyama, the default solver:

        X' = X + mu h + sigma dW,      Xtilde' = Xtilde + D mu h + sum_k D sigma_k dW^k.

    Any noise (additive, diagonal, general). Strong order 1/2 (1 for additive noise), weak order 1.
    One linearisation per step.

    Args:
        mode: How the total derivatives are computed: ``"reverse"`` (one pullback per output number),
            ``"forward"`` (one pass per parameter) or ``"auto"`` (the one with fewer passes).

    Raises:
        ValueError: An unknown ``mode``.
    """

    name: ClassVar[str] = "euler"

    def step(self, linearise: Linearise, x: torch.Tensor, x_tilde: Any, dw: torch.Tensor, dt: Any) -> Moved:
        value, total = linearise(x, x_tilde, NAMES)
        diagonal = value["sigma"].ndim == 2
        new_x = x + value["mu"] * dt + noise_term(value["sigma"], dw)
        d_noise = _noise_sensitivity(total, dw, diagonal)
        if d_noise is None:
            new_x_tilde = tree_map(lambda xt, d_mu: xt + d_mu * dt, x_tilde, total["mu"])
        else:
            new_x_tilde = tree_map(lambda xt, d_mu, dn: xt + d_mu * dt + dn, x_tilde, total["mu"], d_noise)
        return Moved(new_x, new_x_tilde, value, total)

    def step_frozen(self, evaluate: Evaluate, x: torch.Tensor, dw: torch.Tensor, dt: Any) -> tuple[torch.Tensor, Terms]:
        value = evaluate(x, NAMES)
        return x + value["mu"] * dt + noise_term(value["sigma"], dw), value


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
    stages: ClassVar[int] = 2

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

    def step(self, linearise: Linearise, x: torch.Tensor, x_tilde: Any, dw: torch.Tensor, dt: Any) -> Moved:
        value, total = linearise(x, x_tilde, NAMES)
        diagonal = value["sigma"].ndim == 2
        noise = noise_term(value["sigma"], dw)
        d_noise = _noise_sensitivity(total, dw, diagonal)
        x_star = x + value["mu"] * dt + noise
        x_tilde_star = tree_map(lambda xt, d_mu: xt + d_mu * dt, x_tilde, total["mu"])
        if d_noise is not None:
            x_tilde_star = tree_map(torch.add, x_tilde_star, d_noise)
        corrector, corrector_total = linearise(x_star, x_tilde_star, ("mu",))
        half = dt / 2
        new_x = x + (value["mu"] + corrector["mu"]) * half + noise
        new_x_tilde = tree_map(lambda xt, a, b: xt + (a + b) * half, x_tilde, total["mu"], corrector_total["mu"])
        if d_noise is not None:
            new_x_tilde = tree_map(torch.add, new_x_tilde, d_noise)
        return Moved(new_x, new_x_tilde, value, total)

    def step_frozen(self, evaluate: Evaluate, x: torch.Tensor, dw: torch.Tensor, dt: Any) -> tuple[torch.Tensor, Terms]:
        value = evaluate(x, NAMES)
        noise = noise_term(value["sigma"], dw)
        corrector = evaluate(x + value["mu"] * dt + noise, ("mu",))
        return x + (value["mu"] + corrector["mu"]) * (dt / 2) + noise, value


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
    names: ClassVar[tuple[str, ...]] = NAMES + ("correction",)

    def check_shape(self, sigma: torch.Tensor, noise_type: str | None) -> None:
        if sigma.ndim == 2 and sigma.shape[1] > 1 and noise_type != "additive":
            raise ValueError(
                f"Milstein() takes diagonal noise (a diffusion of shape (d,)) or a single noise "
                f"(d, 1); this diffusion has shape {tuple(sigma.shape)} (general noise, m = "
                f"{sigma.shape[1]}), whose Milstein scheme needs Levy areas: use Euler()"
            )

    def step(self, linearise: Linearise, x: torch.Tensor, x_tilde: Any, dw: torch.Tensor, dt: Any) -> Moved:
        value, total = linearise(x, x_tilde, self.names)
        sigma = value["sigma"]
        diagonal = sigma.ndim == 2
        square = self._square(dw, dt, diagonal)
        new_x = x + value["mu"] * dt + noise_term(sigma, dw) + 0.5 * value["correction"] * square
        d_noise = _noise_sensitivity(total, dw, diagonal)
        if d_noise is None:  # additive: Euler
            new_x_tilde = tree_map(lambda xt, d_mu: xt + d_mu * dt, x_tilde, total["mu"])
            return Moved(new_x, new_x_tilde, value, total)
        new_x_tilde = tree_map(
            lambda xt, d_mu, dn, d_g: (
                xt + d_mu * dt + dn + 0.5 * d_g * square.reshape(square.shape + (1,) * (d_g.ndim - 2))
            ),
            x_tilde,
            total["mu"],
            d_noise,
            total["correction"],
        )
        return Moved(new_x, new_x_tilde, value, total)

    def step_frozen(self, evaluate: Evaluate, x: torch.Tensor, dw: torch.Tensor, dt: Any) -> tuple[torch.Tensor, Terms]:
        value = evaluate(x, self.names)
        sigma = value["sigma"]
        square = self._square(dw, dt, sigma.ndim == 2)
        return x + value["mu"] * dt + noise_term(sigma, dw) + 0.5 * value["correction"] * square, value

    @staticmethod
    def _square(dw: torch.Tensor, dt: Any, diagonal: bool) -> torch.Tensor:
        """dW^2 - h per coordinate: (N, d) for diagonal noise, (N, 1) for one noise."""
        return dw * dw - dt if diagonal else dw[:, :1] * dw[:, :1] - dt


EULER = Euler()  # the default solver
SOLVERS: dict[str, type[Solver]] = {"euler": Euler, "heun": Heun, "milstein": Milstein}


def as_solver(solver: Solver | str | None) -> Solver:
    """A solver from what a user passes: a ``Solver``, its name ("euler", "heun", "milstein") or None (Euler)."""
    if solver is None:
        return EULER
    if isinstance(solver, str):
        if solver.lower() not in SOLVERS:
            raise ValueError(f"unknown solver {solver!r}; choose one of {sorted(SOLVERS)}")
        return SOLVERS[solver.lower()]()
    if not isinstance(solver, Solver):
        raise TypeError(
            f"solver must be a fwdtrain solver (fwdtrain.Euler(), Heun(), Milstein()) or its name, "
            f"got {type(solver).__name__}"
        )
    return solver


__all__ = [
    "SOLVERS",
    "Euler",
    "Heun",
    "Milstein",
    "Moved",
    "Solver",
    "as_solver",
    "noise_sensitivity_term",
    "noise_term",
]
