"""The exponential-kernel engine's pieces against independent computations: the blocked scan against a plain loop,
the explicit jets of the sums against torch.func's nested forward mode, the closed-form derivatives of log L
against torch.func's Hessian of the jet log-likelihood."""

from __future__ import annotations

import pytest
import torch

import fwdtrain as ft
from fwdtrain.events import likelihood, models
from fwdtrain.events.expsums import exponential_sum_jets, exponential_sums, linear_scan

D64 = torch.float64
pp = ft.pointprocess


@pytest.mark.parametrize("n", [1, 7, 16, 17, 300, 1000])
def test_the_blocked_scan_equals_a_loop(n):
    generator = torch.Generator().manual_seed(n)
    a = torch.rand((2, n, 1, 3), dtype=D64, generator=generator)
    c = torch.randn((2, n, 4, 3), dtype=D64, generator=generator)
    x, expected = torch.zeros_like(c[:, 0]), []
    for i in range(n):
        x = a[:, i] * x + c[:, i]
        expected.append(x)
    assert torch.allclose(linear_scan(a, c, block=4), torch.stack(expected, 1), rtol=1e-13, atol=1e-13)


def test_the_jets_of_the_sums_equal_nested_forward_mode():
    generator = torch.Generator().manual_seed(0)
    times = torch.sort(torch.rand((2, 200), dtype=D64, generator=generator) * 50, 1).values
    onehot = torch.nn.functional.one_hot(torch.randint(0, 3, (2, 200), generator=generator), 3).to(D64)
    decays = torch.tensor([0.3, 2.0], dtype=D64)
    t0 = torch.tensor([-1.0, 0.0], dtype=D64)
    s0 = tuple(torch.rand((2, 2, 3), dtype=D64, generator=generator) for _ in range(3))
    ones = torch.ones_like(decays)

    def sums(b):  # the starting state as a Taylor polynomial in the decays: its jets are s0
        shift = (b - decays)[:, None]
        return exponential_sums(b, times, onehot, t0, s0[0] + s0[1] * shift + s0[2] * shift * shift / 2)

    (value, slope), (_, curve) = torch.func.jvp(lambda b: torch.func.jvp(sums, (b,), (ones,)), (decays,), (ones,))
    jets, last = exponential_sum_jets(decays, times, onehot, t0, s0)
    for mine, theirs in zip((*jets, *last), (value[0], slope[0], curve[0], value[1], slope[1], curve[1])):
        assert torch.allclose(mine, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["shared", "row", "sums"])
def test_the_closed_form_derivatives_equal_torch_func(kind):
    model = pp.hawkes(dimension=2, decays=(0.5, 4.0)) if kind == "sums" else pp.hawkes(dimension=2, decay=kind)
    data = pp.simulate(
        pp.hawkes(dimension=2), {"baseline": [0.5, 0.3], "adjacency": [[0.4, 0.2], [0.3, 0.3]], "decay": 1.5}, 200.0
    )
    prepared = likelihood.prepare(model, data)
    theta = model.start(prepared.data)
    u = models.pack(model, theta) + 0.1 * torch.randn(models.size(model), dtype=D64, generator=torch.Generator())
    jets = likelihood.kernel_jets(model, model.kernel.decays(models.unpack(model, u)), prepared, size=64)
    local = lambda w: likelihood.jet_log_likelihood(model, models.unpack(model, w), jets)
    value, gradient, hessian = likelihood.jet_derivatives(model, jets, lambda w: models.unpack(model, w), u)
    exact = likelihood.log_likelihood(model, models.unpack(model, u), prepared)
    assert torch.allclose(value, exact, rtol=1e-12)
    assert torch.allclose(gradient, torch.func.grad(local)(u), rtol=1e-10, atol=1e-9)
    assert torch.allclose(hessian, torch.func.hessian(local)(u), rtol=1e-10, atol=1e-8)
    assert torch.allclose(
        gradient,
        torch.func.grad(lambda w: likelihood.log_likelihood(model, models.unpack(model, w), prepared))(u),
        rtol=1e-9,
        atol=1e-8,
    )
