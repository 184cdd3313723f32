"""d-dimensional ergodic LQR with a linear or a neural-network control.

    dX = (A X + B u) dt + Sigma dW,   cost x'Qx + u'Ru,   u = f(theta, x)

The optimum is u = -K* x with K* = R^{-1} B' P, P the stabilising solution of the
continuous algebraic Riccati equation A'P + PA - P B R^{-1} B' P + Q = 0, and the
optimal stationary cost is trace(Sigma' P Sigma). A stable linear control
u = -K x costs exactly trace((Q + K'RK) S), where S is the stationary covariance:
(A - BK) S + S (A - BK)' + Sigma Sigma' = 0 (a Lyapunov equation).

scipy (``pip install 'fwdtrain[riccati]'``) is needed only for the references.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from ..core import schedules
from ..core.model import mlp
from ..core.problem import ControlledSDE
from ..driver.evaluate import stationary_cost
from ._example import Example, summary


class LQR(NamedTuple):
    """The matrices of an LQR problem (float64 numpy arrays): A (d,d), B (d,k), Q (d,d), R (k,k), Sigma (d,m)."""

    A: np.ndarray
    B: np.ndarray
    Q: np.ndarray
    R: np.ndarray
    Sigma: np.ndarray


class RiccatiSolution(NamedTuple):
    """P from the Riccati equation, the optimal gain K = R^{-1} B' P and the optimal cost trace(Sigma' P Sigma)."""

    P: np.ndarray
    gain: np.ndarray
    cost: float


def _scipy_linalg():
    try:
        import scipy.linalg
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the LQR references (Riccati and Lyapunov equations) need scipy: pip install 'fwdtrain[riccati]'"
        ) from error
    return scipy.linalg


def riccati(problem: LQR) -> RiccatiSolution:
    """Solve A'P + PA - P B R^{-1} B' P + Q = 0; K* = R^{-1} B' P; J* = trace(Sigma' P Sigma)."""
    linalg = _scipy_linalg()
    A, B, Q, R, Sigma = problem
    P = linalg.solve_continuous_are(A, B, Q, R)
    gain = np.linalg.solve(R, B.T @ P)
    return RiccatiSolution(P, gain, float(np.trace(Sigma.T @ P @ Sigma)))


def linear_control_cost(problem: LQR, gain: np.ndarray) -> float:
    """Exact stationary cost trace((Q + K'RK) S) of u = -K x, S from (A-BK) S + S (A-BK)' + Sigma Sigma' = 0.

    Raises ValueError if A - BK is not stable (no stationary distribution).
    """
    linalg = _scipy_linalg()
    A, B, Q, R, Sigma = problem
    gain = np.asarray(gain, dtype=np.float64)
    closed = A - B @ gain
    if np.linalg.eigvals(closed).real.max() >= 0:
        raise ValueError("A - B K is not stable: u = -K x has no stationary distribution")
    S = linalg.solve_continuous_lyapunov(closed, -Sigma @ Sigma.T)
    return float(np.trace((Q + gain.T @ R @ gain) @ S))


def linear_control_gradient(problem: LQR, gain: np.ndarray) -> np.ndarray:
    """Exact dJ/dK = 2 (R K - B' P_K) S_K of J(K) = linear_control_cost (Lyapunov equations for P_K and S_K).

    (A-BK)' P_K + P_K (A-BK) + Q + K'RK = 0 and (A-BK) S_K + S_K (A-BK)' + Sigma Sigma' = 0.
    """
    linalg = _scipy_linalg()
    A, B, Q, R, Sigma = problem
    closed = A - B @ gain
    S = linalg.solve_continuous_lyapunov(closed, -Sigma @ Sigma.T)
    P = linalg.solve_continuous_lyapunov(closed.T, -(Q + gain.T @ R @ gain))
    return 2.0 * (R @ gain - B.T @ P) @ S


def random_lqr(dim: int, seed: int = 0) -> LQR:
    """A generic, seeded LQR problem in R^dim: no matrix is diagonal or symmetric where it need not be.

    A = -I + 0.5 G / sqrt(d) (stable for moderate G), B = I + 0.4 G' / sqrt(d),
    Q = I + M M' / d, R = I + 0.5 N N' / d, Sigma = 0.6 I + 0.3 G'' / sqrt(d)
    with G, G', G'', M, N standard Gaussian (control and noise dimension d).
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be a positive integer, got {dim!r}")
    rng = np.random.default_rng(seed)
    scale = 1.0 / math.sqrt(dim)

    def gauss():
        return rng.standard_normal((dim, dim))

    eye = np.eye(dim)
    A = -eye + 0.5 * scale * gauss()
    B = eye + 0.4 * scale * gauss()
    M, N = gauss(), gauss()
    Q = eye + M @ M.T / dim
    R = eye + 0.5 * N @ N.T / dim
    Sigma = 0.6 * eye + 0.3 * scale * gauss()
    return LQR(A, B, Q, R, Sigma)


def lqr_sde(problem: LQR, control, dtype: torch.dtype = torch.float32) -> ControlledSDE:
    """The ControlledSDE dX = (A X + B u) dt + Sigma dW with cost x'Qx + u'Ru and u = control(theta, x)."""
    A, B, Q, R, Sigma = (torch.as_tensor(a, dtype=dtype) for a in problem)
    return ControlledSDE(
        control=control,
        drift=lambda x, u: A @ x + B @ u,
        diffusion=lambda x, u: Sigma,
        cost=lambda x, u: x @ Q @ x + u @ R @ u,
        noise_type="additive",
    )


def linear_control(theta, x):
    """u = -K x with theta = {"gain": K (k, d)}."""
    return -(theta["gain"] @ x)


def lqr_problem(
    lqr: LQR,
    *,
    control: str = "linear",
    hidden: int = 32,
    particles: int = 64,
    dt: float = 0.01,
    steps: int = 30_000,
    lr: float | None = None,
    decay: float = 15.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    name: str = "lqr-nd",
) -> Example:
    """An ``Example`` for the LQR problem ``lqr`` = (A, B, Q, R, Sigma) with a linear or an MLP control.

    control="linear": theta = {"gain": K}, u = -K x, started at K = 0 (A should be stable).
    control="mlp": u = f(theta, x), a d -> hidden -> hidden -> k tanh network (no output bias,
    small output layer so that u ~ 0 at the start).
    The learning rate is lr / (1 + t / decay) (lr defaults to 1.0 for linear, 0.3 for mlp).
    ``reference`` = {"cost": trace(Sigma' P Sigma), "gain_error": 0}; ``evaluate(theta)`` returns the
    stationary cost (exact from a Lyapunov equation for a linear control, Monte Carlo with
    h <= 0.005 over t = 40 and 1000 particles for an MLP)
    and the relative Frobenius error |K - K*| / |K*| of the gain (the MLP's Jacobian at x = 0).
    """
    problem = _checked(lqr)
    if control not in ("linear", "mlp"):
        raise ValueError(f"control must be 'linear' or 'mlp', got {control!r}")
    d, k = problem.B.shape
    if control == "linear":
        apply, theta = linear_control, {"gain": torch.zeros(k, d, dtype=dtype)}
    else:
        model = mlp(
            [d, hidden, hidden, k], activation="tanh", output_bias=False, seed=seed, dtype=dtype, output_scale=0.1
        )
        apply, theta = model.apply, model.theta
    sde = lqr_sde(problem, apply, dtype)
    if lr is None:
        lr = 1.0 if control == "linear" else 0.3
    solution = riccati(problem)
    return Example(
        name=name,
        sde=sde,
        theta=theta,
        x0=torch.zeros(d, dtype=dtype),
        particles=particles,
        dt=dt,
        steps=steps,
        lr=schedules.inverse_time(lr * decay, decay),
        reference={"cost": solution.cost, "gain_error": 0.0},
        evaluate=_evaluator(problem, solution, sde, apply, control == "linear", dt, seed),
    )


def _checked(lqr: LQR) -> LQR:
    """``lqr`` as float64 arrays, its shapes checked: A (d, d), B (d, k), Q (d, d), R (k, k), Sigma (d, m)."""
    problem = LQR(*(np.asarray(a, dtype=np.float64) for a in lqr))
    d, k = problem.B.shape
    if (
        problem.A.shape != (d, d)
        or problem.Q.shape != (d, d)
        or problem.R.shape != (k, k)
        or problem.Sigma.ndim != 2
        or problem.Sigma.shape[0] != d
    ):
        raise ValueError(
            f"LQR shapes must be A (d,d), B (d,k), Q (d,d), R (k,k), Sigma (d,m); got "
            f"{[tuple(a.shape) for a in problem]}"
        )
    return problem


def _evaluator(
    problem: LQR, solution: Any, sde: ControlledSDE, apply: Any, linear: bool, dt: float, seed: int
) -> Callable[..., dict[str, float]]:
    """``evaluate(theta)``: the stationary cost and the gain's relative error |K - K*| / |K*|."""
    d = problem.A.shape[0]

    def gain_of(theta) -> np.ndarray:
        if linear:
            return theta["gain"].double().numpy()
        zero = torch.zeros(d, dtype=next(iter(theta.values())).dtype)
        return -torch.func.jacrev(lambda x: apply(theta, x))(zero).double().numpy()

    def evaluate(theta, solver=None) -> dict[str, float]:
        gain = gain_of(theta)
        error = float(np.linalg.norm(gain - solution.gain) / np.linalg.norm(solution.gain))
        if linear:
            return {"cost": linear_control_cost(problem, gain), "gain_error": error}
        # Euler with step h biases a stationary cost by ~ +0.7 h relative (1.4% at h = 0.02 for
        # random_lqr(2)); evaluate at h <= 0.005 so the bias stays under 0.4%.
        h = min(dt, 0.005)
        zero = torch.zeros(d, dtype=next(iter(theta.values())).dtype)
        estimate = stationary_cost(
            sde, theta, zero, particles=1000, dt=h, steps=round(40 / h), burn_in=round(10 / h), seed=seed + 1
        )
        return {"cost": estimate.mean, "gain_error": error}

    return evaluate


@summary("a random d-dimensional ergodic LQR with a linear control, against the Riccati optimum")
def lqr_nd(
    *,
    dim: int = 2,
    control: str = "linear",
    hidden: int = 32,
    particles: int = 64,
    dt: float = 0.01,
    steps: int = 30_000,
    lr: float | None = None,
    decay: float = 15.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Example:
    """``lqr_problem`` on ``random_lqr(dim, seed)``: the CLI's "lqr-nd"."""
    return lqr_problem(
        random_lqr(dim, seed),
        control=control,
        hidden=hidden,
        particles=particles,
        dt=dt,
        steps=steps,
        lr=lr,
        decay=decay,
        seed=seed,
        dtype=dtype,
        name=f"lqr-nd (d={dim}, {control})",
    )
