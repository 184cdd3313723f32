"""Ogata's thinning in plain numpy, as a researcher writes it: the references of ``bench_events``' simulate rows.

``hawkes``: a K-type Hawkes process with sum-of-exponential kernels, phi_ij(t) = sum_u alpha_iju b_u exp(-b_u t);
the state S (U, K) the decayed counts, the intensity mu + W S (W the weights alpha b flattened), bounded from each
candidate on by the intensity there (it only decays until the next event). ``saturating``: lambda = mu + Y,
dY = -kappa Y dt, Y jumps by alpha / (1 + Y / cap), bounded by the intensity now.
"""

from __future__ import annotations

import math

import numpy as np


def hawkes(mu: np.ndarray, alpha: np.ndarray, decays: np.ndarray, end: float, seed: int) -> list[np.ndarray]:
    """The event times of each type (K lists) on [0, end]; ``alpha`` (K, K, U) indexed [i, j, u] (type j excites
    type i), ``decays`` (U,)."""
    rng = np.random.default_rng(seed)
    k, u = alpha.shape[0], decays.size
    weights = (alpha * decays[None, None, :]).transpose(0, 2, 1).reshape(k, u * k)  # W[i, (u, j)]
    fade = np.repeat(decays, k)
    state = np.zeros(u * k)
    t, times, kinds = 0.0, [], []
    while True:
        bound = mu.sum() + weights.sum(0) @ state
        wait = rng.exponential(1 / bound)
        if t + wait >= end:
            break
        t += wait
        state *= np.exp(-fade * wait)
        rates = mu + weights @ state
        total = rates.sum()
        if rng.uniform() * bound < total:
            kind = int(np.searchsorted(np.cumsum(rates), rng.uniform() * total, side="right"))
            state[kind::k] += 1.0
            times.append(t)
            kinds.append(kind)
    times_all, kinds_all = np.asarray(times), np.asarray(kinds, dtype=np.int64)
    return [times_all[kinds_all == i] for i in range(k)]


def saturating(mu: float, alpha: float, kappa: float, cap: float, end: float, seed: int) -> np.ndarray:
    """The event times on [0, end] of the saturating model (Python floats: one type, a scalar state)."""
    rng = np.random.default_rng(seed)
    y, t, times = 0.0, 0.0, []
    while True:
        bound = mu + y
        wait = rng.exponential(1 / bound)
        if t + wait >= end:
            break
        t += wait
        y *= math.exp(-kappa * wait)
        if rng.uniform() * bound < mu + y:
            y += alpha / (1 + y / cap)
            times.append(t)
    return np.asarray(times)
