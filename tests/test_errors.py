"""Bad input gets a clear error naming the argument, before anything is computed."""

import math
import re

import pytest
import torch

import fwdtrain as ft


@pytest.fixture
def ex():
    return ft.examples.lqr_1d(particles=2)


@pytest.fixture
def state(ex):
    return ft.init(ex.sde, ex.theta, ex.x0, particles=2)


def test_x0_of_the_wrong_dimension(ex):
    with pytest.raises(ValueError, match="dimension d = 3"):
        ft.init(ex.sde, ex.theta, torch.ones(3))


def test_x0_of_the_wrong_rank_or_particle_count(ex):
    with pytest.raises(ValueError, match=r"x0 must have shape"):
        ft.init(ex.sde, ex.theta, torch.ones(1, 1, 1))
    with pytest.raises(ValueError, match="particles=3"):
        ft.init(ex.sde, ex.theta, torch.ones(2, 1), particles=3)


@pytest.mark.parametrize("particles", [0, -1, 1.5, True])
def test_particles_must_be_a_positive_integer(ex, particles):
    with pytest.raises(ValueError, match="particles"):
        ft.init(ex.sde, ex.theta, ex.x0, particles=particles)


def test_theta_that_requires_grad(ex):
    theta = dict(ex.theta, weight0=ex.theta["weight0"].clone().requires_grad_())
    with pytest.raises(ValueError, match=r"theta\['weight0'\] requires grad.*detach"):
        ft.init(ex.sde, theta, ex.x0)


def test_theta_that_is_not_floating_or_not_a_tensor(ex):
    with pytest.raises(TypeError, match="floating"):
        ft.init(ex.sde, dict(ex.theta, weight0=torch.ones(16, 1, dtype=torch.long)), ex.x0)
    with pytest.raises(TypeError, match="torch.Tensor"):
        ft.init(ex.sde, dict(ex.theta, weight0=[1.0]), ex.x0)


def test_mixed_dtypes(ex):
    with pytest.raises(TypeError, match="mixes dtypes"):
        ft.init(ex.sde, dict(ex.theta, weight0=ex.theta["weight0"].double()), ex.x0)
    with pytest.raises(TypeError, match="x0 has dtype torch.float64"):
        ft.init(ex.sde, ex.theta, ex.x0.double())


def test_non_finite_inputs(ex):
    with pytest.raises(ValueError, match="x0 contains NaN"):
        ft.init(ex.sde, ex.theta, torch.tensor([math.nan]))
    with pytest.raises(ValueError, match=r"theta\['bias0'\] contains NaN"):
        ft.init(ex.sde, dict(ex.theta, bias0=torch.full((16,), math.inf)), ex.x0)


@pytest.mark.parametrize("dt", [0.0, -0.1, math.nan, math.inf, torch.tensor(-1.0)])
def test_bad_dt(ex, state, dt):
    with pytest.raises(ValueError, match="dt must be positive"):
        ft.step(ex.sde, state, torch.zeros(2, 1), dt, 0.1)


def test_dt_of_the_wrong_type(ex, state):
    with pytest.raises(TypeError, match="dt must be a positive number"):
        ft.step(ex.sde, state, torch.zeros(2, 1), "0.01", 0.1)


@pytest.mark.parametrize("shape", [(2,), (3, 1), (2, 2), (2, 1, 1)])
def test_dw_of_the_wrong_shape(ex, state, shape):
    with pytest.raises(ValueError, match="dw"):
        ft.step(ex.sde, state, torch.zeros(shape), 0.01, 0.1)


def test_dw_of_the_wrong_dtype(ex, state):
    with pytest.raises(TypeError, match="dw is torch.float64"):
        ft.step(ex.sde, state, torch.zeros(2, 1, dtype=torch.float64), 0.01, 0.1)


@pytest.mark.parametrize("lr", [-1.0, math.nan, "fast"])
def test_bad_learning_rate(ex, state, lr):
    with pytest.raises((ValueError, TypeError), match="lr"):
        ft.step(ex.sde, state, torch.zeros(2, 1), 0.01, lr)


def test_bad_mode(ex, state):
    with pytest.raises(ValueError, match="mode must be one of"):
        ft.step(ex.sde, state, torch.zeros(2, 1), 0.01, 0.1, mode="sideways")


def test_not_a_state_or_not_an_sde(ex, state):
    with pytest.raises(TypeError, match="fwdtrain.State"):
        ft.step(ex.sde, tuple(state), torch.zeros(2, 1), 0.01, 0.1)
    with pytest.raises(TypeError, match="fwdtrain.SDE"):
        ft.step(lambda th, x: x, state, torch.zeros(2, 1), 0.01, 0.1)


