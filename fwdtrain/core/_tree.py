"""Small pytree helpers on top of optree (private)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import optree
import torch

from .. import _compat

PyTree = Any


def tree_map(fn: Callable[..., Any], tree: PyTree, *rest: PyTree) -> PyTree:
    """`optree.tree_map` with ``None`` treated as an empty node."""
    return optree.tree_map(fn, tree, *rest)


def leaves(tree: PyTree) -> list[Any]:
    return optree.tree_leaves(tree)


def flatten(tree: PyTree) -> tuple[list[Any], Any]:
    """(leaves, spec) of a pytree (``optree.tree_flatten``)."""
    return optree.tree_flatten(tree)


def unflatten(spec: Any, values: list[Any]) -> Any:
    """The pytree of ``spec`` with ``values`` as its leaves."""
    return optree.tree_unflatten(spec, values)


def leaves_with_paths(tree: PyTree) -> list[tuple[str, Any]]:
    """(readable path, leaf) pairs, e.g. ``("['0.weight']", tensor)``."""
    paths, values, _ = optree.tree_flatten_with_path(tree)
    return [
        ("".join(f"[{key!r}]" for key in path) or "<root>", value) for path, value in zip(paths, values, strict=True)
    ]


def size(tree: PyTree) -> int:
    """Total number of scalars p in a pytree of tensors."""
    return sum(leaf.numel() for leaf in leaves(tree))


def dot(a: torch.Tensor, b: torch.Tensor, dims: int = 1) -> torch.Tensor:
    """``torch.tensordot(a, b, dims)`` (a's last ``dims`` axes against b's first) as one matrix product of
    reshaped views: the ATen work of tensordot without its Python wrapper (15 us a call, eagerly)."""
    outer_a, outer_b = a.shape[: a.ndim - dims], b.shape[dims:]
    k = math.prod(a.shape[a.ndim - dims :])
    product = a.reshape(math.prod(outer_a), k) @ b.reshape(k, math.prod(outer_b))
    return product.reshape(outer_a + outer_b)


def contract(x_tilde: PyTree, direction: PyTree) -> torch.Tensor:
    """Xtilde . v = sum over leaves of tensordot(Xtilde_leaf (d, *s), v_leaf (*s)) -> (d,)."""
    terms = [torch.tensordot(xt, v, dims=v.ndim) for xt, v in zip(leaves(x_tilde), leaves(direction), strict=True)]
    return sum(terms[1:], terms[0])


def squared_norm(tree: PyTree) -> torch.Tensor:
    terms = [leaf.square().sum() for leaf in leaves(tree)]
    return sum(terms[1:], terms[0])


def norm(tree: PyTree) -> torch.Tensor:
    """|tree| = sqrt(sum of squares over every leaf), detached: one fused call for the leaves' norms (no
    autograd, no transforms: for the loop's records, not for a pure function). Traced (into a block's kernel):
    one reduction per leaf, as a compiled package cannot be loaded with foreach calls."""
    values = [leaf.detach() for leaf in leaves(tree)]
    norms = [torch.linalg.vector_norm(v) for v in values] if _compat.tracing() else torch._foreach_norm(values)
    return torch.linalg.vector_norm(torch.stack(norms))


def peak(tensors: list[torch.Tensor]) -> torch.Tensor:
    """max |.| over every number of ``tensors`` (NaN if any is NaN), detached: the floating ones' infinity
    norms in one fused call, the others (integers) one by one. ``tensors`` must hold at least one number."""
    floating = [t.detach() for t in tensors if t.numel() and t.is_floating_point()]
    others = [t.detach().abs().amax() for t in tensors if t.numel() and not t.is_floating_point()]
    if _compat.tracing():  # into a block's kernel: a compiled package cannot be loaded with foreach calls
        others, floating = [t.abs().amax() for t in floating] + others, []
    peaks = [*(torch._foreach_norm(floating, math.inf) if floating else ()), *others]
    return torch.stack(peaks).amax()
