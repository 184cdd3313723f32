import math

import pytest
import torch

from fwdtrain import schedules


def test_staged_matches_the_seed_schedule():
    def seed(c, time):  # the seed's branching function, verbatim logic
        if time > 500:
            return c / 10
        if time > 100:
            return c / 5
        if time > 50:
            return c / 2
        return c

    schedule = schedules.staged(100.0)
    for t in [0.0, 10.0, 50.0, 50.01, 99.9, 100.0, 100.5, 500.0, 777.0]:
        assert float(schedule(torch.tensor(t, dtype=torch.float64))) == pytest.approx(seed(100.0, t))


def test_inverse_time_and_constant():
    assert float(schedules.inverse_time(2.0, 4.0)(torch.tensor(6.0))) == pytest.approx(0.2)
    assert float(schedules.constant(0.3)(torch.tensor(123.0))) == pytest.approx(0.3)


def test_schedules_work_under_vmap_and_keep_dtype():
    ts = torch.tensor([1.0, 60.0, 200.0, 900.0], dtype=torch.float64)
    for schedule in [schedules.staged(1.0), schedules.inverse_time(1.0), schedules.constant(2.0)]:
        out = torch.vmap(schedule)(ts)
        assert out.dtype == torch.float64
        torch.testing.assert_close(out, torch.stack([schedule(t) for t in ts]))
    torch.testing.assert_close(
        torch.vmap(schedules.staged(1.0))(ts), torch.tensor([1.0, 0.5, 0.2, 0.1], dtype=torch.float64)
    )


def test_bad_schedule_arguments():
    with pytest.raises(ValueError, match="one more value"):
        schedules.piecewise_constant([1.0], [1.0])
    with pytest.raises(ValueError, match="increase"):
        schedules.piecewise_constant([1.0, 2.0, 3.0], [5.0, 1.0])
    with pytest.raises(ValueError, match="offset"):
        schedules.inverse_time(1.0, 0.0)


@pytest.mark.parametrize(
    "build, match",
    [
        (
            lambda: schedules.piecewise_constant([1.0, math.nan], [1.0]),
            r"piecewise_constant: values\[1\] must be finite",
        ),
        (
            lambda: schedules.piecewise_constant([1.0, 2.0], [math.nan]),
            r"piecewise_constant: boundaries\[0\] must be finite",
        ),
        (lambda: schedules.piecewise_constant([1.0, -2.0], [1.0]), r"values\[1\] must be >= 0, got -2.0"),
        (lambda: schedules.inverse_time(math.nan), "inverse_time: scale must be finite"),
        (lambda: schedules.inverse_time(1.0, math.inf), "inverse_time: offset must be finite"),
        (lambda: schedules.inverse_time(-1.0), "inverse_time: scale must be >= 0"),
        (lambda: schedules.inverse_time(torch.tensor(-1.0)), "inverse_time: scale must be >= 0"),
        (
            lambda: schedules.inverse_time(torch.ones(2)),
            "inverse_time: scale must be a number or a 0-d floating tensor",
        ),
        (lambda: schedules.constant(-0.1), "constant: value must be >= 0"),
        (lambda: schedules.constant("0.1"), "constant: value must be a number"),
        (lambda: schedules.staged(math.inf), "staged: scale must be finite"),
    ],
)
def test_factories_validate_their_arguments(build, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build()


def test_tensor_parameters_stay_tensors_so_gradients_flow():
    scale = torch.tensor(2.0, dtype=torch.float64)
    t = torch.tensor(3.0, dtype=torch.float64)
    assert torch.func.grad(lambda c: schedules.inverse_time(c, 1.0)(t))(scale) == pytest.approx(0.25)
    assert torch.func.grad(lambda o: schedules.inverse_time(2.0, o)(t))(scale) == pytest.approx(-2.0 / 25)
    assert torch.func.grad(lambda c: schedules.staged(c)(torch.tensor(60.0)))(scale) == pytest.approx(0.5)
    assert torch.func.grad(lambda c: schedules.constant(c)(t))(scale) == pytest.approx(1.0)
    batched = torch.vmap(lambda c: schedules.piecewise_constant([c, c / 2], [1.0])(t))(torch.tensor([1.0, 4.0]))
    torch.testing.assert_close(batched, torch.tensor([0.5, 2.0], dtype=torch.float64))
