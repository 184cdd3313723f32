"""Deprecated (goes in 0.6): the step-grid point processes of 0.4; ``fwdtrain.events`` (at ``fwdtrain.pointprocess``)
fits the same models from raw event times by the exact likelihood (``fit``, ``hawkes``, ``intensity_model``,
``simulate``, ``FitResult.stderr``). Importing this module warns.

Fitting an intensity model to observed events, online, by the point-process log-likelihood.

The model is a state Y (d,) driven by the events themselves, and an intensity of Y (a Hawkes process when
Y is the excitation of past events):

    dY = drift(theta, Y) dt + jump(theta, Y(t-), z) dN,    lambda = rate(theta, Y(t-))

On the step grid the observed data of step n are (dN_n, z_n), dN_n in {0, 1}: the log-probability of the
step's indicator under the model (``fwdtrain.core.jumps.likelihood``, the thinning the simulator draws by)

    l_n = dN_n log p_n + (1 - dN_n) log(1 - p_n),   p_n = 1 - exp(-lambda(Y_n) h)   (~ dN log(lambda h) - lambda h)

sums to the log-likelihood of the events, and its total derivative D l_n = l_Y Ytilde_n + l_theta needs the
sensitivity Ytilde = dY/dtheta, carried forward with the events fixed:
Ytilde_{n+1} = Ytilde_n + D drift h + D jump dN_n. The update is online maximum likelihood,
theta_{n+1} = theta_n + alpha(t_n) mean_paths D l_n (the loop's theta - alpha h G with G = -D l_n / h).

``IntensityFit(model)`` is the ``Trainable`` (the data as the run's noise, (steps, P, 1 + q) for P observed
paths), ``hawkes`` builds the exponential-kernel Hawkes model, ``simulate`` draws events from a model by the
library's own jump step, and ``standard_errors`` gives the fitted parameters' Monte Carlo errors from the
outer products of the score increments.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch

from ..core import _checks
from ..core._tree import flatten, leaves, tree_map, unflatten
from ..core.jumps import Jumps
from ..core.noise import Noise, NoiseLike, TensorNoise
from ..core.problem import SDE
from ..core.solvers import EULER
from ..core.state import State, init
from ..core.step import Events, StepInfo, draw_events, particle_terms
from ..optim import GradientTransformation
from .cost import check_training_state
from .trainable import Trainable

NAMES = ("mu", "sigma", "cost", "jump", "likelihood")

REPLACEMENT = (
    "fwdtrain.events (at fwdtrain.pointprocess): fit(model, times, end_time=T, method='online' | 'batch'), "
    "hawkes(), intensity_model(), simulate(), and FitResult.stderr"
)
warnings.warn(
    f"fwdtrain.problems.pointprocess (the step-grid point processes) goes in fwdtrain 0.6; use {REPLACEMENT}",
    DeprecationWarning,
    stacklevel=2,
)


def intensity_model(
    rate: Callable[[Any, torch.Tensor], torch.Tensor],
    drift: Callable[[Any, torch.Tensor], torch.Tensor] | None = None,
    jump: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    marks: torch.distributions.Distribution | None = None,
) -> SDE:
    """The model dY = drift dt + jump dN, lambda = rate(theta, Y), as an ``SDE`` with ``Jumps`` (no Brownian
    noise, no cost): ``rate(theta, y) -> 0-d``, ``drift(theta, y) -> (d,)`` (None: 0), ``jump(theta, y, z) ->
    (d,)`` (None: 0), ``marks`` as for ``Jumps``. The same object simulates (``simulate``) and is fitted."""
    if not callable(rate):
        raise TypeError(
            f"intensity_model(rate=...) must be a function (theta, y) -> 0-d tensor, got {type(rate).__name__}"
        )
    zero_drift = lambda theta, y: torch.zeros_like(y)
    zero_jump = lambda theta, y, z: torch.zeros_like(y)
    return SDE(
        zero_drift if drift is None else drift,
        lambda theta, y: torch.zeros_like(y),
        lambda theta, y: y.new_zeros(()),
        noise_type="additive",
        jumps=Jumps(zero_jump if jump is None else jump, rate, marks),
    )


def hawkes() -> SDE:
    """The Hawkes process of exponential kernel: lambda = mu + Y, dY = -beta Y dt + alpha dN, i.e.
    lambda(t) = mu + alpha sum_{t_i < t} exp(-beta (t - t_i)). theta = {"log_mu", "log_alpha", "log_beta"}
    (logarithms keep the parameters positive); stationary when alpha < beta, with mean intensity
    mu / (1 - alpha / beta)."""
    return intensity_model(
        rate=lambda theta, y: torch.exp(theta["log_mu"]) + y.sum(),
        drift=lambda theta, y: -torch.exp(theta["log_beta"]) * y,
        jump=lambda theta, y, z: torch.exp(theta["log_alpha"]) * torch.ones_like(y),
    )


def hawkes_theta(mu: float, alpha: float, beta: float, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    """The ``hawkes`` parameters of (mu, alpha, beta), as logarithms."""
    for name, value in (("mu", mu), ("alpha", alpha), ("beta", beta)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"hawkes_theta needs {name} > 0, got {value!r}")
    return {
        key: torch.tensor(math.log(v), dtype=dtype)
        for key, v in (("log_mu", mu), ("log_alpha", alpha), ("log_beta", beta))
    }


def simulate(
    model: SDE, theta: Any, y0: torch.Tensor, steps: int, dt: float, paths: int = 1, seed: int = 0
) -> torch.Tensor:
    """Events of P independent paths of ``model`` by the library's jump step (thinning on the grid), theta
    fixed: the data ``IntensityFit`` takes, shape (steps, P, 1 + q), column 0 dN_n and the rest the marks."""
    _checks.check_count(steps, "steps")
    _checks.check_dt(dt)
    jumps = model.jumps
    assert jumps is not None
    generator = torch.Generator(device=y0.device).manual_seed(seed)
    y = y0.expand(paths, -1).clone()
    data = []
    m = y.shape[1]
    for _ in range(steps):
        normals = torch.randn((paths, jumps.width), generator=generator, dtype=y.dtype, device=y.device)
        events = draw_events(model, theta, y, normals * math.sqrt(dt), dt)
        marks = events.z.reshape(paths, -1) if jumps.marks is not None else events.z.new_zeros((paths, 0))
        data.append(torch.cat([events.dn[:, None], marks], dim=1))
        terms = particle_terms(model, theta, None, events, dt)
        y = EULER.step(terms, y, None, y.new_zeros((paths, m)), dt).x
    return torch.stack(data)


@dataclass(frozen=True)
class IntensityFit(Trainable):
    """Online maximum likelihood of an intensity model (``intensity_model``, ``hawkes``) from observed events.

    The loop's state is ``State(x=Y (P, d), x_tilde=Ytilde, theta, t)`` (``start``); the "noise" of step n is
    the data (P, 1 + q): dN_n and the marks of P observed paths, ``events`` (steps, P, 1 + q) when given here
    (then ``run`` needs no ``noise=``), else pass them as ``noise=``. The recorded cost is -mean l_n / h.
    """

    model: SDE
    optimizer: GradientTransformation | None = None
    events: torch.Tensor | None = None

    def __post_init__(self) -> None:
        jumps = getattr(self.model, "jumps", None)
        if not isinstance(self.model, SDE) or jumps is None or jumps.constant:
            raise TypeError(
                "IntensityFit(model) needs an intensity model with a rate that depends on theta "
                "(fwdtrain.pointprocess.intensity_model or hawkes)"
            )

    def start(self, theta: Any, y0: torch.Tensor, paths: int = 1) -> State:
        """The state at t = 0 for P observed paths, all at y0 (d,), Ytilde = 0."""
        return init(self.model, theta, y0, paths)._replace(score=())

    def check(self, state: State, dt: Any, lr: Any) -> None:
        if not isinstance(state, State):
            raise TypeError(f"expected a fwdtrain.State (from IntensityFit.start), got {type(state).__name__}")
        _checks.check_dt(dt)
        _checks.check_lr(lr)
        _checks.check_same_structure(state.x_tilde, state.theta, "state.x_tilde", "state.theta")
        check_training_state(state, self.optimizer)
        if self.events is not None:
            data = _checks.check_tensor(self.events, "events", state.x.dtype, state.x.device)
            check_events(data, self.noise_shape(state))

    def plan(self, state: State, mode: str = "auto") -> Hashable:
        return self.model.plan_at(state.theta, state.x[0], mode, names=NAMES)

    def noise_shape(self, state: State) -> tuple[int, ...]:
        """(P, 1 + q): each path's dN_n and mark."""
        assert self.model.jumps is not None
        return (state.particles, self.model.jumps.width)

    def noise_source(self, noise: NoiseLike | int, dt: Any, state: State, saved: dict | None) -> Noise:
        """The events given to the problem (for an int ``noise``), else the user's ``noise``."""
        if self.events is not None and isinstance(noise, int) and not isinstance(noise, bool):
            return TensorNoise(self.events).expect(tuple(self.noise_shape(state)), state.x.dtype, state.x.device)
        return super().noise_source(noise, dt, state, saved)

    def propagate(self, state: State, dw: torch.Tensor, dt: Any, plan: Any) -> tuple[State, StepInfo]:
        """Y, Ytilde to n + 1 with the observed events, and StepInfo(-mean l_n / h, G = -mean D l_n / h)."""
        moved, likelihood, total = self.score_step(state, dw, dt, plan)
        gradient = tree_map(lambda g: -g.mean(0) / dt, total)
        return state._replace(x=moved.x, x_tilde=moved.x_tilde), StepInfo(-likelihood.mean() / dt, gradient)

    def score_step(self, state: State, data: torch.Tensor, dt: Any, plan: Any) -> tuple[Any, torch.Tensor, Any]:
        """(the moved Y and Ytilde, l_n per path (P,), D l_n per path (leaves (P, *s))) for the data (P, 1 + q)."""
        assert self.model.jumps is not None
        paths = state.particles
        jumps = self.model.jumps
        marks = jumps.unit_marks(data) if jumps.marks is None else data[:, 1:].reshape(paths, *jumps.event_shape)
        events = Events(data[:, 0], marks)
        terms = particle_terms(self.model, state.theta, plan, events, dt)
        moved = EULER.step(terms, state.x, state.x_tilde, state.x.new_zeros(state.x.shape), dt)
        return moved, moved.value["likelihood"], moved.total["likelihood"]

    def nonfinite(self, state: State) -> str | None:
        return None


