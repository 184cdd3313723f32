"""Event data as users have it, checked and laid out for the likelihood.

``EventData`` holds R realizations of a K-type marked point process padded to a common length n:

    times (R, n) float64, types (R, n) int64 in {0..K-1}, marks (R, n, q) float64, mask (R, n) bool,
    start (R,), end (R,) the observation windows [start_r, end_r].

Padded events (mask False) sit after the last real event at its time, with type 0 and mark 0: every engine
treats them as no-ops. Builders: ``from_tick`` (tick's layout: a list of realizations, each a list of K sorted
arrays of times), ``from_table`` (columns time, type, mark from numpy, torch or pandas), ``read_lobster`` (a
LOBSTER message file) and ``as_events`` (any of these). Bad data are refused before any work, with the value
and the fix in the message. Ties (equal times) are allowed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

D64 = torch.float64


class EventData(NamedTuple):
    """R padded realizations of a K-type marked point process on the windows [start_r, end_r]."""

    times: torch.Tensor  # (R, n) float64, sorted within each realization
    types: torch.Tensor  # (R, n) int64
    marks: torch.Tensor  # (R, n, q) float64
    mask: torch.Tensor  # (R, n) bool, False on padding
    start: torch.Tensor  # (R,) float64
    end: torch.Tensor  # (R,) float64
    dimension: int  # K, the number of event types

    @property
    def realizations(self) -> int:
        return self.times.shape[0]

    @property
    def events(self) -> int:
        """The number of real events, all realizations together."""
        return int(self.mask.sum())

    def counts(self) -> torch.Tensor:
        """(R, K) events of each type in each realization."""
        onehot = torch.nn.functional.one_hot(self.types, self.dimension).to(D64)
        return (onehot * self.mask[..., None]).sum(1)


def _array(values: Any, name: str) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    elif hasattr(values, "to_numpy"):
        values = values.to_numpy()
    try:
        out = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must be numbers (an array, tensor or column), got {type(values).__name__}") from error
    return out


def _check_times(times: np.ndarray, name: str, start: float, end: float) -> None:
    """Raise unless ``times`` (n,) is finite, sorted and inside [start, end]."""
    if times.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one time per event), got shape {times.shape}")
    bad = np.flatnonzero(~np.isfinite(times))
    if bad.size:
        raise ValueError(f"{name}[{bad[0]}] is {times[bad[0]]}: event times must be finite; drop or fill NaN rows")
    if times.size and times[0] < start:
        raise ValueError(
            f"{name}[0] = {times[0]:g} is before the window's start {start:g}: times must lie in [start, end] "
            "(negative times: shift them by the first time, or pass start_time=)"
        )
    if times.size and times[-1] > end:
        raise ValueError(
            f"{name}[-1] = {times[-1]:g} is after end_time = {end:g}: times must lie in [start, end]; "
            "pass the window's end (at least the last event time)"
        )
    down = np.flatnonzero(np.diff(times) < 0)
    if down.size:
        i = int(down[0])
        raise ValueError(
            f"{name} is not sorted: {name}[{i}] = {times[i]:g} > {name}[{i + 1}] = {times[i + 1]:g}; sort the "
            "events by time (ties are allowed)"
        )


def _window(value: Any, realizations: int, name: str) -> np.ndarray:
    if value is None:
        raise ValueError(f"{name} is required: the end of the observation window of each realization")
    out = np.broadcast_to(_array(value, name), (realizations,)).copy()
    if not np.isfinite(out).all():
        raise ValueError(f"{name} must be finite, got {out.tolist()}")
    return out


def _pack(
    streams: list[tuple[np.ndarray, np.ndarray, np.ndarray]], start: np.ndarray, end: np.ndarray, k: int
) -> EventData:
    """Pad (times, types, marks) per realization to one (R, n) layout."""
    if not streams:
        raise ValueError("no realizations: give at least one stream of events")
    n = max(times.size for times, _, _ in streams)
    q = streams[0][2].shape[1]
    r = len(streams)
    times = np.zeros((r, n))
    types = np.zeros((r, n), dtype=np.int64)
    marks = np.zeros((r, n, q))
    mask = np.zeros((r, n), dtype=bool)
    for i, (t, kinds, z) in enumerate(streams):
        if end[i] <= start[i]:
            raise ValueError(f"realization {i}: end_time {end[i]:g} must be after start_time {start[i]:g}")
        m = t.size
        times[i, :m], types[i, :m], marks[i, :m], mask[i, :m] = t, kinds, z, True
        times[i, m:] = t[-1] if m else start[i]
    if not mask.any():
        raise ValueError("the event streams are empty: a fit needs at least one event")
    return EventData(
        torch.from_numpy(times),
        torch.from_numpy(types),
        torch.from_numpy(marks),
        torch.from_numpy(mask),
        torch.from_numpy(start.astype(np.float64)),
        torch.from_numpy(end.astype(np.float64)),
        k,
    )


def from_tick(timestamps: Sequence[Any], end_time: Any = None, start_time: Any = 0.0) -> EventData:
    """Events in tick's layout: ``timestamps[r][k]`` the sorted times (n_rk,) of type k in realization r (one
    realization may be given as the list of K arrays itself); ``end_time`` one number or one per realization."""
    if len(timestamps) and not isinstance(timestamps[0], (list, tuple)):
        timestamps = [timestamps]
    if not timestamps or any(len(row) == 0 for row in timestamps):
        raise ValueError("timestamps must be a list of realizations, each a list of K arrays of times (K >= 1)")
    k = len(timestamps[0])
    if any(len(row) != k for row in timestamps):
        raise ValueError(
            f"every realization must have K = {k} arrays (one per type), got {[len(r) for r in timestamps]}"
        )
    r = len(timestamps)
    start, end = _window(start_time, r, "start_time"), _window(end_time, r, "end_time")
    streams = []
    for i, row in enumerate(timestamps):
        times, kinds = [], []
        for j, values in enumerate(row):
            t = _array(values, f"timestamps[{i}][{j}]").reshape(-1)
            _check_times(t, f"timestamps[{i}][{j}]", start[i], end[i])
            times.append(t)
            kinds.append(np.full(t.size, j, dtype=np.int64))
        t, kinds_all = np.concatenate(times), np.concatenate(kinds)
        order = np.argsort(t, kind="stable")
        streams.append((t[order], kinds_all[order], np.zeros((t.size, 0))))
    return _pack(streams, start, end, k)


def from_table(
    time: Any,
    type: Any = None,
    mark: Any = None,
    *,
    end_time: Any = None,
    start_time: float = 0.0,
    types: int | None = None,
) -> EventData:
    """One realization from columns: ``time`` (n,) sorted, ``type`` (n,) integers in {0..K-1} (None: all 0),
    ``mark`` (n,) or (n, q) (None: no marks). ``time`` may also be a pandas DataFrame with columns "time",
    "type" and optionally "mark". K is ``types`` (default: the largest type + 1)."""
    if hasattr(time, "columns"):
        frame = time
        if "time" not in frame.columns:
            raise ValueError(f"the table needs a 'time' column, got columns {list(frame.columns)}")
        type = frame["type"] if "type" in frame.columns else type
        mark = frame["mark"] if "mark" in frame.columns else mark
        time = frame["time"]
    t = _array(time, "time").reshape(-1)
    start, end = _window(start_time, 1, "start_time"), _window(end_time, 1, "end_time")
    _check_times(t, "time", start[0], end[0])
    kinds = np.zeros(t.size) if type is None else _array(type, "type").reshape(-1)
    if kinds.size != t.size:
        raise ValueError(f"type has {kinds.size} entries for {t.size} times: give one type per event")
    if not np.all(np.isfinite(kinds) & (kinds == np.round(kinds)) & (kinds >= 0)):
        bad = int(np.flatnonzero(~(np.isfinite(kinds) & (kinds == np.round(kinds)) & (kinds >= 0)))[0])
        raise ValueError(f"type[{bad}] = {kinds[bad]}: event types must be integers 0..K-1; map labels to 0..K-1")
    k = int(kinds.max()) + 1 if types is None and kinds.size else int(types or 1)
    if kinds.size and kinds.max() >= k:
        bad = int(np.flatnonzero(kinds >= k)[0])
        raise ValueError(f"type[{bad}] = {int(kinds[bad])} is unknown: the model has types 0..{k - 1}")
    z = np.zeros((t.size, 0)) if mark is None else _array(mark, "mark").reshape(t.size, -1)
    if not np.isfinite(z).all():
        raise ValueError("mark has NaN or infinite values: drop or fill those rows")
    return _pack([(t, kinds.astype(np.int64), z)], start, end, k)


LOBSTER_TYPES = {1: "submission", 2: "partial cancellation", 3: "deletion", 4: "execution", 5: "hidden execution"}


def read_lobster(
    path: Any,
    *,
    event_types: Sequence[int] = (4,),
    by_direction: bool = True,
    end_time: float | None = None,
    start_time: float | None = None,
) -> EventData:
    """A LOBSTER message file (CSV columns: time in seconds after midnight, event type 1..7, order id, size,
    price, direction +1 buy / -1 sell) as events: the rows of ``event_types`` (default 4, visible executions),
    type = index in ``event_types`` times 2 plus 1 for a sell when ``by_direction`` (so with the default,
    0 = buy-side execution, 1 = sell-side), marks (size, direction). The window is [start_time, end_time]
    (default: the file's first and last time)."""
    table = np.loadtxt(path, delimiter=",", ndmin=2)
    if table.shape[1] < 6:
        raise ValueError(
            f"{path}: a LOBSTER message file has 6 columns (time, type, order id, size, price, direction), "
            f"got {table.shape[1]}"
        )
    kinds = table[:, 1]
    unknown = np.setdiff1d(kinds, np.arange(1, 8))
    if unknown.size:
        raise ValueError(f"{path}: unknown LOBSTER event type {unknown[0]:g}; the format's types are 1..7")
    keep = np.isin(kinds, np.asarray(event_types))
    rows = table[keep]
    order = np.argsort(np.asarray(event_types))  # position of each kept row's type in ``event_types``
    index = order[np.searchsorted(np.asarray(event_types)[order], rows[:, 1])] if rows.size else np.zeros(0, int)
    direction = rows[:, 5]
    if not np.isin(direction, (-1.0, 1.0)).all():
        raise ValueError(f"{path}: direction must be +1 (buy) or -1 (sell)")
    k = len(event_types) * (2 if by_direction else 1)
    kinds_out = index * 2 + (direction < 0) if by_direction else index
    start = float(table[0, 0]) if start_time is None else start_time
    end = float(table[-1, 0]) if end_time is None else end_time
    marks = np.stack([rows[:, 3], direction], axis=1)
    return from_table(rows[:, 0], kinds_out, marks, end_time=end, start_time=start, types=k)


def as_events(events: Any, end_time: Any = None, start_time: Any = 0.0, types: int | None = None) -> EventData:
    """``EventData`` from what a user has: an ``EventData`` (returned as is), tick's layout (a list of
    realizations or of K arrays), a (n,) array or tensor of times (one type), or a pandas DataFrame."""
    if isinstance(events, EventData):
        return events
    if isinstance(events, (torch.Tensor, np.ndarray)) or hasattr(events, "columns"):
        return from_table(events, end_time=end_time, start_time=start_time, types=types)
    if isinstance(events, (list, tuple)):
        if events and all(isinstance(x, (int, float)) and math.isfinite(float(x)) for x in events):
            return from_table(
                np.asarray(events, dtype=np.float64), end_time=end_time, start_time=start_time, types=types
            )
        return from_tick(events, end_time=end_time, start_time=start_time)
    raise TypeError(
        "events must be EventData, tick's list of arrays, an array of times or a DataFrame, "
        f"got {type(events).__name__}"
    )


def ties(data: EventData) -> torch.Tensor:
    """(R, n, K): the number of earlier events of each type at exactly the same time as each event (the
    events an exact left limit Y(t_i-) must not yet include)."""
    r, n = data.times.shape
    onehot = torch.nn.functional.one_hot(data.types, data.dimension).to(D64) * data.mask[..., None]
    cumulative = torch.cumsum(onehot, 1) - onehot  # earlier events, by index
    same = torch.ones((r, n), dtype=torch.bool)
    same[:, 1:] = data.times[:, 1:] == data.times[:, :-1]
    group = torch.cummax(torch.where(same, 0, torch.arange(n).expand(r, n)), 1).values  # first index of each tie
    first = torch.gather(cumulative, 1, group[..., None].expand(r, n, data.dimension))
    return (cumulative - first) * data.mask[..., None]


__all__ = ["EventData", "as_events", "from_table", "from_tick", "read_lobster", "ties"]
