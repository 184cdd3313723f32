"""fwdtrain's solvers against a peer's: torchsde's Euler, Milstein and Heun on the same Brownian increments.

With theta frozen (lr = 0) and the increments of one table fed to both libraries, each fwdtrain solver's path
equals torchsde's scheme of the same name to rounding (float64), and fwdtrain's forward sensitivity x_tilde
equals reverse-mode autograd through torchsde's own discrete chain: two independent implementations of the
scheme and of its derivative.

torchsde is a test-only peer, installed without its dependencies so that torch stays pinned:
``pip install --no-deps torchsde trampoline`` (``.ci/run`` does); without it these tests are skipped.
"""

from __future__ import annotations

import pytest
import torch
from conftest import additive_2d, diagonal_2d, nonlinear_2d, one_noise_2d
from torch.func import vmap

import fwdtrain as ft
from fwdtrain.core.state import noise_dim

torchsde = pytest.importorskip("torchsde")

F64 = torch.float64
H = 1.0 / 64  # a power of two: torchsde's clock t + h stays on the grid exactly
STEPS = 32
PARTICLES = 5
X0 = torch.tensor([0.3, -0.2], dtype=F64)

# fwdtrain's solver, torchsde's method, sde_type and noise_type, the problem. Heun is torchsde's Stratonovich
# scheme; for a diffusion independent of x the Ito and Stratonovich solutions and schemes coincide.
CASES = {
    "euler-general": (ft.Euler, "euler", "ito", "general", nonlinear_2d),
    "euler-diagonal": (ft.Euler, "euler", "ito", "diagonal", diagonal_2d),
    "milstein-diagonal": (ft.Milstein, "milstein", "ito", "diagonal", diagonal_2d),
    "milstein-scalar": (ft.Milstein, "milstein", "ito", "scalar", one_noise_2d),
    "heun-additive": (ft.Heun, "heun", "stratonovich", "additive", additive_2d),
}


class IncrementTable(torchsde.BaseBrownian):
    """A Brownian motion given by its increments on the grid n h: torchsde asks for (n h, (n + 1) h)."""

    def __init__(self, increments: torch.Tensor) -> None:
        self.increments = increments  # (steps, particles, m)

    def __call__(self, ta, tb=None, return_U=False, return_A=False):
        n = round(float(ta) / H)
        assert tb is not None and round(float(tb) / H) == n + 1, "torchsde left the grid"
        return self.increments[n]

    def __repr__(self) -> str:
        return f"IncrementTable({tuple(self.increments.shape)})"

    dtype = property(lambda self: self.increments.dtype)
    device = property(lambda self: self.increments.device)
    shape = property(lambda self: self.increments.shape[1:])
    levy_area_approximation = property(lambda self: "none")


def torchsde_problem(sde: ft.SDE, theta: dict, sde_type: str, noise_type: str):
    """The same drift and diffusion as a torchsde SDE over a batch of particles (per-particle functions vmapped)."""
    drift = vmap(sde.drift, in_dims=(None, 0))
    diffusion = vmap(sde.diffusion, in_dims=(None, 0))

    class Peer(torch.nn.Module):
        def f(self, t, y):
            return drift(theta, y)

        def g(self, t, y):
            return diffusion(theta, y)  # (N, d) for diagonal noise, (N, d, m) otherwise

    peer = Peer()
    peer.sde_type, peer.noise_type = sde_type, noise_type
    return peer


@pytest.mark.parametrize("case", list(CASES))
def test_paths_and_sensitivities_equal_torchsde_on_the_same_increments(case):
    solver, method, sde_type, noise_type, make = CASES[case]
    sde, theta = make()
    m = noise_dim(sde, theta, X0.expand(PARTICLES, -1))
    generator = torch.Generator().manual_seed(11)
    increments = torch.randn(STEPS, PARTICLES, m, generator=generator, dtype=F64) * H**0.5

    state = ft.init(sde, theta, X0, particles=PARTICLES)
    for dw in increments:
        state = ft.step(sde, state, dw, H, 0.0, solver=solver())

    leaves = {name: value.clone().requires_grad_(True) for name, value in theta.items()}
    peer = torchsde_problem(sde, leaves, sde_type, noise_type)
    y0 = X0.expand(PARTICLES, -1).clone()
    ts = torch.tensor([0.0, STEPS * H], dtype=F64)
    path = torchsde.sdeint(peer, y0, ts, bm=IncrementTable(increments), method=method, dt=H)
    x_peer = path[-1]

    torch.testing.assert_close(state.x, x_peer.detach(), rtol=1e-12, atol=1e-13)
    for name, leaf in leaves.items():
        rows = [torch.autograd.grad(y, leaf, retain_graph=True)[0] for y in x_peer.reshape(-1)]
        backprop = torch.stack(rows).reshape(*x_peer.shape, *leaf.shape)
        torch.testing.assert_close(state.x_tilde[name], backprop, rtol=1e-10, atol=1e-12, msg=f"dX/d{name}")


def test_the_table_is_what_torchsde_reads():
    """The peer comparison means something only if torchsde takes every increment of the table, in order:
    an Euler path of dX = dW is the running sum of the increments."""
    increments = torch.randn(STEPS, 3, 1, generator=torch.Generator().manual_seed(2), dtype=F64) * H**0.5

    class Walk(torch.nn.Module):
        sde_type, noise_type = "ito", "diagonal"

        def f(self, t, y):
            return torch.zeros_like(y)

        def g(self, t, y):
            return torch.ones_like(y)

    ts = torch.arange(STEPS + 1, dtype=F64) * H
    walk = torchsde.sdeint(
        Walk(), torch.zeros(3, 1, dtype=F64), ts, bm=IncrementTable(increments), method="euler", dt=H
    )
    torch.testing.assert_close(walk[1:], increments.cumsum(0), rtol=0, atol=1e-15)
