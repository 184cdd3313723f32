"""Event data as users have it, checked and laid out for the likelihood.

``EventData`` holds R realizations of a K-type marked point process padded to a common length n:

    times (R, n) float64, types (R, n) int64 in {0..K-1}, marks (R, n, q) float64, mask (R, n) bool,
    start (R,), end (R,) the observation windows [start_r, end_r].

The builders give float64 on the CPU; ``events.to(device, dtype)`` moves them, and the likelihood, the fits and
the diagnostics then compute in the events' dtype on their device (``as_parameter``: parameters given as numbers follow
the events, tensors of another dtype or device are refused).

Padded events (mask False) sit after the last real event at its time, with type 0 and mark 0: every engine
treats them as no-ops. Builders: ``from_tick`` (tick's layout: a list of realizations, each a list of K sorted
arrays of times), ``from_table`` (columns time, type, mark from numpy, torch or pandas), ``read_lobster`` (a
LOBSTER message file) and ``as_events`` (any of these). Bad data are refused before any work, with the value
and the fix in the message. Ties (equal times) are allowed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

D64 = torch.float64


class EventData(NamedTuple):
    """R padded realizations of a K-type marked point process on the windows [start_r, end_r]."""

    times: torch.Tensor  # (R, n) floating (float64 by default), sorted within each realization
    types: torch.Tensor  # (R, n) int64
    marks: torch.Tensor  # (R, n, q) the times' dtype
    mask: torch.Tensor  # (R, n) bool, False on padding
    start: torch.Tensor  # (R,) the times' dtype
    end: torch.Tensor  # (R,) the times' dtype
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
        onehot = torch.nn.functional.one_hot(self.types, self.dimension).to(self.times.dtype)
        return (onehot * self.mask[..., None]).sum(1)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the times, marks and windows (float64 unless moved by ``to``)."""
        return self.times.dtype

    @property
    def device(self) -> torch.device:
        return self.times.device

    def to(self, device: Any = None, dtype: torch.dtype | None = None) -> EventData:
        """The same events on ``device`` (None: where they are) with times, marks and windows in the floating
        ``dtype`` (None: as they are); a float32 copy keeps about 7 digits of each time."""
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"EventData.to(dtype=...) must be a floating dtype (float64, float32), got {dtype}")
        real = {"device": device, "dtype": dtype}
        return self._replace(
            times=self.times.to(**real),
            types=self.types.to(device),
            marks=self.marks.to(**real),
            mask=self.mask.to(device),
            start=self.start.to(**real),
            end=self.end.to(**real),
        )


def as_parameter(value: Any, name: str, events: torch.Tensor | None) -> torch.Tensor:
    """``value`` (a parameter) as a tensor beside ``events`` (a tensor of the events, e.g. their times): numbers in
    its dtype on its device, a floating tensor as it is if it matches them, else refused (None: numbers in float64,
    tensors as they are)."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        if events is not None and (value.dtype != events.dtype or value.device != events.device):
            raise ValueError(
                f"{name} is {value.dtype} on {value.device}, the events are {events.dtype} on {events.device}: "
                f"give the parameters in the events' dtype and device ({name}.to(events.times)) or move the events "
                f"(events.to({str(value.device)!r}, {value.dtype}))"
            )
        return value
    if events is None:
        return torch.as_tensor(value, dtype=D64)
    return torch.as_tensor(value, dtype=events.dtype, device=events.device)


def _array(values: Any, name: str) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    elif hasattr(values, "to_numpy"):
        values = values.to_numpy()
    raw = np.asarray(values)
    if raw.dtype.kind in "mM" or (raw.dtype.kind == "O" and raw.size and hasattr(raw.reshape(-1)[0], "timestamp")):
        raise TypeError(
            f"{name} holds datetimes or durations: event times must be numbers (seconds); convert them, e.g. "
            f"(t - t[0]) / np.timedelta64(1, 's') or, for a pandas column, (df.{name} - df.{name}.iloc[0])"
            ".dt.total_seconds()"
        )
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
    ``mark`` (n,) or (n, q) (None: no marks). ``time`` may also be a table, a pandas DataFrame or a dict of
    columns: "time", optionally "type" and marks ("mark", or several columns whose names start with "mark", in
    the table's order); other columns are refused. K is ``types`` (default: the largest type + 1)."""
    if _is_table(time):
        time, column_type, column_mark = _columns(time)
        type = type if column_type is None else column_type
        mark = mark if column_mark is None else column_mark
    t = _array(time, "time")
    if t.ndim > 1:
        raise ValueError(
            f"time must be 1-D (one time per event), got shape {t.shape}: for a table of rows (time, type, mark) "
            "pass its columns, from_table(a[:, 0], a[:, 1], a[:, 2], end_time=...), or a DataFrame"
        )
    t = t.reshape(-1)
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