def check_events(data: torch.Tensor, shape: tuple[int, ...]) -> None:
    """Raise unless ``data`` is (steps, P, 1 + q) with a first column of 0s and 1s."""
    if data.ndim != 3 or tuple(data.shape[1:]) != tuple(shape):
        raise ValueError(
            f"events must have shape (steps, {shape[0]}, {shape[1]}) (dN and the marks), got {tuple(data.shape)}"
        )
    counts = data[..., 0]
    if not bool(((counts == 0) | (counts == 1)).all()):
        raise ValueError(
            "events[..., 0] must be 0 or 1 (at most one event per step): take a smaller dt, or bin the events "
            "with fwdtrain.pointprocess.bin_events"
        )


def bin_events(times: torch.Tensor, dt: float, steps: int, marks: torch.Tensor | None = None) -> torch.Tensor:
    """Observed event times (k,) (and their marks (k, q)) on the grid of ``steps`` steps of ``dt``: the data
    (steps, 1, 1 + q) of one path. Raises if two events fall in one step (take a smaller dt)."""
    _checks.check_dt(dt)
    index = torch.floor(times / dt).long()
    if bool((index < 0).any()) or bool((index >= steps).any()):
        raise ValueError(f"event times must lie in [0, steps * dt) = [0, {steps * dt:g})")
    if index.unique().numel() != index.numel():
        raise ValueError(f"two events fall in one step of dt = {dt:g}; take a smaller dt")
    q = 0 if marks is None else marks.reshape(times.shape[0], -1).shape[1]
    data = torch.zeros((steps, 1, 1 + q), dtype=times.dtype, device=times.device)
    data[index, 0, 0] = 1
    if marks is not None:
        data[index, 0, 1:] = marks.reshape(times.shape[0], -1).to(times.dtype)
    return data


