"""The same algorithm in JAX: one particle's code, ``vmap`` over particles, ``lax.scan`` over steps, ``jit``.

Mirrors fwdtrain's kernel line for line (ALGORITHM.md): the coefficients (mu, sigma, c)
of one particle and their partial Jacobians h_x, h_theta come from one ``jacrev`` over
(theta, x) (reverse mode, which fwdtrain's "auto" picks for these shapes, with the same
strategy as fwdtrain.sensitivity), D h = h_x Xtilde + h_theta, then

    X      <- X + mu h + sigma dW
    Xtilde <- Xtilde + D mu h + D sigma dW
    theta  <- theta - alpha(t) h mean_i D c
    t      <- t + h

The problems are controlled LQRs dX = (A X + B u) dt + dW, cost |X|^2 + |u|^2 with an
MLP control u = f(theta, X) (no output bias), diagonal unit noise: the seed's 1-D
problem (A = -1, B = 1, 1 -> 16 -> 1 ReLU) and the benchmark's 10-D one.
Needs ``jax`` (``pip install fwdtrain[jax]``); float32, like the torch runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

ACTIVATIONS = {"relu": jax.nn.relu, "tanh": jnp.tanh}


class JaxState(NamedTuple):
    x: jax.Array  # (N, d)
    x_tilde: Any  # dict like theta, leaves (N, d, *s)
    theta: Any  # dict of arrays
    t: jax.Array  # ()


def mlp_apply(layers: int, activation: str) -> Callable[[dict, jax.Array], jax.Array]:
    """u = W_L act(... act(W_0 x + b_0) ...), keys "weight{i}", "bias{i}" as in fwdtrain.mlp."""
    act = ACTIVATIONS[activation]

    def apply(theta: dict, x: jax.Array) -> jax.Array:
        z = x
        for i in range(layers):
            z = z @ theta[f"weight{i}"].T
            if f"bias{i}" in theta:
                z = z + theta[f"bias{i}"]
            if i < layers - 1:
                z = act(z)
        return z

    return apply


def lqr_coefficients(a: np.ndarray, b: np.ndarray, control: Callable) -> Callable:
    """(theta, x) -> (mu, sigma, c) for dX = (A X + B u) dt + dW, c = |x|^2 + |u|^2, one particle."""
    a, b = jnp.asarray(a), jnp.asarray(b)

    def coefficients(theta, x):
        u = control(theta, x)
        return a @ x + b @ u, jnp.ones_like(x), jnp.sum(x * x) + jnp.sum(u * u)

    return coefficients


def linearise(coefficients: Callable, theta, x, x_tilde):
    """Values and total derivatives D h = h_x Xtilde + h_theta of (mu, sigma, c), one reverse pass."""

    def evaluate(theta_, x_):
        out = coefficients(theta_, x_)
        return out, out

    jacobians, value = jax.jacrev(evaluate, argnums=(0, 1), has_aux=True)(theta, x)
    total = tuple(
        jax.tree_util.tree_map(lambda h_theta, xt: h_theta + jnp.tensordot(h_x, xt, axes=1), h_theta_tree, x_tilde)
        for h_theta_tree, h_x in jacobians
    )
    return value, total


def make_step(coefficients: Callable, dt: float, lr: float) -> Callable:
    """One Euler-Maruyama step of (X, Xtilde, theta, t) for N particles (diagonal noise)."""

    def step(state: JaxState, dw: jax.Array):
        value, total = jax.vmap(lambda xi, xti: linearise(coefficients, state.theta, xi, xti))(state.x, state.x_tilde)
        mu, sigma, cost = value
        d_mu, d_sigma, d_cost = total
        x = state.x + mu * dt + sigma * dw
        x_tilde = jax.tree_util.tree_map(
            lambda xt, dm, ds: xt + dm * dt + ds * dw.reshape(dw.shape + (1,) * (ds.ndim - 2)),
            state.x_tilde,
            d_mu,
            d_sigma,
        )
        gradient = jax.tree_util.tree_map(lambda g: g.mean(0), d_cost)
        theta = jax.tree_util.tree_map(lambda th, g: th - (lr * dt) * g, state.theta, gradient)
        return JaxState(x, x_tilde, theta, state.t + dt), cost.mean()

    return step


def make_chunk(coefficients: Callable, dt: float, lr: float, steps: int, particles: int, m: int) -> Callable:
    """jit((state, key) -> (state, per-step mean cost)): draws (steps, N, m) noise and scans ``steps`` steps."""
    step = make_step(coefficients, dt, lr)

    @jax.jit
    def chunk(state: JaxState, key: jax.Array):
        noise = jax.random.normal(key, (steps, particles, m), dtype=state.x.dtype) * jnp.sqrt(dt)
        return jax.lax.scan(step, state, noise)

    return chunk


def init_state(theta: dict, x0: np.ndarray, particles: int) -> JaxState:
    theta = {k: jnp.asarray(v) for k, v in theta.items()}
    d = x0.shape[0]
    x = jnp.broadcast_to(jnp.asarray(x0), (particles, d))
    x_tilde = {k: jnp.zeros((particles, d, *v.shape), v.dtype) for k, v in theta.items()}
    return JaxState(x, x_tilde, theta, jnp.zeros((), x.dtype))


class JaxTiming(NamedTuple):
    compile_s: float  # lowering + XLA compilation of one chunk
    seconds_per_chunk: list  # steady state, one entry per repeat
    final_state: JaxState


def time_chunks(
    coefficients: Callable,
    theta: dict,
    x0: np.ndarray,
    particles: int,
    dt: float,
    lr: float,
    chunk_steps: int,
    chunks: int,
    repeats: int,
    seed: int = 0,
) -> JaxTiming:
    """Compile one chunk (timed apart), then time ``chunks`` chunks ``repeats`` times."""
    state = init_state(theta, x0, particles)
    m = x0.shape[0]
    chunk = make_chunk(coefficients, dt, lr, chunk_steps, particles, m)
    key = jax.random.PRNGKey(seed)
    start = time.perf_counter()
    compiled = chunk.lower(state, key).compile()
    compile_s = time.perf_counter() - start
    state, _ = compiled(state, key)  # warm-up
    jax.block_until_ready(state)
    per_chunk = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(chunks):
            key, sub = jax.random.split(key)
            state, cost = compiled(state, sub)
        jax.block_until_ready((state, cost))
        per_chunk.append((time.perf_counter() - start) / chunks)
    return JaxTiming(compile_s, per_chunk, state)
