"""Small pytree helpers on top of optree (private)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree
import torch

PyTree = Any


def tree_map(fn: Callable[..., Any], tree: PyTree, *rest: PyTree) -> PyTree:
    """`optree.tree_map` with ``None`` treated as an empty node."""
    return optree.tree_map(fn, tree, *rest)


def leaves(tree: PyTree) -> list[Any]:
    return optree.tree_leaves(tree)


def leaves_with_paths(tree: PyTree) -> list[tuple[str, Any]]:
    """(readable path, leaf) pairs, e.g. ``("['0.weight']", tensor)``."""
    paths, values, _ = optree.tree_flatten_with_path(tree)
    return [
        ("".join(f"[{key!r}]" for key in path) or "<root>", value) for path, value in zip(paths, values, strict=True)
    ]


def size(tree: PyTree) -> int:
    """Total number of scalars p in a pytree of tensors."""
    return sum(leaf.numel() for leaf in leaves(tree))


def contract(x_tilde: PyTree, direction: PyTree) -> torch.Tensor:
    """Xtilde . v = sum over leaves of tensordot(Xtilde_leaf (d, *s), v_leaf (*s)) -> (d,)."""
    terms = [torch.tensordot(xt, v, dims=v.ndim) for xt, v in zip(leaves(x_tilde), leaves(direction), strict=True)]
    return sum(terms[1:], terms[0])


def squared_norm(tree: PyTree) -> torch.Tensor:
    terms = [leaf.square().sum() for leaf in leaves(tree)]
    return sum(terms[1:], terms[0])
