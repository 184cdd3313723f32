import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

import fwdtrain as ft

_MACHINE_CACHES = ("XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "MPLCONFIGDIR")


def pytest_configure(config):
    """The caches a machine keeps between tests (inductor's builds, its instruction-set probe and headers;
    matplotlib's configuration and font list) in one temporary folder of the session, set before any test
    module is imported: the suite never reads or writes the user's ``~/.cache`` or ``~/.config``."""
    root = Path(tempfile.mkdtemp(prefix="fwdtrain-tests-"))
    config.stash[_ROOT] = (root, {name: os.environ.get(name) for name in _MACHINE_CACHES})
    for name, folder in zip(_MACHINE_CACHES, ("xdg", "inductor", "matplotlib"), strict=True):
        os.environ[name] = str(root / folder)


def pytest_unconfigure(config):
    root, saved = config.stash[_ROOT]
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    shutil.rmtree(root, ignore_errors=True)


_ROOT = pytest.StashKey[tuple]()


@pytest.fixture(autouse=True)
def own_cache_folder(tmp_path_factory, monkeypatch):
    """Every test its own fwdtrain cache folder (kernel packages), beside its temporary folder: no test sees what
    another wrote, and a test's ``tmp_path`` holds only what it wrote. The default run compiles nowhere (a test of
    tiered compilation passes ``Compile(after=...)``): a suite's runs of thousands of steps would otherwise start
    real compiles in the background."""
    folder = tmp_path_factory.mktemp("fwdtrain-cache")
    monkeypatch.setenv("FWDTRAIN_CACHE_DIR", str(folder))
    monkeypatch.setenv("FWDTRAIN_COMPILE_AFTER", str(10**9))  # no background compile unless a test asks for one
    return folder


def nonlinear_2d(dtype=torch.float64) -> tuple[ft.SDE, dict]:
    """A 2-D SDE whose drift, full (2 x 3) diffusion and cost all depend on x and theta."""
    theta = {
        "a": torch.tensor([[-1.0, 0.3], [0.2, -0.8]], dtype=dtype),
        "s": torch.tensor([0.4, 0.25], dtype=dtype),
        "w": torch.tensor(0.7, dtype=dtype),
    }

    def drift(th, x):
        return th["a"] @ x + th["w"] * torch.sin(x)

    def diffusion(th, x):
        col0 = th["s"] * torch.cos(x)
        col1 = torch.stack([th["w"] * x[1], 0.3 + 0.1 * x[0] ** 2])
        col2 = torch.tanh(th["a"] @ x) * 0.2
        return torch.stack([col0, col1, col2], dim=1)

    def cost(th, x):
        return (x**2).sum() + th["w"] ** 2 * x[0] + (th["s"] * x).sum() ** 2

    return ft.SDE(drift, diffusion, cost), theta


def diagonal_2d(dtype=torch.float64) -> tuple[ft.SDE, dict]:
    """A 2-D SDE with diagonal noise sigma(x, theta) = softplus(b) * sqrt(1 + x^2)."""
    theta = {"k": torch.tensor([1.2, 0.7], dtype=dtype), "b": torch.tensor([0.1, -0.3], dtype=dtype)}

    def drift(th, x):
        return -th["k"] * x + 0.1 * x.flip(0)

    def diffusion(th, x):
        return torch.nn.functional.softplus(th["b"]) * torch.sqrt(1 + x**2)

    def cost(th, x):
        return (x**2).sum() + (th["k"] ** 2).sum() * 0.01

    return ft.SDE(drift, diffusion, cost), theta


def additive_2d(dtype=torch.float64):
    """Nonlinear drift, a diffusion (2 x 2) that depends on theta but not on x: Heun's domain."""
    theta = {"a": torch.tensor([[-1.0, 0.3], [0.2, -0.8]], dtype=dtype), "s": torch.tensor([0.4, 0.6], dtype=dtype)}

    def drift(th, x):
        return th["a"] @ x + 0.5 * torch.sin(x * th["s"])

    def diffusion(th, x):
        return torch.diag(th["s"]) + 0.1 * th["a"]

    def cost(th, x):
        return (x**2).sum() + (th["s"] * x).sum() ** 2

    return ft.SDE(drift, diffusion, cost), theta


def one_noise_2d(dtype=torch.float64):
    """One Brownian motion (sigma of shape (2, 1)) that depends on x: Milstein's scalar-noise case."""
    theta = {"k": torch.tensor([1.2, 0.7], dtype=dtype), "s": torch.tensor([0.5, 0.3], dtype=dtype)}

    def drift(th, x):
        return -th["k"] * x + 0.2 * x.flip(0)

    def diffusion(th, x):
        return (th["s"] * torch.cos(x) + 0.1 * x.flip(0)).unsqueeze(1)

    def cost(th, x):
        return (x**2).sum() + th["k"].sum() * x[0]

    return ft.SDE(drift, diffusion, cost), theta


def boom(*, particles=2, dt=0.1, steps=200, lr=0.0, seed=0, dtype=torch.float64):
    """dX = a X^3 dt + dW from x = 2: non-finite within a few steps."""
    sde = ft.SDE(
        drift=lambda th, x: th["a"] * x**3, diffusion=lambda th, x: torch.ones_like(x), cost=lambda th, x: (x * x).sum()
    )
    return ft.examples.Example(
        "boom",
        sde,
        {"a": torch.tensor(1.0, dtype=dtype)},
        torch.full((1,), 2.0, dtype=dtype),
        particles,
        dt,
        steps,
        ft.schedules.constant(lr),
        {"cost": 1.0},
        lambda theta: {"cost": 1.0},
    )


@pytest.fixture
def lqr64():
    return ft.examples.lqr_1d(dtype=torch.float64, particles=4)


@pytest.fixture
def engine_calls(monkeypatch):
    """Counts of the event-likelihood engines' chunk calls by kind ("exponential", "additive", "general")."""
    from fwdtrain.events import likelihood

    calls = {"exponential": 0, "additive": 0, "general": 0}
    for name in calls:
        original = getattr(likelihood, f"_{name}_chunk")

        def counted(*args, name=name, original=original):
            calls[name] += 1
            return original(*args)

        monkeypatch.setattr(likelihood, f"_{name}_chunk", counted)
    return calls
