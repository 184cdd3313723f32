"""The seed's stateful PyTorch loop (../shared/seeds/), repaired just enough to run, as a baseline.

Kept as the user wrote it (an ``nn.Module`` updated in place, autograd ``backward`` for
f_x and f_theta, one particle, the same 1 -> 16 -> 1 ReLU network and dt) with the
fixes the issue names:

- the accepted answer's detach fix: the forward pass in ``step`` runs on
  ``X.detach().clone().requires_grad_()``, and X itself is detached when it is
  updated (otherwise X carries an autograd graph that grows by one node per step);
- the evaluation input is a float tensor (the seed passes a Long tensor);
- dc uses Xtilde_c (the seed used Xtilde_w).

Left as the seed has it: the per-step ``print`` is removed (it is I/O, not the
algorithm), and the update order still mixes old and new values (X is moved
first and the theta update reads the new X); that changes no cost per step.
"""

from __future__ import annotations

import math

import torch


class OneDimensionalLQR:
    """One particle of dX = (-X + f(X)) dt + dW, cost X^2 + f(X)^2, trained online in place."""

    def __init__(
        self, hidden_units: int = 16, learning_rate: float = 0.5, seed: int = 0, dtype: torch.dtype = torch.float32
    ):
        torch.manual_seed(seed)
        self.C = learning_rate
        self.generator = torch.Generator().manual_seed(seed)
        self.dtype = dtype
        self.layer1 = torch.nn.Linear(1, hidden_units).to(dtype)
        self.layer2 = torch.nn.Linear(hidden_units, 1, bias=False).to(dtype)
        self.model = torch.nn.Sequential(self.layer1, torch.nn.ReLU(), self.layer2)
        self.w, self.b, self.c = self.layer1.weight, self.layer1.bias, self.layer2.weight
        self.Xtilde_w = torch.zeros((hidden_units, 1), dtype=dtype)
        self.Xtilde_c = torch.zeros((hidden_units, 1), dtype=dtype)
        self.Xtilde_b = torch.zeros((hidden_units,), dtype=dtype)
        self.X = torch.ones((1,), dtype=dtype)
        self.time = 0.0
        self._gradients()

    def _gradients(self) -> None:
        self.model.zero_grad()
        x = self.X.detach().clone().requires_grad_()
        self.f_x = self.model(x)
        self.f_x.backward()
        self.grad_x = x.grad
        self.grad_c = self.c.grad.T
        self.grad_b = self.b.grad
        self.grad_w = self.w.grad

    def step(self, delta: float):
        self.time += delta
        self.step_X(delta)
        self.step_Xtilde(delta)
        self.step_theta(delta)
        self._gradients()
        return self.w, self.c, self.b

    def step_X(self, delta: float) -> None:
        noise = torch.randn((1,), generator=self.generator, dtype=self.dtype) * math.sqrt(delta)
        self.X = (self.X + (-self.X + self.f_x.detach()) * delta + noise).detach()

    def step_Xtilde(self, delta: float) -> None:
        self.Xtilde_w = self.Xtilde_w + (-self.Xtilde_w + self.grad_w + self.grad_x * self.Xtilde_w) * delta
        self.Xtilde_b = self.Xtilde_b + (-self.Xtilde_b + self.grad_b + self.grad_x * self.Xtilde_b) * delta
        self.Xtilde_c = self.Xtilde_c + (-self.Xtilde_c + self.grad_c + self.grad_x * self.Xtilde_c) * delta

    def step_theta(self, delta: float) -> None:
        alpha = self.learning_rate(self.time)
        f_x = self.f_x.detach()
        dw = alpha * (2 * self.X * self.Xtilde_w + 2 * f_x * (self.grad_w + self.grad_x * self.Xtilde_w)) * delta
        db = alpha * (2 * self.X * self.Xtilde_b + 2 * f_x * (self.grad_b + self.grad_x * self.Xtilde_b)) * delta
        dc = alpha * (2 * self.X * self.Xtilde_c + 2 * f_x * (self.grad_c + self.grad_x * self.Xtilde_c)) * delta
        with torch.no_grad():
            self.layer1.weight.sub_(dw)
            self.layer1.bias.sub_(db)
            self.layer2.weight.sub_(dc.T)

    def learning_rate(self, time: float) -> float:
        c = self.C
        if time > 500:
            return c / 10
        if time > 100:
            return c / 5
        if time > 50:
            return c / 2
        return c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


def train(
    steps: int, dt: float = 0.01, hidden_units: int = 16, learning_rate: float = 0.5, seed: int = 0
) -> OneDimensionalLQR:
    """The seed's training loop without its per-step print."""
    propagator = OneDimensionalLQR(hidden_units, learning_rate, seed)
    for _ in range(steps):
        propagator.step(dt)
    return propagator


if __name__ == "__main__":
    import time

    start = time.perf_counter()
    trained = train(20_000)
    elapsed = time.perf_counter() - start
    x = torch.linspace(-1, 1, 5).unsqueeze(1)
    with torch.no_grad():
        print("u(x) at", x.flatten().tolist(), "=", trained.forward(x).flatten().tolist())
    print(f"{20_000 / elapsed:.0f} steps/s")