def test_state_that_requires_grad(ex, state):
    bad = state._replace(x=state.x.clone().requires_grad_())
    with pytest.raises(ValueError, match="requires grad"):
        ft.step(ex.sde, bad, torch.zeros(2, 1), 0.01, 0.1)


def test_sde_with_wrong_output_shapes():
    theta = {"k": torch.ones(1)}
    wrong_drift = ft.SDE(
        lambda th, x: th["k"] * x.sum() * torch.ones(2), lambda th, x: torch.ones(1), lambda th, x: x.sum()
    )
    with pytest.raises(ValueError, match=r"drift returned shape \(2,\)"):
        ft.init(wrong_drift, theta, torch.ones(1))
    wrong_cost = ft.SDE(lambda th, x: -x, lambda th, x: torch.ones(1), lambda th, x: x)
    with pytest.raises(ValueError, match="cost returned shape"):
        ft.init(wrong_cost, theta, torch.ones(1))
    wrong_sigma = ft.SDE(lambda th, x: -x, lambda th, x: torch.ones(3), lambda th, x: x.sum())
    with pytest.raises(ValueError, match="diffusion returned shape"):
        ft.init(wrong_sigma, theta, torch.ones(1))


def test_sde_fields_must_be_callable():
    with pytest.raises(TypeError, match="drift"):
        ft.SDE(1.0, lambda th, x: x, lambda th, x: x.sum())
    with pytest.raises(TypeError, match="control"):
        ft.ControlledSDE(None, lambda x, u: x, lambda x, u: x, lambda x, u: x.sum())


def test_run_rejects_bad_counts(ex, state):
    with pytest.raises(ValueError, match="steps"):
        ft.run(ex.sde, state, -1, 0.01, 0.1)
    with pytest.raises(ValueError, match=r"SaveAt\(every=...\) must be an integer >= 1, got 0"):
        ft.run(ex.sde, state, 10, 0.01, 0.1, save=ft.SaveAt(0))
    with pytest.raises(ValueError, match="dt must be positive"):
        ft.run(ex.sde, state, 10, 0.0, 0.1)


def test_x0_with_no_particles(ex):
    with pytest.raises(ValueError, match=r"x0 has shape \(0, 1\): no particles"):
        ft.init(ex.sde, ex.theta, torch.ones(0, 1))


def test_coefficient_of_another_dtype_is_refused():
    theta = {"k": torch.ones(1)}
    float64_sigma = ft.SDE(
        lambda th, x: -th["k"] * x, lambda th, x: torch.ones(1, dtype=torch.float64), lambda th, x: x.sum()
    )
    with pytest.raises(TypeError, match="diffusion returned dtype torch.float64 at x0 of dtype torch.float32"):
        ft.init(float64_sigma, theta, torch.ones(1))
    float64_cost = ft.SDE(lambda th, x: -th["k"] * x, lambda th, x: torch.ones(1), lambda th, x: x.double().sum())
    with pytest.raises(TypeError, match="cost returned dtype torch.float64"):
        ft.init(float64_cost, theta, torch.ones(1))


class _ModelError(Exception):
    pass


def test_a_coefficients_own_error_names_the_function_without_the_shape_hint():
    theta = {"k": torch.ones(1)}

    def drift(th, x):
        raise ZeroDivisionError("rate is zero")

    with pytest.raises(ZeroDivisionError, match="the SDE's drift raised ZeroDivisionError at x0.*rate is zero") as info:
        ft.init(ft.SDE(drift, lambda th, x: torch.ones(1), lambda th, x: x.sum()), theta, torch.ones(1))
    assert "one entry per state dimension" not in str(info.value)
    assert isinstance(info.value.__cause__, ZeroDivisionError)

    def cost(th, x):
        raise RuntimeError("table not loaded")

    with pytest.raises(RuntimeError, match="the SDE's cost raised RuntimeError.*table not loaded"):
        ft.init(ft.SDE(lambda th, x: -x, lambda th, x: torch.ones(1), cost), theta, torch.ones(1))

    def control(th, x):
        raise _ModelError("bad control")

    controlled = ft.ControlledSDE(control, lambda x, u: u, lambda x, u: torch.ones(1), lambda x, u: u.sum())
    with pytest.raises(_ModelError, match="the SDE's control raised _ModelError"):
        ft.init(controlled, theta, torch.ones(1))


