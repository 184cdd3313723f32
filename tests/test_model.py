import pytest
import torch

import fwdtrain as ft
from fwdtrain.core._tree import leaves


def test_functional_matches_the_module_and_leaves_it_alone():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    before = {k: v.clone() for k, v in module.state_dict().items()}
    apply, theta = ft.functional(module)
    x = torch.randn(3)
    torch.testing.assert_close(apply(theta, x), module(x))
    assert set(theta) == {name for name, _ in module.named_parameters()}
    assert all(not v.requires_grad and v.grad_fn is None for v in theta.values())
    shifted = {k: v + 1.0 for k, v in theta.items()}
    assert not torch.allclose(apply(shifted, x), module(x))
    for k, v in module.state_dict().items():
        assert torch.equal(v, before[k])


def test_functional_rejects_non_modules_and_empty_modules():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        ft.functional(lambda x: x)
    with pytest.raises(ValueError, match="no parameters"):
        ft.functional(torch.nn.ReLU())


def test_mlp_shapes_seed_and_output_bias():
    a = ft.mlp([1, 16, 1], output_bias=False, seed=3)
    b = ft.mlp([1, 16, 1], output_bias=False, seed=3)
    assert set(a.theta) == {"weight0", "bias0", "weight1"}
    assert a.theta["weight0"].shape == (16, 1) and a.theta["weight1"].shape == (1, 16)
    for k in a.theta:
        assert torch.equal(a.theta[k], b.theta[k])
    assert a.apply(a.theta, torch.ones(1)).shape == (1,)
    assert a.apply(a.theta, torch.ones(5, 1)).shape == (5, 1)
    assert ft.mlp([2, 4, 3], dtype=torch.float64).theta["bias1"].dtype == torch.float64


def test_mlp_equals_the_equivalent_module():
    model = ft.mlp([2, 5, 3], activation="tanh", seed=1)
    module = torch.nn.Sequential(torch.nn.Linear(2, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    with torch.no_grad():
        for i, layer in enumerate([module[0], module[2]]):
            layer.weight.copy_(model.theta[f"weight{i}"])
            layer.bias.copy_(model.theta[f"bias{i}"])
    x = torch.randn(4, 2)
    torch.testing.assert_close(model.apply(model.theta, x), module(x))


@pytest.mark.parametrize("output_bias", [True, False])
def test_mlp_on_one_point_equals_its_row_of_a_batch_and_has_the_same_derivatives(output_bias):
    """One point x (d,) takes the matrix-vector route (addmv / mv), a batch the matrix route: same values,
    and the same gradients in theta and x."""
    model = ft.mlp([3, 7, 2], activation="tanh", output_bias=output_bias, seed=2, dtype=torch.float64)
    x = torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(model.apply(model.theta, x), model.apply(model.theta, x[None])[0])
    one = torch.func.jacrev(model.apply, argnums=(0, 1))(model.theta, x)
    batch = torch.func.jacrev(lambda th, x_: model.apply(th, x_[None])[0], argnums=(0, 1))(model.theta, x)
    for a, b in zip(leaves(one), leaves(batch), strict=True):
        torch.testing.assert_close(a, b)


def test_mlp_bad_arguments():
    with pytest.raises(ValueError, match="two positive"):
        ft.mlp([3])
    with pytest.raises(ValueError, match="activation"):
        ft.mlp([1, 2], activation="gelu-ish")


@pytest.mark.parametrize("sizes", [[1.5, 16, 1], [1, 0, 1], [1, True, 1], [1, "16", 1], [2]])
def test_mlp_refuses_widths_that_are_not_positive_integers(sizes):
    with pytest.raises(ValueError, match="positive integer layer widths"):
        ft.mlp(sizes)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, "float32"])
def test_mlp_refuses_a_dtype_that_is_not_floating(dtype):
    with pytest.raises(TypeError, match="floating dtype"):
        ft.mlp([1, 4, 1], dtype=dtype)
