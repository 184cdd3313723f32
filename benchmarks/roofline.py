"""Roofline numbers: work per particle-step and this machine's measured peaks.

- flops per particle-step: the matmul-class floating-point operations of one eager
  ``advance`` (torch.utils.flop_counter.FlopCounterMode: mm, bmm, addmm, ...; the
  elementwise work is not counted, so this is a lower bound), divided by N.
- bytes per particle-step: the compulsory traffic, reading and writing the state of
  one particle (x: d numbers, Xtilde: d p numbers) and reading its noise (m numbers).
- peaks: float32 matmul GFLOP/s (torch.mm of two 2048 x 2048 matrices) and copy
  GB/s (2 x bytes of a 256 MiB copy into an already-touched tensor / time, read +
  write), all threads; best of repeats.
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

import torch
from torch.utils.flop_counter import FlopCounterMode

import fwdtrain as ft

from .problems import Problem


class Peaks(NamedTuple):
    matmul_gflops: float
    copy_gbs: float


def per_particle_step(problem: Problem, particles: int) -> tuple[float, float]:
    """(matmul flops, compulsory bytes) per particle-step for ``problem`` with N = ``particles``."""
    state = ft.init(problem.sde, problem.theta, problem.x0, particles)
    trainable = ft.problems.CostForm(problem.sde)
    m = trainable.noise_shape(state)[1]
    dw = torch.zeros(particles, m, dtype=state.x.dtype)
    counter = FlopCounterMode(display=False)
    with counter:
        trainable.advance(state, dw, problem.dt, 0.1, trainable.plan(state))
    d = state.dim
    p = ft.core._tree.size(state.theta)
    itemsize = state.x.element_size()
    return counter.get_total_flops() / particles, float((2 * (d + d * p) + m) * itemsize)


def _best_seconds(fn, repeats: int) -> float:
    fn()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def machine_peaks(quick: bool = False) -> Peaks:
    n = 512 if quick else 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    matmul = 2 * n**3 / _best_seconds(lambda: torch.mm(a, b), 3 if quick else 10) / 1e9
    source = torch.ones((2**22 if quick else 2**26,), dtype=torch.float32)
    target = torch.zeros_like(source)  # written once already: no page faults in the timed copies
    copy = 2 * source.numel() * 4 / _best_seconds(lambda: target.copy_(source), 3 if quick else 10) / 1e9
    return Peaks(matmul, copy)


def report(rows: list[dict], peaks: Peaks) -> list[dict]:
    """Per work size: the best fwdtrain variant's achieved GFLOP/s and GB/s against the peaks; printed."""
    print(
        f"roofline (peaks: matmul {peaks.matmul_gflops:.1f} GFLOP/s, copy {peaks.copy_gbs:.1f} GB/s; "
        f"flops = matmul-class only)"
    )
    print(
        f"{'work':<16}{'best variant':<26}{'flop/p-step':>12}{'byte/p-step':>12}{'GFLOP/s':>9}"
        f"{'% mm peak':>10}{'GB/s':>8}{'% copy peak':>12}"
    )
    out = []
    for work in dict.fromkeys(r["work"] for r in rows):
        mine = [r for r in rows if r["work"] == work and r["variant"].startswith("fwdtrain")]
        if not mine:  # the user-loop rows: a step per call, no roofline
            continue
        best = max(mine, key=lambda r: r["particle_steps_per_s"])
        rate = best["particle_steps_per_s"]
        gflops = best["flops_per_particle_step"] * rate / 1e9
        gbs = best["bytes_per_particle_step"] * rate / 1e9
        entry = {
            "work": work,
            "variant": best["variant"],
            "flops_per_particle_step": best["flops_per_particle_step"],
            "bytes_per_particle_step": best["bytes_per_particle_step"],
            "gflops": gflops,
            "gbs": gbs,
            "fraction_matmul_peak": gflops / peaks.matmul_gflops,
            "fraction_copy_peak": gbs / peaks.copy_gbs,
        }
        out.append(entry)
        print(
            f"{work:<16}{best['variant']:<26}{entry['flops_per_particle_step']:>12,.0f}"
            f"{entry['bytes_per_particle_step']:>12,.0f}{gflops:>9.3f}{100 * entry['fraction_matmul_peak']:>10.2f}"
            f"{gbs:>8.3f}{100 * entry['fraction_copy_peak']:>12.2f}"
        )
    return out
