"""The online fit: one pass with second-order updates ends within 3 standard errors of the batch MLE, and a fit
continued as new events arrive equals one pass over all of them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fwdtrain as ft

pp = ft.pointprocess
TRUTH = {"baseline": [0.5, 0.3], "adjacency": [[0.5, 0.0], [0.3, 0.4]], "decay": 1.5}  # one entry at 0


def _distances(model, data, start=None):
    """|online - batch| / SE on every entry, SE the batch's unconditioned sqrt(diag(I^-1)) (defined at 0 too)."""
    batch = pp.fit(model, data)
    online = pp.fit(model, data, method="online", start=start)
    assert batch.converged and online.events == batch.events == data.events
    flat = lambda params: torch.cat([params[name].reshape(-1) for name in model.parameters])
    scale = torch.linalg.inv(batch.information).diagonal().sqrt()
    return ((flat(online.params) - flat(batch.params)).abs() / scale).numpy(), batch, online


@pytest.mark.parametrize(("end", "realizations", "blocks"), [(300.0, 10, (8, 20)), (3_000.0, 1, (70, 130))])
def test_one_online_pass_ends_within_3_standard_errors_of_the_batch_mle(end, realizations, blocks):
    model = pp.hawkes(dimension=2)
    data = pp.simulate(model, TRUTH, end, seed=5, realizations=realizations)
    distances, batch, online = _distances(model, data)
    assert (distances < 3).all(), distances
    assert blocks[0] < online.iterations < blocks[1] and len(online.path["decay"]) == online.iterations
    assert float(batch.params["adjacency"][0, 1]) < 0.05  # the entry near 0 is among those checked
    ratio = torch.cat([online.stderr[k].reshape(-1) / batch.stderr[k].reshape(-1) for k in ("baseline", "decay")])
    assert bool(((ratio > 0.7) & (ratio < 1.4)).all()), ratio  # the pass's information is the batch's, roughly


@pytest.mark.parametrize(("end", "realizations"), [(1_500.0, 1), (150.0, 10)])
def test_a_multi_scale_online_fit_keeps_weights_at_0(end, realizations):
    model = pp.hawkes(dimension=2, decays=(1.0, 10.0, 100.0))
    truth = {"baseline": [0.4, 0.3], "adjacency": [[[0.3, 0.2, 0.0], [0.0] * 3], [[0.2, 0.1, 0.0], [0.25, 0.2, 0.0]]]}
    data = pp.simulate(model, truth, end, seed=11, realizations=realizations)
    distances, _, online = _distances(model, data)
    assert (distances < 3).all(), distances
    assert bool(online.at_bound["adjacency"].any()) and bool((online.params["adjacency"] >= 0).all())


def _slice(data, a, b, start, end):
    return data._replace(
        times=data.times[:, a:b],
        types=data.types[:, a:b],
        marks=data.marks[:, a:b],
        mask=data.mask[:, a:b],
        start=torch.tensor([start], dtype=torch.float64),
        end=torch.tensor([end], dtype=torch.float64),
    )


BOOK = {"baseline": [-0.3, 0.2], "weights": [[-0.8], [0.6]], "kappa": 0.7}


