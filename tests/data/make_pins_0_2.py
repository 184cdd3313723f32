"""Record 0.2's eager results (hex floats) and a 0.2 checkpoint, for the 0.3 regression tests.

Run with fwdtrain 0.2 installed (it uses 0.2's API): python make_pins_0_2.py pins.json ck.pt resumed.json
"""

import json
import sys

import torch

import fwdtrain as ft
from fwdtrain import ensemble


def hexes(t):
    return [float(v).hex() for v in t.detach().double().reshape(-1).tolist()]


out = {}
# 1. lqr-1d, float32 default problem, eager run of 300 steps, N = 8
ex = ft.examples.lqr_1d(particles=8)
s0 = ft.init(ex.sde, ex.theta, ex.x0, 8)
s, h = ft.run(ex.sde, s0, 300, ex.dt, ex.lr, seed=3, record_every=100, compile=False, progress=False)
out["lqr1d_f32"] = {
    "theta.weight1": hexes(s.theta["weight1"]),
    "x": hexes(s.x),
    "average_cost": hexes(h.average_cost),
    "cost": hexes(h.cost),
}
# 2. float64 noisy-control (x- and theta-dependent diffusion), forward and reverse modes
ex = ft.examples.noisy_control(particles=6, dtype=torch.float64)
s0 = ft.init(ex.sde, ex.theta, ex.x0, 6)
for mode in ("reverse", "forward"):
    s, h = ft.run(ex.sde, s0, 200, ex.dt, ex.lr, seed=1, mode=mode, compile=False, progress=False)
    out[f"noisy_f64_{mode}"] = {
        "gain": hexes(s.theta["gain"]),
        "x_tilde": hexes(s.x_tilde["gain"]),
        "average_cost": hexes(h.average_cost),
    }
# 3. adam + average on lqr-1d float64
ex = ft.examples.lqr_1d(particles=4, dtype=torch.float64, hidden=4)
rule = ft.optim.adam()
s0 = ft.init(ex.sde, ex.theta, ex.x0, 4, optimizer=rule, average_from=0.5)
s, h = ft.run(ex.sde, s0, 150, ex.dt, ex.lr, seed=2, optimizer=rule, compile=False, progress=False)
out["adam_f64"] = {"weight0": hexes(s.theta["weight0"]), "mean.weight0": hexes(s.average.mean["weight0"])}
# 4. calibration (OU), float64
ex = ft.examples.ou_calibration(particles=8, dtype=torch.float64)
s0 = ex.initial_state()
s, h = ft.run(ex.problem, s0, 200, ex.dt, ex.lr, seed=4, compile=False, progress=False)
out["ou_calibration_f64"] = {"mean": hexes(s.theta["mean"]), "scale": hexes(s.theta["scale"]), "cost": hexes(h.cost)}
# 5. SGDCT
ex = ft.examples.sgdct_ou(dtype=torch.float64, steps=500)
s, h = ex.train(steps=500, seed=5, compile=False, progress=False)
out["sgdct_f64"] = {"kappa": hexes(s.theta["kappa"]), "mean": hexes(s.theta["mean"])}
# 6. ensemble of 3, float64
ex = ft.examples.lqr_1d(particles=4, dtype=torch.float64, hidden=4)
st = ensemble.init(ex.sde, ex.theta, ex.x0, 4, members=3)
s, h = ensemble.run(
    ex.sde, st, 120, ex.dt, torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64), seed=7, compile=False, progress=False
)
out["ensemble_f64"] = {"weight1": hexes(s.theta["weight1"]), "average_cost": hexes(h.average_cost)}
# 7. step_with_info on the 2-D full-noise test SDE
sys.path.insert(0, "tests")
from conftest import nonlinear_2d

sde, theta = nonlinear_2d()
st = ft.init(sde, theta, torch.tensor([0.3, -0.2], dtype=torch.float64), particles=5)
g = torch.Generator().manual_seed(11)
for _n in range(20):
    dw = torch.randn(5, 3, generator=g, dtype=torch.float64) * 0.1
    st, info = ft.step_with_info(sde, st, dw, 0.01, 0.3)
out["nonlinear2d_f64"] = {"a": hexes(st.theta["a"]), "x": hexes(st.x), "cost": hexes(info.cost)}
with open(sys.argv[1], "w") as file:
    json.dump(out, file, indent=1)
# a 0.2 checkpoint (with adam state, average and a history)
ex = ft.examples.lqr_1d(particles=3, dtype=torch.float64, hidden=4)
s0 = ft.init(ex.sde, ex.theta, ex.x0, 3, optimizer=rule, average_from=0.1)
s, h = ft.run(ex.sde, s0, 40, ex.dt, ex.lr, seed=0, optimizer=rule, record_every=20, compile=False, progress=False)
ft.save(sys.argv[2], s, h, metadata={"problem": "lqr-1d", "hidden": 4, "written_by": "fwdtrain 0.2.0"})
s2, h2 = ft.run(ex.sde, s, 30, ex.dt, ex.lr, optimizer=rule, record_every=20, compile=False, progress=False, history=h)
with open(sys.argv[3], "w") as file:
    json.dump({"resumed_weight0": hexes(s2.theta["weight0"])}, file, indent=1)
print("ok")
