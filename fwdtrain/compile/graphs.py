"""Tracing a pure step once into a flat ATen graph, and the block loop built around it.

``trace(fn, example)`` records ``fn`` (a pure function of pytrees of tensors) with ``make_fx``:
every ``torch.func`` transform inside (vmap, vjp, jacfwd) is resolved into plain ATen operations,
so the graph can be compiled without dynamo, exported and kept on disk. Tensors the user's
functions close over become constants of the graph (and part of its key, ``cache.kernel_key``).

``run_block`` is a block's meaning: up to ``count`` checked steps, records on a grid; ``BlockLoop`` is
the same as the module AOTInductor compiles, its loops in the compiled C++ wrapper (no Python between
steps), the inputs of a whole noise block passed at once, ``count``, ``start``, ``n0`` and ``every``
plain tensors: one kernel takes every block of a run, whatever its length and position.
``simplify`` and ``unfold_small_matmuls`` rewrite a traced graph for speed, to the same values.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import optree
import torch
from torch.fx.experimental.proxy_tensor import make_fx

PyTree = Any


class Traced(NamedTuple):
    """A flat graph ``graph(*leaves) -> list of leaves`` of a pytree function, with its output's spec."""

    graph: torch.fx.GraphModule
    out_spec: Any

    def constants(self) -> list[tuple[str, torch.Tensor]]:
        """Every tensor the graph holds (what the user's functions closed over), by name."""
        named = dict(self.graph.named_buffers())
        named.update(self.graph.named_parameters())
        for node in self.graph.graph.nodes:
            if node.op == "get_attr":
                value = getattr(self.graph, str(node.target), None)
                if isinstance(value, torch.Tensor):
                    named[str(node.target)] = value
        return sorted(named.items())