@pytest.mark.parametrize(
    ("kind", "cut"),
    [("hawkes", 64 * 5), ("hawkes", 64 * 5 + 17), ("order_book", 64 * 5 + 17)],  # a block boundary, inside a block
)
def test_a_continued_online_fit_equals_one_pass_over_the_concatenated_events(kind, cut):
    if kind == "hawkes":  # the exponential engine
        model, truth, marks = pp.hawkes(dimension=2), TRUTH, None
    else:  # a state moved by marks, its compensator by quadrature on pieces counted from the previous event
        model, truth, marks = pp.order_book(), BOOK, lambda rng, k: [1.0 + rng.integers(3)]
    data = pp.simulate(model, truth, 600.0, seed=3, marks=marks)
    middle = float(data.times[0, cut - 1] + data.times[0, cut]) / 2
    start = model.start(data)  # the default start depends on the data: both passes start from the same
    whole = pp.fit(model, data, method="online", start=start)
    first = pp.fit(model, _slice(data, 0, cut, 0.0, middle), method="online", start=start)
    later = pp.fit(model, _slice(data, cut, data.times.shape[1], middle, 600.0), method="online", state=first.state)
    assert later.iterations == whole.iterations and later.events == whole.events
    assert first.events == cut and first.iterations == -(-cut // 64)  # the first call's result has all its events
    for name in whole.params:
        torch.testing.assert_close(later.params[name], whole.params[name], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(later.stderr[name], whole.stderr[name], rtol=1e-10, atol=1e-12, equal_nan=True)
    assert later.log_likelihood == pytest.approx(whole.log_likelihood, rel=1e-12)
    name = next(iter(whole.path))
    steps = later.path[name].shape[0]
    torch.testing.assert_close(later.path[name], whole.path[name][-steps:], rtol=1e-12, atol=0)


def test_a_continued_fit_refuses_events_from_before_its_state():
    model = pp.hawkes(dimension=2)
    data = pp.simulate(model, TRUTH, 100.0, seed=3)
    first = pp.fit(model, data, method="online")
    with pytest.raises(ValueError, match=r"realization 0: the new events start at .* not after the state's last"):
        pp.fit(model, data, method="online", state=first.state)
    two = pp.simulate(model, TRUTH, 100.0, seed=3, realizations=2)
    with pytest.raises(ValueError, match=r"follows 1 realizations but the new events have 2"):
        pp.fit(model, two, method="online", state=first.state)
    with pytest.raises(ValueError, match=r"takes the options \['block', 'prior', 'radius', 'state'\], got \['lr'\]"):
        pp.fit(model, data, method="online", lr=0.1)
    with pytest.raises(ValueError, match=r"not both"):
        pp.fit(model, data, method="online", state=first.state, start=first.params)


def test_the_block_scores_sum_to_the_batch_gradient_and_the_fisher_information_is_an_outer_product():
    model = pp.hawkes(dimension=2)
    data = pp.simulate(model, TRUTH, 50.0, seed=1)
    prepared = ft.events.prepare(model, data)
    state = ft.events.online.begin(model, prepared, TRUTH)
    step = ft.events.online.block_step(model, prepared.piece, state.u, state.carry, state.tangents)
    # one block of all events: its score is the gradient of log L without the tail after the last event
    value = lambda w: ft.events.likelihood.forward(model, ft.events.unpack(model, w), prepared)
    gradient = torch.func.jacrev(lambda w: value(w).log_likelihood + value(w).tail.sum())(state.u)
    torch.testing.assert_close(step.score, gradient, rtol=1e-9, atol=1e-9)
    per_event = torch.func.jacrev(lambda w: value(w).log_rates[data.mask])(state.u)  # (n, p)
    torch.testing.assert_close(step.fisher, per_event.T @ per_event, rtol=1e-10, atol=1e-10)
    assert float(torch.linalg.eigvalsh(step.fisher).min()) > -1e-9
    np.testing.assert_allclose(
        float(step.log_likelihood), float(value(state.u).log_likelihood + value(state.u).tail.sum())
    )


@pytest.mark.parametrize("decay", [0.2, 50.0, 150.0])
@pytest.mark.parametrize(("end", "realizations"), [(1_500.0, 1), (150.0, 10)])
def test_a_pass_from_the_default_start_reaches_a_decay_far_from_it(decay, end, realizations, monkeypatch):
    # the default start's decay is the event rate, about 2: 10 times too large, or 25 and 75 times too small
    model = pp.hawkes(dimension=2)
    data = pp.simulate(model, {**TRUTH, "decay": decay}, end, seed=5, realizations=realizations)
    calls = []
    block_step = ft.events.online.block_step
    monkeypatch.setattr(ft.events.online, "block_step", lambda *a: calls.append(1) or block_step(*a))
    distances, _, online = _distances(model, data)
    assert (distances < 3).all(), distances
    # the prefix's models taken again after blocks 1, 2, 4, ..., 32: at most that many extra blocks per repetition
    again = sum(min(online.iterations, n) for n in (1, 2, 4, 8, 16, 32) if n <= online.iterations)
    assert online.iterations < len(calls) <= online.iterations + ft.events.online.RELINEARISATIONS * again


def test_a_state_dependent_model_online_ends_within_3_standard_errors_of_its_batch_mle():
    # the order book's state depends on theta (kappa): the pass carries its sensitivity from block to block
    model = pp.order_book()
    data = pp.simulate(model, BOOK, 1_000.0, seed=2, realizations=2, marks=lambda rng, k: [1.0 + rng.integers(3)])
    distances, _, _ = _distances(model, data)
    assert (distances < 3).all(), distances
