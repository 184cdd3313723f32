"""The seed's 1-D problem written by hand in JAX, as a JAX user would specialise it.

    dX = (-X + u) dt + dW,   cost X^2 + u^2,   u = f(theta, X), f: 1 -> 16 -> 1 ReLU MLP (no output bias)

Unlike ``jax_impl`` (which does fwdtrain's generic work: the Jacobians of mu, sigma and c
of any SDE), this program uses what it knows about the problem: only the control u is
differentiated (one ``grad`` of the scalar u over (theta, x) per particle), the chain rule
is written out, the diffusion is the constant 1 (no sensitivity term), and the noise is
drawn inside the scan:

    Du     = u_x Xtilde + u_theta
    Xtilde <- Xtilde + (-Xtilde + Du) h
    G      = mean_i (2 X Xtilde + 2 u Du)
    X      <- X + (-X + u) h + dW,   theta <- theta - alpha(t) h G,   t <- t + h

Layout: x (N,), x_tilde a dict like theta with leaves (N, *s) (d = 1 is dropped); float32.
Needs ``jax`` (``pip install fwdtrain[jax]``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class HandState(NamedTuple):
    x: jax.Array  # (N,)
    x_tilde: Any  # dict like theta, leaves (N, *s)
    theta: Any  # {"weight0": (16, 1), "bias0": (16,), "weight1": (1, 16)}
    t: jax.Array  # ()


def control(theta: dict, x: jax.Array) -> jax.Array:
    """u = W1 relu(W0 x + b0) for one particle's scalar x."""
    hidden = jax.nn.relu(theta["weight0"][:, 0] * x + theta["bias0"])
    return theta["weight1"][0] @ hidden


_u_and_grads = jax.vmap(jax.value_and_grad(control, argnums=(0, 1)), in_axes=(None, 0))


def make_step(dt: float, lr: Callable[[jax.Array], jax.Array]) -> Callable[[HandState, jax.Array], tuple]:
    """One Euler-Maruyama step of all particles given dW (N,): (state, dW) -> (state, mean cost)."""

    def step(state: HandState, dw: jax.Array) -> tuple[HandState, jax.Array]:
        x, xt, theta = state.x, state.x_tilde, state.theta
        u, (u_theta, u_x) = _u_and_grads(theta, x)
        per_leaf = lambda a, b: a * b.reshape(b.shape + (1,) * (a.ndim - 1))
        du = jax.tree.map(lambda xt_, ut: per_leaf(xt_, u_x) + ut, xt, u_theta)
        gradient = jax.tree.map(lambda xt_, du_: jnp.mean(per_leaf(xt_, 2 * x) + per_leaf(du_, 2 * u), 0), xt, du)
        new_xt = jax.tree.map(lambda xt_, du_: xt_ + (du_ - xt_) * dt, xt, du)
        alpha = lr(state.t)
        new_theta = jax.tree.map(lambda th, g: th - alpha * dt * g, theta, gradient)
        new_x = x + (u - x) * dt + dw
        return HandState(new_x, new_xt, new_theta, state.t + dt), jnp.mean(x * x + u * u)

    return step


def make_run(dt: float, lr: Callable[[jax.Array], jax.Array], steps: int, particles: int) -> Callable:
    """``steps`` steps in one jitted ``lax.scan``, noise drawn inside: (state, key) -> (state, costs (steps,))."""
    step = make_step(dt, lr)
    scale = float(np.sqrt(dt))

    def body(carry, _):
        state, key = carry
        key, sub = jax.random.split(key)
        state, cost = step(state, scale * jax.random.normal(sub, (particles,), state.x.dtype))
        return (state, key), cost

    @jax.jit
    def run(state: HandState, key: jax.Array) -> tuple[HandState, jax.Array]:
        (state, _), costs = jax.lax.scan(body, (state, key), None, length=steps)
        return state, costs

    return run


def init(theta: dict, x0: float, particles: int) -> HandState:
    theta = {k: jnp.asarray(v, jnp.float32) for k, v in theta.items()}
    x_tilde = {k: jnp.zeros((particles,) + v.shape, jnp.float32) for k, v in theta.items()}
    return HandState(jnp.full((particles,), x0, jnp.float32), x_tilde, theta, jnp.zeros((), jnp.float32))


def time_to_result(
    theta: dict,
    particles: int = 256,
    steps: int = 6_000,
    dt: float = 0.01,
    lr_scale: float = 10.0,
    lr_offset: float = 20.0,
    seed: int = 0,
) -> tuple[float, HandState]:
    """Seconds from call to trained theta (compilation included), alpha(t) = lr_scale / (lr_offset + t)."""
    start = time.perf_counter()
    run = make_run(dt, lambda t: lr_scale / (lr_offset + t), steps, particles)
    state, _costs = run(init(theta, 1.0, particles), jax.random.PRNGKey(seed))
    jax.block_until_ready(state.theta)
    return time.perf_counter() - start, state