def _zeros(
    size: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> torch.Tensor:
    return torch.zeros(size, dtype=dtype, device=device)


# Autograd's formulas return "efficient" zero tensors for the gradients of constants (e.g. of ones_like(x));
# traced with fake tensors they land on the meta device (torch 2.13): plain zeros in the graph instead.
_DECOMPOSITIONS = {torch.ops.aten._efficientzerotensor.default: _zeros}


def trace(fn: Callable[..., PyTree], example: tuple) -> Traced:
    """``fn(*example)`` recorded as a flat ATen graph over the leaves of ``example`` (fake tensors: nothing is
    computed). Raises what ``make_fx`` raises for code that is not a pure tensor program (e.g. ``.item()``)."""
    leaves: list[torch.Tensor]
    leaves, in_spec = optree.tree_flatten(example)  # type: ignore[arg-type]
    out_spec: list[Any] = []

    def flat(*args: torch.Tensor) -> list[torch.Tensor]:
        out = fn(*optree.tree_unflatten(in_spec, list(args)))
        out_leaves, spec = optree.tree_flatten(out)
        out_spec[:] = [spec]
        return out_leaves

    graph = make_fx(flat, tracing_mode="fake", decomposition_table=_DECOMPOSITIONS, _allow_non_fake_inputs=True)(
        *leaves
    )
    return Traced(graph=graph, out_spec=out_spec[0])


class Packing(NamedTuple):
    """Where each leaf of a tuple lives in one flat buffer per dtype: the block loop carries a few buffers, not one
    tensor per leaf (fewer allocations per step at N = 1: 11.9 -> 10.3 us), and its records are one table per dtype."""

    dtypes: tuple[torch.dtype, ...]  # one buffer per dtype, in order of first appearance
    places: tuple[tuple[int, int, int, tuple[int, ...]], ...]  # per leaf: buffer, offset, size, shape

    @staticmethod
    def of(leaves: tuple[torch.Tensor, ...]) -> Packing:
        dtypes: list[torch.dtype] = []
        sizes: list[int] = []
        places = []
        for leaf in leaves:
            if leaf.dtype not in dtypes:
                dtypes.append(leaf.dtype)
                sizes.append(0)
            b = dtypes.index(leaf.dtype)
            places.append((b, sizes[b], leaf.numel(), tuple(leaf.shape)))
            sizes[b] += leaf.numel()
        return Packing(tuple(dtypes), tuple(places))

    def sizes(self) -> list[int]:
        return [sum(n for b, _, n, _ in self.places if b == index) for index in range(len(self.dtypes))]

    def pack(self, leaves: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        groups: list[list[torch.Tensor]] = [[] for _ in self.dtypes]
        for leaf, (b, _, _, _) in zip(leaves, self.places, strict=True):
            groups[b].append(leaf.reshape(-1))
        return tuple(torch.cat(group) for group in groups)

    def unpack(self, buffers: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return tuple(
            buffers[b][..., offset : offset + n].reshape((*buffers[b].shape[:-1], *shape))
            for b, offset, n, shape in self.places
        )


class BlockOut(NamedTuple):
    """What a block returns: ``done`` steps known good (to the last passed check), ``ok`` (False: the check after
    them failed), ``rows`` records taken, the ``carry`` after ``done`` steps and the records' ``tables`` (one
    (capacity, size) table per dtype of the observation's leaves, ``Packing``; rows past ``rows`` unused)."""

    done: torch.Tensor
    ok: torch.Tensor
    rows: torch.Tensor
    carry: tuple[torch.Tensor, ...]
    tables: tuple[torch.Tensor, ...]


class Grids(NamedTuple):
    """A block's position and its two grids: ``count`` steps from row ``start`` of the inputs, the run's step
    count ``n0`` at its start, a record every ``every`` steps and a check every ``check_every`` steps (of the
    run's count), and at the block's end."""

    count: Any
    start: Any
    n0: Any
    every: Any
    check_every: Any

    def stop(self, i: Any) -> Any:
        """The end of the stage from step i: the next record, the next check, or the block's end."""
        n = self.n0 + i
        least = torch.minimum if isinstance(n, torch.Tensor) else min
        return least(self.count, least(i + self.every - n % self.every, i + self.check_every - n % self.check_every))


def run_block(
    body: Callable[..., tuple],
    check: Callable[..., torch.Tensor],
    observe: Callable[..., tuple],
    capacity: int,
    grids: Grids,
    blocks: tuple[torch.Tensor, ...],
    alive: torch.Tensor,
    carry: tuple[torch.Tensor, ...],
) -> BlockOut:
    """A block's meaning, and its eager route: stage by stage (``Grids.stop``), the steps ``carry = body(*carry,
    *blocks[start + i], alive)``, then ``check(*carry, alive)``; at a failed check the block stops, the carry of
    the last passed one kept; after a stage that ends on the record grid, ``observe(*carry)`` packed into the
    next row of the tables."""
    seen = Packing.of(tuple(observe(*carry)))
    tables = [torch.zeros((capacity, size), dtype=dtype) for dtype, size in zip(seen.dtypes, seen.sizes(), strict=True)]
    done, rows, ok, moved = 0, 0, True, carry
    while done < grids.count:
        stop = grids.stop(done)
        moved = carry
        for i in range(done, stop):
            moved = body(*moved, *[block[grids.start + i] for block in blocks], alive)
        if not bool(check(*moved, alive)):
            ok = False
            break
        carry, done = tuple(moved), stop
        for table, row in zip(tables, seen.pack(tuple(observe(*carry))), strict=True):
            table[rows] = row  # written at every stage's end, kept on the record grid (as the module does)
        rows += (grids.n0 + done) % grids.every == 0
    if not ok:  # the module's failed stage writes its row too, unkept
        for table, row in zip(tables, seen.pack(tuple(observe(*moved))), strict=True):
            table[rows] = row
    scalar = lambda value: torch.tensor(value, dtype=torch.int64)
    return BlockOut(scalar(done), torch.tensor(ok), scalar(rows), tuple(carry), tuple(tables))


class BlockLoop(torch.nn.Module):
    """``run_block`` as one module for AOTInductor: ``forward(count, start, n0, every, check_every, alive,
    *block_leaves, *carry_leaves) -> (done, ok, rows, *carry_leaves, *tables)``, with ``body``, ``check`` and
    ``observe`` traced graphs.

    Two ``while_loop``s: the outer one from stage to stage (``Grids.stop``: a record, a check, the block's end),
    the inner one over the steps of a stage (``unroll`` K > 1: K steps per iteration, then one at a time); the
    loops run in the compiled C++ wrapper, with no Python between steps. The carry is packed per dtype.
    """

    def __init__(self, body: Any, check: Any, observe: Any, inputs: int, capacity: int, unroll: int = 1) -> None:
        super().__init__()
        self.body, self.check, self.observe = body, check, observe
        self.inputs, self.capacity, self.unroll = inputs, capacity, unroll

    def _steps(
        self, k: int, blocks: tuple, start: torch.Tensor, alive: torch.Tensor, i: torch.Tensor, state: tuple
    ) -> tuple:
        """``k`` steps from row ``start + i``. A leaf the body passes through is copied, as ``while_loop`` refuses
        a body output that aliases its input."""
        for j in range(k):
            index = (start + i + j).reshape(1)
            out = self.body(*state, *[block.index_select(0, index).squeeze(0) for block in blocks], alive)
            state = tuple(leaf.clone() if any(leaf is s for s in state) else leaf for leaf in out)
        return state

    def forward(
        self,
        count: torch.Tensor,
        start: torch.Tensor,
        n0: torch.Tensor,
        every: torch.Tensor,
        check_every: torch.Tensor,
        alive: torch.Tensor,
        *leaves: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        from torch._higher_order_ops.while_loop import while_loop

        grids = Grids(count, start, n0, every, check_every)
        blocks, carry = leaves[: self.inputs], leaves[self.inputs :]
        packing, seen = Packing.of(carry), Packing.of(tuple(self.observe(*carry)))
        width = len(packing.dtypes)

        def steps(k: int, stop: torch.Tensor) -> tuple[Callable[..., Any], Callable[..., tuple]]:
            def more(i: torch.Tensor, *_: torch.Tensor) -> torch.Tensor:
                return i + k <= stop

            def advance(i: torch.Tensor, *buffers: torch.Tensor) -> tuple:
                return (i + k, *packing.pack(self._steps(k, blocks, start, alive, i, packing.unpack(buffers))))

            return more, advance

        def stage(j: torch.Tensor, i: torch.Tensor, ok: torch.Tensor, *buffers: torch.Tensor) -> tuple:
            stop = grids.stop(i)
            out: tuple = (i.clone(), *[b.clone() for b in buffers[:width]])
            if self.unroll > 1:
                out = while_loop(*steps(self.unroll, stop), out)
            out = while_loop(*steps(1, stop), tuple(out))
            state = tuple(out[1:])
            unpacked = packing.unpack(state)
            ok = self.check(*unpacked, alive)
            ok = ok[0] if isinstance(ok, (list, tuple)) else ok  # a traced graph returns its one output in a list
            row = seen.pack(tuple(self.observe(*unpacked)))
            tables = tuple(
                table.index_copy(0, j.reshape(1), value.reshape(1, -1))
                for table, value in zip(buffers[width:], row, strict=True)
            )
            recorded = ok & ((n0 + stop) % every == 0)
            kept = [torch.where(ok, new, old) for new, old in zip(state, buffers[:width], strict=True)]
            return (j + recorded.to(j.dtype), torch.where(ok, stop, i), ok.clone(), *kept, *tables)

        zero = torch.zeros((), dtype=torch.int64, device=count.device)
        tables = tuple(
            torch.zeros((self.capacity, size), dtype=dtype, device=count.device)
            for dtype, size in zip(seen.dtypes, seen.sizes(), strict=True)
        )
        ok = torch.ones((), dtype=torch.bool, device=count.device)
        out = while_loop(
            lambda j, i, ok, *_: (i < count) & ok, stage, (zero, zero.clone(), ok, *packing.pack(carry), *tables)
        )
        j, i, ok, state, tables = out[0], out[1], out[2], out[3 : 3 + width], out[3 + width :]
        return (
            i.clone(),
            ok.clone(),
            j.clone(),
            *[leaf.clone() for leaf in packing.unpack(tuple(state))],
            *[table.clone() for table in tables],
        )


def loop_code() -> str:
    """A digest of the code that wraps a traced step into its block (``BlockLoop``, ``Packing``): part of every block
    kernel's key, so that a package built by another version of the wrapper is never loaded."""
    source = inspect.getsource(BlockLoop) + inspect.getsource(Packing)
    return hashlib.sha256(source.encode()).hexdigest()[:16]


SMALL_MATMUL = 1 << 15  # M K N at most this: a product written as a broadcast multiply and a sum (fused by inductor)
THIN_MATMUL = 1  # a product with M, K or N at most this (an outer product, a row times a matrix): written out too


def _small(node: torch.fx.Node) -> bool:
    """A matrix product that a library call serves worse than inductor's fused loops: small (a one-particle
    step: the call costs more than the arithmetic) or thin (an outer product or a row times a matrix, e.g. a
    layer of width one over N particles: memory-bound, so its (N, width) result written out and read back is
    the cost; fused, it never leaves the registers)."""
    shapes = [arg.meta["val"].shape for arg in node.args[-2:] if isinstance(arg, torch.fx.Node) and "val" in arg.meta]
    if len(shapes) != 2:
        return False
    (*batch, m, k), (*_, k2, n) = shapes
    size = m * k * n
    for b in batch:
        size *= b
    return k == k2 and (size <= SMALL_MATMUL or min(m, k, n) <= THIN_MATMUL)


def unfold_small_matmuls(graph: torch.fx.GraphModule) -> int:
    """Write every small ``mm``/``bmm``/``addmm`` of a traced graph as a broadcast multiply and a sum over the
    inner dimension, so that inductor fuses it into its loops instead of calling a BLAS routine per product
    (1 to 2 us each, most of a one-particle step). The same maths; the sum's order may differ by rounding.
    Returns the number of products rewritten."""
    aten = torch.ops.aten
    rewritten = 0
    for node in list(graph.graph.nodes):
        if (
            node.op != "call_function"
            or node.target not in (aten.mm.default, aten.bmm.default, aten.addmm.default)
            or not _small(node)
        ):
            continue
        with graph.graph.inserting_before(node):
            a, b = node.args[-2:]
            left = graph.graph.call_function(aten.unsqueeze.default, (a, -1))
            right = graph.graph.call_function(aten.unsqueeze.default, (b, -3))
            product = graph.graph.call_function(aten.mul.Tensor, (left, right))
            out = graph.graph.call_function(aten.sum.dim_IntList, (product, [-2]))
            if node.target == aten.addmm.default:
                out = graph.graph.call_function(aten.add.Tensor, (node.args[0], out))
        out.meta.update(node.meta)
        node.replace_all_uses_with(out)
        graph.graph.erase_node(node)
        rewritten += 1
    if rewritten:
        graph.graph.lint()
        graph.recompile()
    return rewritten


_RESHAPES = ("view.default", "_unsafe_view.default", "reshape.default")


def _name(node: torch.fx.Node) -> str:
    """``"view.default"`` for ``aten.view.default``; ``""`` for anything that is not an ATen call."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return ""
    return f"{node.target.overloadpacket.__name__}.{node.target._overloadname}"


def _shape(node: Any) -> tuple[int, ...] | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _mutated(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes an in-place op writes to (their data or their metadata, e.g. ``squeeze_``): left alone."""
    out: set[torch.fx.Node] = set()
    for node in graph.nodes:
        target = node.target
        if node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
            out.update(arg for arg in node.args if isinstance(arg, torch.fx.Node))
    return out


def _same_value(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node that ``node`` only repeats: a reshape, view, expand or identity permute to its input's own
    shape and dtype, ``squeeze(unsqueeze(x, d), d)``, ``x * 1``; None for every other node."""
    name, args = _name(node), list(node.args)
    source: Any = args[0] if args else None
    if not isinstance(source, torch.fx.Node) or _shape(node) is None:
        return None
    same = _shape(source) == _shape(node) and source.meta["val"].dtype == node.meta["val"].dtype
    if name in (*_RESHAPES, "expand.default", "alias.default") and same:
        return source
    if name == "permute.default" and same:
        order: Any = args[1]
        return source if list(order) == list(range(len(order))) else None
    if name == "mul.Scalar" and same and args[1] == 1:
        return source
    if name in ("squeeze.dim", "squeeze.dims") and _name(source) == "unsqueeze.default":
        inner: Any = source.args[0]
        dim: Any = source.args[1]
        rank = len(_shape(source) or ())
        dims: Any = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
        if isinstance(inner, torch.fx.Node) and _shape(inner) == _shape(node) and len(dims) == 1:
            return inner if dims[0] % rank == dim % rank else None
    return None


def simplify(graph: torch.fx.GraphModule) -> tuple[int, int]:
    """Fold what vmap and vjp leave in a traced graph (``trace``): a chain of reshapes becomes one reshape
    of its root, and a node that only repeats its input (``_same_value``: a reshape to the same shape, the
    expands and permutes of a single particle, ``x * 1``) is replaced by it; then dead nodes go. Every view
    becomes a reshape: ``make_fx`` records a reshape as a view when the traced tensor allowed one, but the
    export that compiles the graph may give that tensor other strides (an add over size-1 axes), where the
    view fails and a reshape copies. The same values, bit for bit (no arithmetic changes). Nodes an in-place
    op touches are left as they are.
    Returns the ATen calls (nodes that call a function) before and after."""
    calls = lambda: sum(1 for node in graph.graph.nodes if node.op == "call_function")
    before = calls()
    mutated = _mutated(graph.graph)
    aten = torch.ops.aten
    for node in list(graph.graph.nodes):
        if node in mutated or node.op != "call_function":
            continue
        source = node.args[0] if node.args else None
        if (
            _name(node) in _RESHAPES
            and isinstance(source, torch.fx.Node)
            and _name(source) in _RESHAPES
            and source not in mutated
            and isinstance(root := source.args[0], torch.fx.Node)
            and root not in mutated
            and isinstance(root.meta.get("val"), torch.Tensor)
            and root.meta["val"].is_contiguous()
        ):
            node.args = (root, *node.args[1:])
            node.target = aten.reshape.default
        elif _name(node) == "view.default" and not ({node, source} & mutated):
            node.target = aten.reshape.default  # a traced view holds only for the strides seen when tracing
        same = _same_value(node)
        if same is not None and same not in mutated:
            node.replace_all_uses_with(same)
    graph.graph.eliminate_dead_code()
    graph.graph.lint()
    graph.recompile()
    return before, calls()


__all__ = [
    "BlockLoop",
    "BlockOut",
    "Grids",
    "Packing",
    "Traced",
    "loop_code",
    "run_block",
    "simplify",
    "trace",
    "unfold_small_matmuls",
]