def standard_errors(fit: IntensityFit, theta: Any, y0: torch.Tensor, data: torch.Tensor, dt: float) -> Any:
    """The Monte Carlo standard errors of the maximum-likelihood theta from the data (steps, P, 1 + q): the
    square roots of diag(I^-1), I = sum_{n, paths} D l_n D l_n^T the outer products of the score increments
    (a martingale's, so I estimates the Fisher information), evaluated at ``theta``. A pytree like theta."""
    state = fit.start(theta, y0, data.shape[1])
    plan = fit.plan(state)
    information = None
    for n in range(data.shape[0]):
        moved, _, total = fit.score_step(state, data[n], dt, plan)
        scores = torch.cat([leaf.reshape(leaf.shape[0], -1) for leaf in leaves(total)], dim=1)  # (P, p)
        outer = scores.T @ scores
        information = outer if information is None else information + outer
        state = state._replace(x=moved.x, x_tilde=moved.x_tilde)
    assert information is not None
    flat = torch.linalg.inv(information).diagonal().sqrt()
    parameters, spec = flatten(theta)
    pieces, start = [], 0
    for leaf in parameters:
        pieces.append(flat[start : start + leaf.numel()].reshape(leaf.shape))
        start += leaf.numel()
    return unflatten(spec, pieces)


__all__ = [
    "IntensityFit",
    "bin_events",
    "check_events",
    "hawkes",
    "hawkes_theta",
    "intensity_model",
    "simulate",
    "standard_errors",
]