def test_a_shape_error_inside_a_coefficient_keeps_the_dimension_hint(ex):
    with pytest.raises(
        ValueError, match="control could not be evaluated at x0 of dimension d = 3.*one entry per state"
    ):
        ft.init(ex.sde, ex.theta, torch.ones(3))


class _TwoArgumentError(Exception):
    def __init__(self, code, detail):
        super().__init__(f"{code}: {detail}")


def test_an_error_type_that_takes_other_arguments_gets_a_note():
    def cost(th, x):
        raise _TwoArgumentError(7, "no table")

    with pytest.raises(_TwoArgumentError) as info:
        ft.init(ft.SDE(lambda th, x: -x, lambda th, x: torch.ones(1), cost), {"k": torch.ones(1)}, torch.ones(1))
    assert any("the SDE's cost raised" in note for note in info.value.__notes__)


@pytest.mark.parametrize(
    "schedule, match",
    [
        (lambda t: -0.5 + 0 * t, r"the schedule .*<lambda> returned -0.5 at t = 0.*gradient ascent"),
        (lambda t: math.nan, r"returned nan at t = 0.*finite"),
        (
            lambda t: torch.full((3,), 0.1),
            r"returned a torch.float32 tensor of shape \(3,\) at t = 0.*one floating number",
        ),
        (lambda t: "fast", r"returned str .*'fast'.* at t = 0.*a number or a 0-d floating tensor"),
        (lambda t: torch.tensor(1), r"returned a torch.int64 tensor"),
    ],
)
def test_learning_rate_from_a_schedule_is_checked_where_evaluated(ex, state, schedule, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ft.step(ex.sde, state, torch.zeros(2, 1), 0.01, schedule)


def test_schedule_error_names_the_time(ex, state):
    late = state._replace(t=torch.tensor(60.0, dtype=torch.float64))
    schedule = lambda t: 0.1 - 0.01 * t
    ft.step(ex.sde, state, torch.zeros(2, 1), 0.01, schedule)  # fine at t = 0
    with pytest.raises(ValueError, match="returned -0.5 at t = 60"):
        ft.step(ex.sde, late, torch.zeros(2, 1), 0.01, schedule)


def test_learning_rate_check_in_calibration_and_sgdct():
    sde = ft.SDE(lambda th, x: -th["k"] * x, lambda th, x: torch.ones_like(x), lambda th, x: x.sum() * 0)
    theta = {"k": torch.tensor([1.0])}
    with pytest.raises(ValueError, match="returned -1.0 at t = 0"):
        ft.sgdct.step(sde, ft.sgdct.init(theta), torch.ones(1), torch.zeros(1), 0.01, lambda t: -1.0)
    problem = ft.calibration.calibration(sde.drift, sde.diffusion, lambda th, x: x, torch.zeros(1))
    state = ft.calibration.init(problem, theta, torch.zeros(1), particles=2)
    with pytest.raises(ValueError, match="returned nan"):
        ft.calibration.step(problem, state, torch.zeros(2, 1), 0.01, lambda t: math.nan)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_needs_an_explicit_opt_in(ex, dtype):
    theta = {name: leaf.to(dtype) for name, leaf in ex.theta.items()}
    with pytest.raises(TypeError, match=f"dtype {dtype}.*float32 or float64.*allow_low_precision=True"):
        ft.init(ex.sde, theta, ex.x0.to(dtype))
    with pytest.raises(TypeError, match="allow_low_precision=True"):
        ft.sgdct.init(theta)
    state = ft.init(ex.sde, theta, ex.x0.to(dtype), particles=2, allow_low_precision=True)
    assert ft.step(ex.sde, state, torch.zeros(2, 1, dtype=dtype), 0.01, 0.1).x.dtype == dtype


# ---- issue 43: errors that came raw from torch or Python, each raised before any step ----


@pytest.fixture
def stepped(monkeypatch):
    """The number of steps taken (every eager step of a cost-form problem goes through CostForm.propagate)."""
    from fwdtrain.problems.cost import CostForm

    calls = []
    original = CostForm.propagate

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(CostForm, "propagate", counted)
    return calls


def _controlled(control):
    return ft.ControlledSDE(
        control,
        lambda x, u: -x + u,
        lambda x, u: torch.ones_like(x),
        lambda x, u: (x * x + u * u).sum(),
        noise_type="additive",
    )


def _branching_control(th, x):
    if x[0] > 0:  # a Python branch on a tensor's value: cannot run batched
        return -th["k"] * x
    return th["k"] * x


def _item_control(th, x):
    return -th["k"].item() * x  # .item() cuts theta out of the derivative and cannot run batched


@pytest.mark.parametrize(
    "control, reason",
    [(_branching_control, "data-dependent control flow"), (_item_control, r"\.item\(\)")],
    ids=["if x[0] > 0", ".item()"],
)
def test_a_control_that_reads_a_tensors_value_is_refused_by_init_naming_it(control, reason, stepped):
    with pytest.raises(
        ValueError, match=rf"the SDE's control \({control.__name__}\) runs at x0 but not batched"
    ) as info:
        ft.init(_controlled(control), {"k": torch.tensor(0.5)}, torch.ones(1), particles=4)
    message = str(info.value)
    assert re.search(reason, message) and "no .item()" in message and "torch.where" in message
    assert stepped == []


def test_a_drift_cost_or_jump_that_branches_is_named():
    theta, x0 = {"k": torch.tensor(0.5)}, torch.ones(1)
    branching_cost = ft.SDE(lambda th, x: -x, lambda th, x: torch.ones_like(x), lambda th, x: x.sum() * float(x[0]))
    with pytest.raises(ValueError, match="the SDE's cost runs at x0 but not batched"):
        ft.init(branching_cost, theta, x0)
    branching_drift = ft.SDE(
        lambda th, x: -x if x.sum() > 0 else x, lambda th, x: torch.ones_like(x), lambda th, x: x.sum()
    )
    with pytest.raises(ValueError, match="the SDE's drift runs at x0 but not batched"):
        ft.init(branching_drift, theta, x0)
    jumps = ft.Jumps(lambda th, x, z: x * 0.1, rate=lambda th, x: torch.tensor(2.0 if x[0] > 0 else 1.0))
    with pytest.raises(ValueError, match="the jumps' rate runs at x0 but not batched"):
        ft.init(
            ft.SDE(lambda th, x: -x, lambda th, x: torch.ones_like(x), lambda th, x: x.sum(), jumps=jumps), theta, x0
        )
    # the same rules written with torch.where pass
    where = _controlled(lambda th, x: torch.where(x[0] > 0, -th["k"] * x, th["k"] * x))
    ft.init(where, theta, x0, particles=2)


def test_a_2d_checkpoint_resumed_into_a_1d_problem_names_what_differs(tmp_path, stepped):
    control = ft.mlp([2, 4, 2])
    two_d = _controlled(control.apply)
    state = ft.init(two_d, control.theta, torch.ones(2), particles=3)
    ft.save(tmp_path / "run.pt", *ft.run(two_d, state, 3, 0.01, 0.1, compile=False))
    checkpoint = ft.load(tmp_path / "run.pt")
    stepped.clear()
    one_d = _controlled(lambda th, x: -th["k"] * x)
    with pytest.raises(ValueError, match="the start's state does not fit this problem") as info:
        ft.run(one_d, checkpoint, 5, 0.01, 0.1, compile=False)
    message = str(info.value)
    assert "the problem asks theta for 'k', which the state's theta does not have" in message
    assert "theta['weight0'] (4, 2)" in message and "dimension d = 2" in message
    assert "check_compatible" in message and "KeyError" in message
    assert stepped == []


def test_save_into_a_missing_folder_names_the_path_not_a_temporary(ex, state, tmp_path):
    path = tmp_path / "missing" / "run.pt"
    with pytest.raises(ft.errors.CheckpointError) as info:
        ft.save(path, state)
    message = str(info.value)
    assert repr(str(path)) in message and "does not exist" in message and "create the folder" in message
    assert ".tmp" not in message
    assert not (tmp_path / "missing").exists()
    with pytest.raises(ft.errors.CheckpointError, match="is a folder; name a file"):
        ft.save(tmp_path, state)


def test_a_nan_in_theta_names_the_leaf_and_the_index(ex, state, stepped):
    weight = state.theta["weight1"].clone()
    weight[0, 5] = math.nan
    bad = state._replace(theta=dict(state.theta, weight1=weight))
    match = r"non-finite entries: state\.theta\['weight1'\]\[0, 5\] = nan, the first of 1 in state\.theta\['weight1'\]"
    with pytest.raises(ValueError, match=match):
        ft.run(ex.sde, bad, 10, 0.01, 0.1, compile=False)
    far = state._replace(x=state.x + 100.0)
    with pytest.raises(ValueError, match=r"above bound=10\.0: state\.x\[0, 0\] = 101"):
        ft.run(ex.sde, far, 10, 0.01, 0.1, compile=False, checks=ft.Checks(bound=10.0))
    assert stepped == []
