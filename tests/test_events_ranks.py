"""Realizations split across 2 processes (gloo on CPU): the batch fit with log L, gradient and information summed
over the ranks equals the fit of one process holding every realization."""

from __future__ import annotations

import pytest
import torch

import fwdtrain as ft
from fwdtrain import distributed as D
from fwdtrain.events.ranks import group_sum

pp = ft.pointprocess
TRUTH = {"baseline": [0.5, 0.3], "adjacency": [[0.5, 0.0], [0.3, 0.4]], "decay": 1.5}
START = {"baseline": [0.4, 0.4], "adjacency": [[0.2, 0.2], [0.2, 0.2]], "decay": 1.0}


def _days():
    return pp.simulate(pp.hawkes(dimension=2), TRUTH, 150.0, seed=8, realizations=4)


def _mine(data, rank, size):
    """This rank's realizations: rank, rank + size, ..."""
    rows = torch.arange(rank, data.realizations, size)
    return data._replace(
        times=data.times[rows],
        types=data.types[rows],
        marks=data.marks[rows],
        mask=data.mask[rows],
        start=data.start[rows],
        end=data.end[rows],
    )


def _rank_worker():
    mine = _mine(_days(), D.rank(), D.world_size())
    model = pp.hawkes(dimension=2)
    given = pp.fit(model, mine, start=START, reduce=group_sum)
    default = pp.fit(model, mine, reduce=group_sum)
    return given, default, mine.events


def _same(a, b, rtol):
    for name in a.params:
        torch.testing.assert_close(a.params[name], b.params[name], rtol=rtol, atol=rtol)
        torch.testing.assert_close(a.stderr[name], b.stderr[name], rtol=rtol * 100, atol=rtol)
    torch.testing.assert_close(a.information, b.information, rtol=rtol * 100, atol=rtol)
    assert a.log_likelihood == pytest.approx(b.log_likelihood, rel=1e-12)
    assert a.events == b.events


def test_two_ranks_fit_what_one_process_fits():
    ranks = D.launch(_rank_worker, 2, (), timeout=120.0)
    model = pp.hawkes(dimension=2)
    whole = pp.fit(model, _days(), start=START)
    assert sum(events for _, _, events in ranks) == whole.events and min(e for _, _, e in ranks) > 500
    for given, default, _ in ranks:
        assert given.iterations == whole.iterations and given.converged
        _same(given, whole, 1e-10)  # the same start: the same Newton steps, sums in another order
        _same(default, whole, 1e-7)  # the ranks' mean start: the same optimum to Newton's tolerance
    for name in whole.params:  # bitwise one estimate on every rank
        assert torch.equal(ranks[0][0].params[name], ranks[1][0].params[name])


def test_without_a_group_the_sum_is_the_tensor_itself():
    tensor = torch.arange(3.0)
    assert group_sum(tensor) is tensor
