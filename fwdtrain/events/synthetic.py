"""A LOBSTER-format message file written by a simulator, for examples and tests of order-book data.

Market orders follow a 2-D Hawkes process (``thinning.simulate``) with excitation on two time scales by default
(``DECAYS``: sums of exponentials with decays 1 and 20 per second, ``MARKET_ORDERS``), type 0 seller-initiated (they hit
the bid: LOBSTER direction +1, the side of the resting orders) and type 1 buyer-initiated (direction -1). Each
market order fills Geometric(``walk``) resting orders (at least one, 1 / walk on average), one execution row
(LOBSTER type 4) per fill, all at the order's time, walking the book one tick per fill; limit-order submissions
(type 1) arrive as a Poisson stream at rate ``submissions`` per second.
Times are seconds after midnight from 34200 (9:30).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .models import EventModel, hawkes
from .thinning import simulate

OPEN = 34_200.0  # 9:30 in seconds after midnight
DECAYS = (1.0, 20.0)
MARKET_ORDERS = {  # adjacency (K, K, U): a fast and a slow part of each kernel; branching ratio 0.65
    "baseline": [0.3, 0.3],
    "adjacency": [[[0.15, 0.35], [0.05, 0.1]], [[0.05, 0.1], [0.15, 0.35]]],
}
BID, ASK, TICK = 999_900, 1_000_100, 100  # prices in 10^-4 dollars, as LOBSTER writes them


class Messages(NamedTuple):
    """What ``write_lobster`` wrote: the file, the market orders' times (m,), types (m,) and fills (m,), the
    window [start, end], and the model and parameters of the market orders."""

    path: Path
    times: np.ndarray
    types: np.ndarray
    fills: np.ndarray
    start: float
    end: float
    model: EventModel
    truth: dict[str, Any]


def write_lobster(
    path: Any,
    *,
    duration: float = 600.0,
    seed: int = 0,
    walk: float = 0.6,
    submissions: float = 1.0,
    model: EventModel | None = None,
    truth: dict[str, Any] | None = None,
) -> Messages:
    """Write a LOBSTER message file of ``duration`` seconds from 9:30 (see the module's docstring); ``walk`` is
    the probability that a market order stops after each fill (mean fills 1 / walk). ``model`` (2 types) and
    ``truth``: the market orders' process (default ``hawkes(dimension=2, decays=DECAYS)``, ``MARKET_ORDERS``)."""
    if not 0 < walk <= 1:
        raise ValueError(f"walk must be in (0, 1] (the chance a market order stops after a fill), got {walk}")
    model = hawkes(dimension=2, decays=DECAYS) if model is None else model
    truth = dict(MARKET_ORDERS if truth is None else truth)
    if model.type_count != 2:
        raise ValueError(f"write_lobster needs a model of 2 types (sell and buy market orders), got {model.type_count}")
    rng = np.random.default_rng(seed)
    data = simulate(model, truth, duration, seed=seed)
    mask = data.mask[0].numpy()
    times, types = data.times[0].numpy()[mask] + OPEN, data.types[0].numpy()[mask]
    fills = rng.geometric(walk, times.size)
    rows = []
    order_id = 1
    for t, k, m in zip(times.tolist(), types.tolist(), fills.tolist(), strict=True):
        direction = 1 if k == 0 else -1  # the side of the resting orders hit
        for j in range(m):
            price = BID - j * TICK if direction == 1 else ASK + j * TICK
            rows.append((t, 4, order_id, 100 * int(rng.integers(1, 5)), price, direction))
            order_id += 1
    arrivals = OPEN + np.sort(rng.uniform(0, duration, rng.poisson(submissions * duration)))
    for t in arrivals.tolist():
        direction = int(rng.choice((-1, 1)))
        price = BID - TICK * int(rng.integers(0, 3)) if direction == 1 else ASK + TICK * int(rng.integers(0, 3))
        rows.append((t, 1, order_id, 100 * int(rng.integers(1, 5)), price, direction))
        order_id += 1
    rows.sort(key=lambda row: row[0])  # stable: the fills of one order stay together, in book order
    rows.insert(0, (OPEN, 1, 0, 100, BID, 1))
    rows.append((OPEN + duration, 1, order_id, 100, ASK, -1))
    target = Path(path)
    target.write_text("".join(f"{t:.9f},{k},{i},{s},{p},{d}\n" for t, k, i, s, p, d in rows))
    return Messages(target, times, types, fills, OPEN, OPEN + duration, model, truth)


__all__ = ["DECAYS", "MARKET_ORDERS", "OPEN", "Messages", "write_lobster"]
