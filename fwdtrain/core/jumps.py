"""Jumps: a marked point process added to the SDE, dX = mu dt + sigma dW + size(X(t-), z) dN.

N is a counting process of intensity lambda (a constant: compound Poisson; or lambda(theta, x)) and
z ~ ``marks`` the mark of an event. Conventions: Ito, the jump evaluated at the left limit X(t-).

On the step grid (step n covers [t_n, t_n + h)) the events are drawn by thinning, at most one per step:

    dN_n = 1[U_n < p_n],   p_n = 1 - exp(-lambda(X_n) h),   z_n ~ marks
    X_{n+1} = Euler(X_n) + size(X_n, z_n) dN_n

p_n is exactly the probability of at least one event of a Poisson clock of rate lambda(X_n) in the step,
so the scheme has weak order 1 like Euler's. U_n and z_n come from extra columns of the step's increment:
a jump SDE's increment has m + 1 + q columns, the Brownian dW (m) and w = 1 + q more, each N(0, h) like
dW; U = Phi(w_0 / sqrt(h)) and z is the mark made from the normals w_{1..q} / sqrt(h) (an affine map for
Normal and MultivariateNormal marks; for a finite support s_0 < ... < s_{K-1} (Bernoulli, Categorical), the
point s_k with k = #{j : F(s_j) < Phi(w)}; the inverse CDF otherwise). So every noise source, its position,
checkpoints and resume cover the jump draws, and a fixed increment fixes the events.

Sensitivities. With the events fixed, the jump's derivative is the chain's:
D(size dN) = (size_x Xtilde + size_theta) dN. A rate that depends on theta or x also moves the events; the
score of the event indicators (the likelihood ratio)

    l_n = dN_n log p_n + (1 - dN_n) log(1 - p_n) = dN_n log p_n - (1 - dN_n) lambda_n h,
    S_{n+1} = S_n + D l_n

is carried per particle beside Xtilde (``State.score``), and the cost's gradient estimate is
G_n = mean_i [D c(X_n^i) + c(X_n^i) S_n^i]: unbiased for the discrete chain's d/dtheta E[c(X_n)].
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import torch
from torch import distributions as dist

Size = Callable[..., torch.Tensor]
Rate = float | Callable[..., torch.Tensor]
_EDGE = 1e-12  # uniforms are kept in [EDGE, 1 - EDGE] so that an inverse CDF stays finite


def _affine(marks: dist.Distribution) -> bool:
    """True for marks made from standard normals by loc + scale z (no inverse CDF needed)."""
    if isinstance(marks, (dist.Normal, dist.MultivariateNormal)):
        return True
    return isinstance(marks, dist.Independent) and isinstance(marks.base_dist, dist.Normal)


def _discrete(base: dist.Distribution) -> bool:
    """True for marks of a finite support whose elements are numbers (Bernoulli, Categorical, Binomial)."""
    return bool(base.has_enumerate_support) and tuple(base.event_shape) == ()


def _counted(base: dist.Distribution, uniform: torch.Tensor) -> torch.Tensor:
    """Marks of a finite support from uniforms (N, *batch): the inverse CDF by counting, z = s_k with k the
    number of support points s_j (in order) whose CDF F(s_j) = P(z <= s_j) is below u, so P(z = s_k) = p_k."""
    support = base.enumerate_support(expand=True)  # (K, *batch)
    cdf = base.log_prob(support).exp().to(uniform.dtype).cumsum(0)
    below = (cdf.unsqueeze(0) < uniform.unsqueeze(1)).sum(1)  # (N, *batch)
    index = below.clamp(max=support.shape[0] - 1)  # u above a CDF that rounds below 1: the last point
    points = support.to(uniform.dtype).unsqueeze(0).expand(uniform.shape[0], *support.shape)
    return points.gather(1, index.unsqueeze(1)).squeeze(1)


def _check_marks(marks: Any) -> tuple[int, ...]:
    """The event shape of ``marks`` (() or (q,)), or a clear error for what cannot be drawn from normals."""
    if marks is None:
        return ()
    if not isinstance(marks, dist.Distribution):
        raise TypeError(
            f"Jumps(marks=...) must be a torch.distributions.Distribution (e.g. Normal(0., 1.), "
            f"Exponential(2.)) or None (no marks), got {type(marks).__name__}"
        )
    if tuple(marks.batch_shape) != () and not isinstance(marks, dist.Independent):
        raise ValueError(
            f"Jumps(marks=...) must describe one mark (batch shape ()), got batch shape {tuple(marks.batch_shape)}; "
            f"for a vector of independent marks use torch.distributions.Independent(base, 1)"
        )
    event = tuple(marks.event_shape)
    if len(event) > 1:
        raise ValueError(f"Jumps(marks=...) must have event shape () or (q,), got {event}")
    if not _affine(marks):
        base = marks.base_dist if isinstance(marks, dist.Independent) else marks
        if _discrete(base):
            return event
        try:
            base.icdf(torch.full(tuple(base.batch_shape), 0.5))
        except NotImplementedError:
            raise ValueError(
                f"Jumps(marks={type(base).__name__}(...)): fwdtrain draws marks from the run's normal stream, by "
                f"an affine map (Normal, MultivariateNormal), by counting a finite support's CDF (Bernoulli, "
                f"Categorical, Binomial) or by the inverse CDF, which {type(base).__name__} does not implement; use "
                f"a distribution with icdf (Exponential, Uniform, Laplace, Cauchy, ...) or a finite support"
            ) from None
    return event


def _positive(rate: Any) -> float:
    if isinstance(rate, bool) or not isinstance(rate, Real):
        raise TypeError(
            f"Jumps(rate=...) must be a positive number or a function (theta, x) -> 0-d tensor, "
            f"got {type(rate).__name__}"
        )
    if not (math.isfinite(float(rate)) and float(rate) > 0):
        raise ValueError(f"Jumps(rate=...) must be positive and finite, got {rate!r}")
    return float(rate)


@dataclass(frozen=True)
class Jumps:
    """A marked point process that jumps the state: dX = ... + size(X(t-), z) dN, N of intensity ``rate``.

    Args:
        size: The jump at an event: ``size(theta, x, z)`` for an ``SDE``, ``size(x, u, z)`` for a
            ``ControlledSDE``, shape (d,), x the state before the jump and z the event's mark. For a 1-D state
            a 0-d value is the jump of its one entry (``size=lambda x, u, z: z`` with a scalar mark).
        rate: The intensity lambda > 0: a number (compound Poisson, events independent of theta and x) or a
            function ``rate(theta, x)`` (``rate(x, u)`` for a ``ControlledSDE``) returning a 0-d tensor
            (e.g. through ``softplus`` to stay positive); its dependence on theta and x enters the gradient
            through the score of the events (see the module docstring).
        marks: A ``torch.distributions.Distribution`` of one mark, event shape () or (q,) (Normal,
            MultivariateNormal, Independent(Normal), any with an inverse CDF: Exponential, Uniform, ..., or
            a finite support: Bernoulli, Categorical, Binomial, drawn by counting its CDF; every mark is then a
            float of the state's dtype), or None: no marks (every z is then the 0-d tensor 1, so ``size`` is the
            jump itself).

    Raises:
        TypeError: ``size`` not callable, ``rate`` neither a number nor callable, ``marks`` not a distribution.
        ValueError: A rate <= 0, marks of event shape other than () or (q,), marks that cannot be drawn.
    """

    size: Size
    rate: Rate = 1.0
    marks: dist.Distribution | None = None
    event_shape: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not callable(self.size):
            raise TypeError(f"Jumps(size=...) must be a function (theta, x, z) -> (d,), got {type(self.size).__name__}")
        if not callable(self.rate):
            object.__setattr__(self, "rate", _positive(self.rate))
        object.__setattr__(self, "event_shape", _check_marks(self.marks))

    @property
    def constant(self) -> bool:
        """True for a number rate: the events depend on neither theta nor x (no score to carry)."""
        return not callable(self.rate)

    @property
    def width(self) -> int:
        """w = 1 + q, the columns the jumps take in a step's increment (one uniform, q mark numbers)."""
        return 1 + self.mark_numbers()

    def mark_numbers(self) -> int:
        """q, the numbers of one mark (0 without marks)."""
        return 0 if self.marks is None else math.prod(self.event_shape)

    def size_of(self, *args: Any, x: torch.Tensor) -> torch.Tensor:
        """The jump (d,) at one particle x (d,): ``size(*args)``, a 0-d value read as (1,) when d = 1."""
        value = self.size(*args)
        if isinstance(value, torch.Tensor) and value.dim() == 0 and x.shape[-1] == 1:
            return value.unsqueeze(-1)
        return value

    def unit_marks(self, like: torch.Tensor) -> torch.Tensor:
        """The marks of N events without a distribution: ones (N,) like ``like`` (N, ...)."""
        return like.new_ones(like.shape[:1])

    def draws(self, normals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(U (N,), z (N, *event_shape)) from standard normals (N, w): the thinning uniform and the marks."""
        u = torch.special.ndtr(normals[:, 0])
        z = normals[:, 1:]
        dtype = normals.dtype
        marks = self.marks
        if marks is None:
            return u, self.unit_marks(normals)
        if isinstance(marks, dist.MultivariateNormal):
            loc, tril = marks.loc.to(dtype), marks.scale_tril.to(dtype)
            return u, loc + z @ tril.T
        base = marks.base_dist if isinstance(marks, dist.Independent) else marks
        shaped = z.reshape(z.shape[0], *self.event_shape)
        if isinstance(base, dist.Normal):
            return u, base.loc.to(dtype) + base.scale.to(dtype) * shaped
        uniform = torch.special.ndtr(shaped).clamp(_EDGE, 1 - _EDGE)
        if _discrete(base):
            return u, _counted(base, uniform)
        return u, base.icdf(uniform).to(dtype)

    def rate_of(self, *args: Any, like: torch.Tensor) -> torch.Tensor:
        """lambda (0-d) at one particle: ``rate(*args)`` ((theta, x) for an ``SDE``, (x, u) for a
        ``ControlledSDE``), or the constant as a tensor of ``like``'s dtype and device (``args`` unused)."""
        rate = self.rate
        return rate(*args) if callable(rate) else torch.as_tensor(rate, dtype=like.dtype, device=like.device)

    def probability(self, rate: torch.Tensor, dt: Any) -> torch.Tensor:
        """p = 1 - exp(-lambda h): at least one event of a rate-lambda clock in a step."""
        return -torch.expm1(-rate * dt)


def likelihood(dn: torch.Tensor, rate: torch.Tensor, dt: Any) -> torch.Tensor:
    """l = dN log p + (1 - dN) log(1 - p), p = 1 - exp(-lambda h): the log-probability of the step's indicator.

    The log p branch is clamped away from log 0 so that its (unused) derivative stays finite where dN = 0."""
    p = -torch.expm1(-rate * dt)
    tiny = torch.finfo(p.dtype).tiny
    return torch.where(dn > 0, torch.log(p.clamp(min=tiny)), -rate * dt)


__all__ = ["Jumps", "likelihood"]
