"""Event-stream examples: point processes fitted to their events by the exact likelihood, against the truth.

- ``hawkes_1d``: the 1-D Hawkes process lambda(t) = mu + alpha sum_{t_i < t} exp(-beta (t - t_i)) with
  (mu, alpha, beta) = (0.5, 0.8, 1.5) (branching ratio alpha / beta = 0.53, mean intensity 1.07), in tick's
  parameterisation baseline 0.5, adjacency 0.8 / 1.5, decay 1.5, on [0, end_time];
- ``hawkes_2d``: a 2-D exponential Hawkes process (tick's parameterisation, baseline (0.5, 0.3), adjacency
  [[0.5, 0.2], [0.3, 0.4]], decay 1.5: mean rates (1.5, 1.25)) on [0, end_time];
- ``order_book_events``: buys and sells whose intensities softplus(b + W Y) depend on a book imbalance Y that
  decays at rate kappa and is moved by the signed order sizes (1, 2 or 3).

Each returns an ``EventExample``: the model, the truth, the simulated events (the library's thinning) and
``fit(method)``, which fits from the model's default start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ..events import EventData, EventModel, FitResult, fit, hawkes, order_book, simulate

HAWKES_1D = {"baseline": [0.5], "adjacency": [[0.8 / 1.5]], "decay": 1.5}
HAWKES_2D = {"baseline": [0.5, 0.3], "adjacency": [[0.5, 0.2], [0.3, 0.4]], "decay": 1.5}
ORDER_BOOK = {"baseline": [-0.3, 0.2], "weights": [[-0.8], [0.6]], "kappa": 0.7}


class EventExample(NamedTuple):
    """A built-in event stream: its model, the truth (natural units) and the events simulated from it."""

    name: str
    model: EventModel
    truth: dict[str, Any]
    events: EventData

    def fit(self, method: str = "batch", **options: Any) -> FitResult:
        """``fwdtrain.events.fit`` of the model to the events."""
        return fit(self.model, self.events, method=method, **options)

    def compare(self, result: FitResult) -> list[tuple[str, float, float, float]]:
        """(parameter entry, estimate, stderr, truth) for every scalar parameter."""
        rows = []
        for name, value in self.truth.items():
            truth = torch.as_tensor(value, dtype=torch.float64).reshape(-1)
            for i, (estimate, error) in enumerate(
                zip(result.params[name].reshape(-1), result.stderr[name].reshape(-1), strict=True)
            ):
                label = name if truth.numel() == 1 else f"{name}[{i}]"
                rows.append((label, float(estimate), float(error), float(truth[i])))
        return rows


def hawkes_1d(*, end_time: float = 2_000.0, seed: int = 0, realizations: int = 1) -> EventExample:
    """About 2,100 events on [0, 2000] by default."""
    model = hawkes(dimension=1)
    events = simulate(model, HAWKES_1D, end_time, seed=seed, realizations=realizations)
    return EventExample("hawkes", model, dict(HAWKES_1D), events)


def hawkes_2d(*, end_time: float = 2_000.0, seed: int = 0, realizations: int = 1) -> EventExample:
    """About 5,500 events on [0, 2000] by default."""
    model = hawkes(dimension=2)
    events = simulate(model, HAWKES_2D, end_time, seed=seed, realizations=realizations)
    return EventExample("hawkes-2d", model, dict(HAWKES_2D), events)


def order_book_events(*, end_time: float = 300.0, seed: int = 0, realizations: int = 2) -> EventExample:
    """About 1,000 events of two realizations on [0, 300] by default."""
    model = order_book()
    events = simulate(
        model, ORDER_BOOK, end_time, seed=seed, realizations=realizations, marks=lambda rng, k: [1.0 + rng.integers(3)]
    )
    return EventExample("order-book", model, dict(ORDER_BOOK), events)


hawkes_1d.summary = "fit a Hawkes process's (mu, alpha, beta) to its events by the exact likelihood"  # type: ignore[attr-defined]
hawkes_2d.summary = "fit a 2-D exponential Hawkes process to its events by the exact likelihood"  # type: ignore[attr-defined]
order_book_events.summary = "fit buys and sells whose intensities depend on the imbalance they move"  # type: ignore[attr-defined]

EVENT_REGISTRY: dict[str, Callable[..., EventExample]] = {
    "hawkes": hawkes_1d,
    "hawkes-2d": hawkes_2d,
    "order-book": order_book_events,
}

__all__ = [
    "EVENT_REGISTRY",
    "HAWKES_1D",
    "HAWKES_2D",
    "ORDER_BOOK",
    "EventExample",
    "hawkes_1d",
    "hawkes_2d",
    "order_book_events",
]