def _is_table(value: Any) -> bool:
    return hasattr(value, "columns") or isinstance(value, Mapping)


def _columns(frame: Any) -> tuple[Any, Any, Any]:
    """(time, type, mark) of a DataFrame or a dict of columns named "time", "type" and "mark..." (refused
    otherwise)."""
    columns = list(frame.keys()) if isinstance(frame, Mapping) else list(frame.columns)
    names = [str(c) for c in columns]
    marks = [c for c in columns if str(c).startswith("mark")]
    unknown = [n for n in names if n not in ("time", "type") and not n.startswith("mark")]
    if "time" not in names or unknown:
        raise ValueError(
            f"a table of events has the columns time, type (optional) and mark (optional; several: mark_*), got "
            f"{names}: rename them, e.g. df.rename(columns={{'side': 'type', 'size': 'mark'}}), or drop the others"
        )
    kind = frame["type"] if "type" in names else None
    mark = None if not marks else np.stack([_array(frame[c], str(c)).reshape(-1) for c in marks], axis=1)
    return frame["time"], kind, mark


LOBSTER_TYPES = {1: "submission", 2: "partial cancellation", 3: "deletion", 4: "execution", 5: "hidden execution"}
EXECUTIONS = (4, 5)  # the LOBSTER types whose rows are fills of an aggressive order


def _lobster_table(path: Any, header: bool) -> np.ndarray:
    """The file's rows (n, >= 6) as numbers; a header row is skipped when ``header`` and else refused."""
    with open(path) as file:
        first = file.readline()
    cells = first.strip().split(",")
    try:
        [float(cell) for cell in cells]
        numeric = bool(first.strip())
    except ValueError:
        numeric = False
    if not numeric and not header:
        raise ValueError(
            f"{path}: the first row {first.strip()[:60]!r} is not numbers: LOBSTER message files have no header "
            "row; pass read_lobster(..., header=True) to skip it, or delete that row"
        )
    table = np.loadtxt(path, delimiter=",", ndmin=2, skiprows=1 if header and not numeric else 0)
    if table.shape[1] < 6:
        raise ValueError(
            f"{path}: a LOBSTER message file has 6 columns (time, type, order id, size, price, direction), "
            f"got {table.shape[1]}"
        )
    return table


