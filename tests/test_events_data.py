"""Order-book data as events: the fills of one aggressive order merged into one market order, the simulator's
LOBSTER file read back exactly, the warning when tied events decide the goodness of fit, and tables refused with
a message that names the fix."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import fwdtrain as ft
from fwdtrain.events.synthetic import write_lobster

ev = ft.events

ROWS = [  # time, LOBSTER type, order id, size, price, direction
    (34200.10, 1, 11, 100, 1000000, 1),
    (34200.20, 4, 12, 50, 999900, 1),  # one seller-initiated order filling three bids
    (34200.20, 4, 13, 25, 999800, 1),
    (34200.20, 4, 14, 30, 999700, 1),
    (34200.20, 4, 15, 40, 1000100, -1),  # a buyer-initiated order at the same time: another event
    (34200.20, 1, 16, 100, 999900, 1),  # a submission at that time: not a fill
    (34200.50, 1, 17, 100, 999900, 1),
    (34200.70, 4, 18, 10, 1000100, -1),
    (34201.00, 4, 19, 20, 1000100, -1),
    (34201.00, 4, 20, 5, 1000200, -1),
]


def _write(path, rows, header=None):
    lines = [] if header is None else [header + "\n"]
    path.write_text("".join(lines) + "".join(",".join(str(v) for v in row) + "\n" for row in rows))
    return path


def test_the_fills_of_one_order_become_one_event_with_summed_size_and_count(tmp_path):
    path = _write(tmp_path / "msg.csv", ROWS)
    merged = ev.read_lobster(path, end_time=34202.0)
    assert merged.times.tolist() == [[34200.20, 34200.20, 34200.70, 34201.00]]
    assert merged.types.tolist() == [[0, 1, 1, 1]]  # 0: buy side hit (seller-initiated), 1: sell side hit
    sizes, directions, fills = merged.marks[0].T.tolist()
    assert sizes == [105.0, 40.0, 10.0, 25.0] and fills == [3.0, 1.0, 1.0, 2.0] and directions == [1, -1, -1, -1]
    assert sum(fills) == 7  # every execution row is in one event
    kept = ev.read_lobster(path, end_time=34202.0, merge=False)
    assert kept.events == 7 and kept.marks[0, :, 2].tolist() == [1.0] * 7
    assert kept.marks[0, :, 0].sum() == merged.marks[0, :, 0].sum()
    same_type = [torch.diff(d.times[0][d.types[0] == k]) == 0 for d in (merged, kept) for k in (0, 1)]
    assert [int(s.sum()) for s in same_type] == [0, 0, 2, 1]  # the ties inside one order are gone
    both = ev.read_lobster(path, event_types=(4, 1), end_time=34202.0)  # submissions are never merged
    assert both.events == 4 + 3 and both.counts()[0].tolist() == [1, 3, 3, 0]


def test_merge_fills_keeps_orders_apart_by_time_type_and_direction():
    time = np.array([1.0, 1.0, 1.0, 1.0, 2.0, 2.0])
    kind = np.array([4, 4, 5, 4, 4, 1])
    direction = np.array([1, 1, 1, -1, 1, 1])
    size = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    out = ev.data.merge_fills(time, kind, size, direction)
    assert out[:, 3].tolist() == [3.0, 4.0, 8.0, 16.0, 32.0] and out[:, 4].tolist() == [2, 1, 1, 1, 1]
    assert ev.data.merge_fills(time[:0], kind[:0], size[:0], direction[:0]).shape == (0, 5)


def test_the_simulated_message_file_reads_back_as_its_market_orders(tmp_path):
    written = write_lobster(tmp_path / "day.csv", duration=120.0, seed=3)
    assert written.fills.sum() > written.times.size  # orders that walk the book: tied fills
    data = ev.read_lobster(written.path)
    assert data.start.item() == written.start and data.end.item() == written.end
    np.testing.assert_allclose(data.times[0].numpy(), written.times, rtol=0, atol=1e-8)
    assert data.types[0].tolist() == written.types.tolist()
    assert data.marks[0, :, 2].tolist() == written.fills.tolist()
    assert ev.read_lobster(written.path, merge=False).events == written.fills.sum()


def _warnings(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if "same time as the previous one" in str(w.message)]


def test_goodness_warns_when_ties_decide_the_fit_and_not_otherwise(tmp_path):
    written = write_lobster(tmp_path / "day.csv", duration=300.0, seed=1)
    model, truth = written.model, written.truth
    merged = ev.read_lobster(written.path)
    fills = ev.read_lobster(written.path, merge=False)
    assert _warnings(lambda: ev.goodness(model, truth, merged)) == []
    caught = _warnings(lambda: ev.goodness(model, truth, fills))
    assert len(caught) == 2 and "read_lobster(merge=True)" in str(caught[0].message)
    good, tied = ev.goodness(model, truth, merged), _quiet(lambda: ev.goodness(model, truth, fills))
    zeros = [float((abs(r) < 1e-12).mean()) for r in tied.residuals]  # 0 up to rounding
    assert min(zeros) > 0.3 and min(tied.ks) >= min(zeros) - 0.05 and min(good.pvalue) > 0.05
    assert ev.rescaling.tie_threshold(100) == pytest.approx(0.068) and ev.rescaling.tie_threshold(10**6) == 0.01


def test_a_few_ties_do_not_warn():
    times = np.arange(1, 401) * 0.5
    times[100] = times[99]  # one tie in 400: below 1% and half the critical value
    data = ev.from_table(times, end_time=201.0)
    poisson = {"baseline": [2.0], "adjacency": [[1e-6]], "decay": 1.0}
    assert _warnings(lambda: ev.goodness(ev.hawkes(), poisson, data)) == []


def _quiet(call):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return call()


class Frame:
    """The part of a pandas DataFrame that ``from_table`` reads: ``columns`` and ``frame[name]``."""

    def __init__(self, **columns):
        self._columns = {name: np.asarray(values) for name, values in columns.items()}
        self.columns = list(columns)

    def __getitem__(self, name):
        if isinstance(name, list):
            return np.stack([self._columns[n] for n in name], axis=1)
        return self._columns[name]


def test_table_columns_are_read_by_name_and_other_names_are_refused():
    table = ev.from_table(Frame(time=[0.5, 1.0], type=[1, 0], mark=[3.0, 4.0]), end_time=2.0)
    assert table.types.tolist() == [[1, 0]] and table.marks[0, :, 0].tolist() == [3.0, 4.0]
    two = ev.from_table(Frame(time=[0.5, 1.0], mark_size=[3.0, 4.0], mark_sign=[1.0, -1.0]), end_time=2.0)
    assert two.marks.tolist() == [[[3.0, 1.0], [4.0, -1.0]]] and two.dimension == 1
    with pytest.raises(ValueError, match=r"columns time, type \(optional\) and mark .* got \['time', 'side', 'size'\]"):
        ev.from_table(Frame(time=[0.5, 1.0], side=[1, 0], size=[3.0, 4.0]), end_time=2.0)
    with pytest.raises(ValueError, match=r"rename them, e.g. df.rename"):
        ev.as_events(Frame(t=[0.5, 1.0]), end_time=2.0)
    columns = {"time": [0.5, 1.0], "type": [1, 0], "mark_size": [3.0, 4.0], "mark_sign": [1.0, -1.0]}
    as_dict = ev.as_events(columns, end_time=2.0)
    assert torch.equal(as_dict.marks, two.marks) and as_dict.types.tolist() == [[1, 0]]
    with pytest.raises(ValueError, match=r"got \['time', 'side'\]"):
        ev.as_events({"time": [0.5, 1.0], "side": [1, 0]}, end_time=2.0)
    with pytest.raises(ValueError, match=r"time must be 1-D .* from_table\(a\[:, 0\], a\[:, 1\], a\[:, 2\]"):
        ev.from_table(np.array([[0.5, 0, 1.0], [1.0, 1, 2.0]]), end_time=2.0)


def test_datetimes_are_refused_with_the_conversion_to_seconds():
    stamps = np.array(["2024-01-02T09:30:00", "2024-01-02T09:30:01"], dtype="datetime64[ns]")
    with pytest.raises(TypeError, match=r"time holds datetimes .* np.timedelta64\(1, 's'\)"):
        ev.from_table(stamps, end_time=2.0)
    with pytest.raises(TypeError, match=r"dt.total_seconds\(\)"):
        ev.from_table(Frame(time=stamps), end_time=2.0)
    seconds = (stamps - stamps[0]) / np.timedelta64(1, "s")  # the fix the message gives
    assert ev.from_table(seconds, end_time=2.0).times.tolist() == [[0.0, 1.0]]


def test_a_lobster_file_with_a_header_row_says_the_fix(tmp_path):
    path = _write(tmp_path / "msg.csv", ROWS, header="Time,Type,OrderID,Size,Price,Direction")
    with pytest.raises(
        ValueError, match=r"first row 'Time,Type,.* no header row; pass read_lobster\(\.\.\., header=True\)"
    ):
        ev.read_lobster(path)
    plain = ev.read_lobster(_write(tmp_path / "plain.csv", ROWS))
    headed = ev.read_lobster(path, header=True)
    assert torch.equal(headed.times, plain.times) and torch.equal(headed.marks, plain.marks)
    assert torch.equal(ev.read_lobster(tmp_path / "plain.csv", header=True).times, plain.times)  # none: nothing skipped
