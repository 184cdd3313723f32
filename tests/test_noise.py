import math

import pytest
import torch

import fwdtrain as ft
from fwdtrain.core.noise import BrownianNoise, FunctionNoise, TensorNoise, as_noise


def draw_in_chunks(source, total, chunk):
    pieces, n = [], 0
    while n < total:
        k = min(chunk, total - n)
        pieces.append(source.draw(k))
        n += k
    return torch.cat(pieces)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_stream_does_not_depend_on_chunk_size(dtype):
    reference = BrownianNoise((3, 2), 0.01, seed=11, dtype=dtype).draw(1000)
    for chunk in (1, 7, 64, 1000, 333):
        out = draw_in_chunks(BrownianNoise((3, 2), 0.01, seed=11, dtype=dtype), 1000, chunk)
        assert torch.equal(out, reference), chunk


def test_position_saves_and_restores_bitwise():
    reference = BrownianNoise((2, 1), 0.1, seed=3).draw(400)
    source = BrownianNoise((2, 1), 0.1, seed=3)
    source.draw(100)
    for position in (70, 64, 100):  # mid-block, on a block boundary, the current position
        restored = BrownianNoise.from_state_dict(source.state_dict(position))
        assert restored.position == position
        assert torch.equal(restored.draw(250), reference[position : position + 250])
    source.draw(28)  # ends exactly on a block boundary (128)
    assert torch.equal(BrownianNoise.from_state_dict(source.state_dict()).draw(5), reference[128:133])
    with pytest.raises(ValueError, match="outside the latest draw"):
        source.state_dict(10)


def test_copy_is_independent():
    source = BrownianNoise((2, 1), 0.1, seed=3)
    source.draw(10)
    twin = source.copy()
    assert torch.equal(twin.draw(7), source.draw(7))
    assert twin.position == source.position == 17


def test_increments_have_variance_dt_and_seeds_differ():
    dt = 0.04
    z = BrownianNoise((50, 2), dt, seed=0, dtype=torch.float64).draw(400)  # 40,000 normals
    # sample variance of 40,000 N(0, dt): relative standard error sqrt(2 / 40,000) = 0.7 %
    assert abs(z.var().item() / dt - 1) < 0.04
    assert abs(z.mean().item()) < 5 * math.sqrt(dt / z.numel())
    assert not torch.equal(z, BrownianNoise((50, 2), dt, seed=1, dtype=torch.float64).draw(400))


def test_user_noise_tensor_and_function():
    increments = torch.randn(20, 3, 1)
    tensor = as_noise(increments)
    assert isinstance(tensor, TensorNoise)
    assert torch.equal(draw_in_chunks(tensor, 20, 7), increments)
    with pytest.raises(ValueError, match="has 20 steps"):
        tensor.draw(1)
    function = as_noise(lambda start, count: increments[start : start + count])
    assert isinstance(function, FunctionNoise)
    assert torch.equal(draw_in_chunks(function, 20, 3), increments)
    with pytest.raises(ValueError, match="must return"):
        FunctionNoise(lambda start, count: torch.zeros(3, 1)).draw(2)
    with pytest.raises(TypeError, match="noise must be"):
        as_noise(3.0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="dt"):
        BrownianNoise((2, 1), -0.1)
    with pytest.raises(ValueError, match="shape"):
        BrownianNoise((2,), 0.1)
    with pytest.raises(TypeError, match="seed"):
        BrownianNoise((2, 1), 0.1, seed=1.5)
    assert ft.noise.BrownianNoise is BrownianNoise


def test_noise_tensor_dtype_and_shape_are_checked():
    with pytest.raises(TypeError, match="torch.int64.*must be floating"):
        TensorNoise(torch.zeros(5, 2, 1, dtype=torch.int64))
    source = TensorNoise(torch.zeros(5, 2, 1, dtype=torch.float64))
    assert source.expect((2, 1), torch.float64, "cpu") is source
    with pytest.raises(
        TypeError, match=r"dtype torch.float64 but the run's dtype is torch.float32.*\.to\(torch.float32\)"
    ):
        source.expect((2, 1), torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"shape \(5, 2, 1\) but the run expects \(5, 3, 1\)"):
        source.expect((3, 1), torch.float64, "cpu")


def test_noise_function_is_checked_on_every_draw():
    def increments(dtype, m=1):
        return lambda start, count: torch.zeros(count, 2, m, dtype=dtype)

    source = FunctionNoise(increments(torch.float64)).expect((2, 1), torch.float32, "cpu")
    source.position = 10
    with pytest.raises(TypeError, match=r"steps 10 to 14 .*dtype torch.float64 but the run's dtype is torch.float32"):
        source.draw(5)
    with pytest.raises(ValueError, match=r"steps 0 to 2 .*shape \(3, 2, 2\) but the run expects \(3, 2, 1\)"):
        FunctionNoise(increments(torch.float32, m=2)).expect((2, 1), torch.float32, "cpu").draw(3)
    with pytest.raises(TypeError, match="must be floating"):
        FunctionNoise(lambda start, count: torch.zeros(count, 2, 1, dtype=torch.int32)).draw(1)
    # without expect, a draw must match the first one; the expectation survives copy()
    switching = FunctionNoise(
        lambda start, count: torch.zeros(count, 2, 1, dtype=torch.float64 if start else torch.float32)
    )
    switching.draw(1)
    with pytest.raises(TypeError, match=r"steps 1 to 1"):
        switching.copy().draw(1)
    assert torch.equal(
        FunctionNoise(increments(torch.float32)).expect((2, 1), torch.float32, "cpu").copy().draw(2),
        torch.zeros(2, 2, 1),
    )


def test_brownian_noise_expect():
    source = BrownianNoise((2, 1), 0.1)
    assert source.expect((2, 1), torch.float32, "cpu") is source
    with pytest.raises(TypeError, match="torch.float64"):
        source.expect((2, 1), torch.float64, "cpu")