def merge_fills(time: np.ndarray, kind: np.ndarray, size: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """The rows (n,) with the fills of one aggressive order merged: consecutive execution rows (LOBSTER types 4,
    5) at the same time, of the same type and direction, become one row with the summed size. Returns (m, 5):
    columns (time, type, direction, size, fills), fills the number of rows merged into each."""
    n = time.size
    if n == 0:
        return np.zeros((0, 5))
    fill = np.isin(kind, EXECUTIONS)
    same = np.zeros(n, dtype=bool)
    same[1:] = (time[1:] == time[:-1]) & (kind[1:] == kind[:-1]) & (direction[1:] == direction[:-1]) & fill[1:]
    first = np.flatnonzero(~same)
    fills = np.diff(np.append(first, n))
    return np.stack([time[first], kind[first], direction[first], np.add.reduceat(size, first), fills], axis=1)


def read_lobster(
    path: Any,
    *,
    event_types: Sequence[int] = (4,),
    by_direction: bool = True,
    merge: bool = True,
    end_time: float | None = None,
    start_time: float | None = None,
    header: bool = False,
) -> EventData:
    """A LOBSTER message file (CSV columns: time in seconds after midnight, event type 1..7, order id, size,
    price, direction +1 buy / -1 sell) as events: the rows of ``event_types`` (default 4, visible executions),
    type = index in ``event_types`` times 2 plus 1 for a sell when ``by_direction`` (so with the default,
    0 = buy-side execution, 1 = sell-side), marks (size, direction, fills).

    An execution's direction is the side of the resting order it hits: a buy-side execution (direction +1,
    type 0) is a seller-initiated trade. One aggressive order that walks the book leaves one row per resting
    order it fills, all at one time; with ``merge`` (the default) those fills become one event, a market order,
    with the summed size and the number of fills as marks (``merge_fills``); ``merge=False`` keeps one event per
    fill (fills = 1). The window is [start_time, end_time] (default: the file's first and last time); a header
    row is refused unless ``header=True``."""
    table = _lobster_table(path, header)
    kinds = table[:, 1]
    unknown = np.setdiff1d(kinds, np.arange(1, 8))
    if unknown.size:
        raise ValueError(f"{path}: unknown LOBSTER event type {unknown[0]:g}; the format's types are 1..7")
    rows = table[np.isin(kinds, np.asarray(event_types))]
    if not np.isin(rows[:, 5], (-1.0, 1.0)).all():
        raise ValueError(f"{path}: direction must be +1 (buy) or -1 (sell)")
    if merge:
        events = merge_fills(rows[:, 0], rows[:, 1], rows[:, 3], rows[:, 5])
    else:
        events = np.stack([rows[:, 0], rows[:, 1], rows[:, 5], rows[:, 3], np.ones(len(rows))], axis=1)
    time, kind, direction = events[:, 0], events[:, 1], events[:, 2]
    order = np.argsort(np.asarray(event_types))  # position of each kept row's type in ``event_types``
    index = order[np.searchsorted(np.asarray(event_types)[order], kind)] if kind.size else np.zeros(0, int)
    k = len(event_types) * (2 if by_direction else 1)
    kinds_out = index * 2 + (direction < 0) if by_direction else index
    start = float(table[0, 0]) if start_time is None else start_time
    end = float(table[-1, 0]) if end_time is None else end_time
    marks = np.stack([events[:, 3], direction, events[:, 4]], axis=1)
    return from_table(time, kinds_out, marks, end_time=end, start_time=start, types=k)


def as_events(events: Any, end_time: Any = None, start_time: Any = 0.0, types: int | None = None) -> EventData:
    """``EventData`` from what a user has: an ``EventData`` (returned as is), tick's layout (a list of
    realizations or of K arrays), a (n,) array or tensor of times (one type), or a table (a pandas DataFrame
    or a dict of columns, see ``from_table``)."""
    if isinstance(events, EventData):
        return events
    if isinstance(events, (torch.Tensor, np.ndarray)) or _is_table(events):
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
    onehot = torch.nn.functional.one_hot(data.types, data.dimension).to(data.dtype) * data.mask[..., None]
    cumulative = torch.cumsum(onehot, 1) - onehot  # earlier events, by index
    same = torch.ones((r, n), dtype=torch.bool, device=data.device)
    same[:, 1:] = data.times[:, 1:] == data.times[:, :-1]
    index = torch.arange(n, device=data.device).expand(r, n)
    group = torch.cummax(torch.where(same, 0, index), 1).values  # first index of each tie
    first = torch.gather(cumulative, 1, group[..., None].expand(r, n, data.dimension))
    return (cumulative - first) * data.mask[..., None]


__all__ = ["EventData", "as_events", "as_parameter", "from_table", "from_tick", "merge_fills", "read_lobster", "ties"]
