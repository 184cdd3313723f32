"""The immutable training state (X, Xtilde, theta, t) and its construction."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..optim import GradientTransformation, average_init, check_optimizer
from . import _checks
from ._tree import leaves, leaves_with_paths, size, tree_map
from .problem import SDE, check_noise_type
from .sensitivity import Coefficients, Theta


class State(NamedTuple):
    """Everything the online algorithm carries from one step to the next: (X, Xtilde, theta, t).

    An immutable ``NamedTuple`` and a pytree: ``step`` returns a new one, ``vmap`` batches it (an ensemble
    adds a leading member axis E to every leaf), checkpoints save it. Make it with ``fwdtrain.init``.
    ``repr`` is a summary (shapes, dtype, t, a few numbers).

    Attributes:
        x: The particles X^i, shape (N, d).
        x_tilde: The sensitivity Xtilde^i = dX^i/dtheta: a pytree like theta, a leaf of shape s becoming
            (N, d, *s).
        theta: The parameters, shared by the particles (a pytree of tensors, e.g. a dict).
        t: The clock t_n, a 0-d float64 tensor whatever the dtype of x (a float32 clock drifts by ~1e-3
            after 10^4 steps and stops at t = 2^18 steps of 0.01).
        opt_state: The update rule's state ``optimizer.init(theta)`` (``fwdtrain.optim``); ``()`` for the
            plain update theta <- theta - alpha h G, the default.
        average: A ``fwdtrain.optim.Average``, the Polyak-Ruppert mean of theta over t_n >= t0; ``()``: none.
        score: For jumps whose rate depends on theta or x, the score S^i = d/dtheta of the log-probability
            of particle i's events so far (a pytree like theta, a leaf of shape s becoming (N, *s);
            ``fwdtrain.core.jumps``); ``()`` otherwise.

    "Absent" is ``()``, not None: an empty node in every pytree library, so ``torch.func.vmap``
    (which refuses None outputs) and ``tree_map`` see a State with or without an optimiser alike.
    """

    x: torch.Tensor
    x_tilde: Any
    theta: Theta
    t: torch.Tensor
    opt_state: Any = ()
    average: Any = ()
    score: Any = ()

    @property
    def particles(self) -> int:
        """N, the particles (of each member, for a state with a member axis: x of shape (E, N, d))."""
        return self.x.shape[-2]

    @property
    def dim(self) -> int:
        """d, the state dimension (``x.shape[-1]``)."""
        return self.x.shape[-1]

    def __repr__(self) -> str:
        """A summary: shapes, dtype, t and a few numbers (never every tensor)."""
        return summary(self)


def _numbers(tensor: torch.Tensor, count: int = 3) -> str:
    """The first ``count`` entries of a tensor, for a summary ("[0.1, -2, ...]")."""
    if not _checks.is_concrete(tensor):
        return "<traced>"
    flat = tensor.detach().reshape(-1)[:count].tolist()
    more = ", ..." if tensor.numel() > count else ""
    return "[" + ", ".join(f"{v:.4g}" for v in flat) + more + "]"


def summary(state: State) -> str:
    """One line per field: shapes, dtype and device, t, the first numbers of x and theta."""
    if not isinstance(state.x, torch.Tensor):
        return f"State(x={state.x!r}, ...)"
    theta = leaves_with_paths(state.theta)
    t = state.t
    clock = (f"{float(t):.6g}" if t.ndim == 0 else f"{tuple(t.shape)} clocks") if _checks.is_concrete(t) else "<traced>"
    parts = [
        f"x {tuple(state.x.shape)} {str(state.x.dtype).removeprefix('torch.')} on {state.x.device} {_numbers(state.x)}",
        f"theta: {len(theta)} leaves, {size(state.theta)} numbers"
        + "".join(f"; {path} {tuple(leaf.shape)} {_numbers(leaf)}" for path, leaf in theta[:3])
        + ("; ..." if len(theta) > 3 else ""),
        f"x_tilde: {len(leaves(state.x_tilde))} leaves",
        f"t = {clock}",
    ]
    if not (isinstance(state.opt_state, tuple) and not state.opt_state):
        parts.append(f"opt_state: {type(state.opt_state).__name__}")
    if not (isinstance(state.average, tuple) and not state.average):
        parts.append("average: a Polyak-Ruppert mean of theta")
    return "State(" + ",\n      ".join(parts) + ")"


_SHAPE_WORDS = ("shape", "size", "dimension", "out of range", "out of bounds", "mat1", "broadcast")


def _failing_function(sde: SDE, theta: Theta, x: torch.Tensor) -> str:
    """Which of the SDE's functions raises at x (re-evaluated one by one, on the error path only)."""
    for field, function in sde.parts():
        try:
            function(theta, x)
        except Exception:
            return field
    return "coefficients"


def _reraise(error: Exception, message: str) -> None:
    """Raise ``message`` as the type of ``error``, chained to it; add it as a note if the type will not take it."""
    try:
        wrapped = type(error)(message)
    except Exception:
        wrapped = None
    if wrapped is None:
        if hasattr(error, "add_note"):  # Python 3.11+
            error.add_note(message)
        raise error
    raise wrapped from error


def evaluate_once(sde: SDE, theta: Theta, x: torch.Tensor, name: str = "x0") -> Coefficients:
    """Evaluate the coefficients at one particle x (d,) and check their shapes, dtypes and device against x.

    An error inside the SDE's functions is re-raised naming the function that raised; the hint about
    ``name``'s dimension is added only when the error reads like a shape mismatch.
    """
    d = x.shape[-1]
    if x.numel() == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(x.shape)}): it needs at least one particle "
            f"and one entry per state dimension"
        )
    try:
        value = Coefficients(*sde.coefficients(theta, x))
    except Exception as error:
        culprit = _failing_function(sde, theta, x)
        text = str(error)
        if isinstance(error, (RuntimeError, IndexError, ValueError)) and any(w in text for w in _SHAPE_WORDS):
            raise ValueError(
                f"the SDE's {culprit} could not be evaluated at {name} of dimension d = {d}: {text}. "
                f"Check that {name} has one entry per state dimension the model expects."
            ) from error
        _reraise(error, f"the SDE's {culprit} raised {type(error).__name__} at {name} (d = {d}): {text}")
    for field, tensor in zip(("drift", "diffusion", "cost"), value, strict=True):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"the SDE's {field} returned {type(tensor).__name__}; it must return a torch.Tensor")
        if tensor.dtype != x.dtype:
            raise TypeError(
                f"the SDE's {field} returned dtype {tensor.dtype} at {name} of dtype {x.dtype}; it must "
                f"keep the dtype of x and theta (make constants with x.new_tensor(...) or "
                f"torch.tensor(..., dtype=x.dtype)), else x is silently promoted and the next step fails"
            )
        if tensor.device != x.device:
            raise ValueError(
                f"the SDE's {field} returned a tensor on {tensor.device} at {name} on {x.device}; "
                f"create its tensors on x.device"
            )
    if value.mu.shape != (d,):
        raise ValueError(
            f"drift returned shape {tuple(value.mu.shape)} at {name} of shape ({d},); "
            f"it must return ({d},), one entry per state dimension"
        )
    if value.sigma.shape != (d,) and (value.sigma.ndim != 2 or value.sigma.shape[0] != d):
        raise ValueError(
            f"diffusion returned shape {tuple(value.sigma.shape)}; it must return a ({d}, m) "
            f"matrix or a ({d},) vector for diagonal noise"
        )
    if value.cost.shape != ():
        raise ValueError(
            f"cost returned shape {tuple(value.cost.shape)}; it must return a scalar (0-d tensor), e.g. (x * x).sum()"
        )
    if sde.jumps is not None:
        check_jumps_at(sde, theta, x, name)
    return value


def check_jumps_at(sde: SDE, theta: Theta, x: torch.Tensor, name: str = "x0") -> None:
    """Check the jumps at one particle x (d,): the size (d,) at the marks' median draw, in x's dtype; the rate a
    0-d tensor of x's dtype, finite and >= 0 (values only on concrete tensors)."""
    assert sde.jumps is not None
    _, z = sde.jumps.draws(torch.zeros((1, sde.jumps.width), dtype=x.dtype, device=x.device))
    for field, function in (("size", lambda: sde.jump_size(theta, x, z[0])), ("rate", lambda: sde.jump_rate(theta, x))):
        try:
            value = function()
        except Exception as error:
            _reraise(error, f"the jumps' {field} raised {type(error).__name__} at {name} (d = {x.shape[-1]}): {error}")
        if not isinstance(value, torch.Tensor) or value.dtype != x.dtype:
            got = type(value).__name__ if not isinstance(value, torch.Tensor) else value.dtype
            raise TypeError(
                f"the jumps' {field} returned {got} at {name}; it must return a tensor of x's dtype {x.dtype}"
            )
        expected = (x.shape[-1],) if field == "size" else ()
        if tuple(value.shape) != expected:
            raise ValueError(
                f"the jumps' {field} returned shape {tuple(value.shape)} at {name}; it must return {expected}"
                + (" (one entry per state dimension)" if field == "size" else " (a 0-d tensor, the intensity)")
            )
        if _checks.is_concrete(value) and not bool(torch.isfinite(value).all()):
            raise ValueError(f"the jumps' {field} is not finite at {name} = {_numbers(x, 4)}: {_numbers(value, 4)}")
        if field == "rate" and _checks.is_concrete(value) and bool(value < 0):
            raise ValueError(
                f"the jumps' rate is negative at {name} = {_numbers(x, 4)}: {float(value):.4g}; an intensity must "
                f"be >= 0 (e.g. pass it through torch.nn.functional.softplus)"
            )


def check_finite(sde: SDE, theta: Theta, x: torch.Tensor, name: str = "x0") -> None:
    """Raise ``ValueError`` naming the first of the SDE's functions (control, drift, diffusion, cost) that is
    NaN or infinite at one particle x (d,); only on concrete values (skipped inside a transform)."""
    if not _checks.is_concrete(x) or not all(_checks.is_concrete(leaf) for leaf in leaves(theta)):
        return
    for field, function in sde.parts():
        value = function(theta, x)
        if isinstance(value, torch.Tensor) and _checks.is_concrete(value) and not bool(torch.isfinite(value).all()):
            raise ValueError(
                f"the SDE's {field} is not finite at {name} = {_numbers(x, 4)}: it returned "
                f"{_numbers(value, 4)}; fix the {field} (or theta) so that it is finite there"
            )


_TRACE_RULE = (
    "A pure function must run batched: no .item(), float(), int(), bool(), .tolist() or .numpy() of a tensor and "
    "no Python if/while/and/or on tensor values; write a branch as torch.where(x[0] > 0, a, b) and keep numbers "
    "as tensors"
)


def check_transformable(sde: SDE, theta: Theta, x: torch.Tensor, name: str = "x0") -> None:
    """Evaluate each of the SDE's functions (control, drift, diffusion, cost, the jumps' size and rate) once under
    ``torch.func.vmap`` over a batch of one (theta, x), as the steps batch particles and an ensemble batches runs;
    a function that reads a tensor's value (``.item()``, ``float(x)``, a Python ``if`` on a tensor) is refused by
    name, before the first step. Only on concrete values (skipped inside the user's own transforms)."""
    if not _checks.is_concrete(x) or not all(_checks.is_concrete(leaf) for leaf in leaves(theta)):
        return
    parts: list[tuple[str, Any]] = [(f"SDE's {field}", function) for field, function in sde.parts()]
    if sde.jumps is not None:
        _, z = sde.jumps.draws(torch.zeros((1, sde.jumps.width), dtype=x.dtype, device=x.device))
        parts.append(("jumps' size", lambda th, y: sde.jump_size(th, y, z[0])))
        parts.append(("jumps' rate", sde.jump_rate))
    batched = tree_map(lambda leaf: leaf.unsqueeze(0), theta), x.unsqueeze(0)
    for field, function in parts:
        try:
            torch.func.vmap(function)(*batched)
        except Exception as error:
            reason = str(error).splitlines()[0].rstrip(". ") if str(error) else ""
            label = getattr(function, "__qualname__", "<lambda>")
            if "<lambda>" not in label and not getattr(function, "__module__", "fwdtrain").startswith("fwdtrain"):
                field += f" ({label})"
            raise ValueError(
                f"the {field} runs at {name} but not batched, as every step runs it over the particles "
                f"(torch.func.vmap): {type(error).__name__}: {reason}. {_TRACE_RULE}"
            ) from error


def noise_dim(sde: SDE, theta: Theta, x: torch.Tensor) -> int:
    """The columns of one step's increment (x (d,) or (N, d)): m, the dimension of the Brownian motion (sigma's
    columns, or d for diagonal noise), plus the jumps' w = 1 + q draws (``fwdtrain.core.jumps``)."""
    m = sde.diffusion(theta, x[0] if x.ndim == 2 else x).shape[-1]
    return m if sde.jumps is None else m + sde.jumps.width


def empty_score(sde: SDE, theta: Theta, particles: int) -> Any:
    """The score S = 0 of N particles, leaves (N, *s), for jumps with a rate that varies; ``()`` otherwise."""
    if sde.jumps is None or sde.jumps.constant:
        return ()
    return tree_map(lambda leaf: torch.zeros((particles, *leaf.shape), dtype=leaf.dtype, device=leaf.device), theta)


def with_optimizer(state: State, optimizer: GradientTransformation | None = None, *, average_from: Any = None) -> State:
    """``state`` with the rule's state ``optimizer.init(theta)`` (``()`` for None: plain sgd) and, for
    ``average_from`` = t0, an empty Polyak-Ruppert average that starts at t0 (``()`` for None)."""
    check_optimizer(optimizer)
    opt_state = () if optimizer is None else optimizer.init(state.theta)
    average = () if average_from is None else average_init(state.theta, average_from)
    return state._replace(opt_state=opt_state, average=average)


def init(
    sde: SDE,
    theta: Theta,
    x0: torch.Tensor,
    particles: int | None = None,
    *,
    optimizer: GradientTransformation | None = None,
    average_from: Any = None,
    allow_low_precision: bool = False,
) -> State:
    """The state at t = 0: x = x0 for every particle, x_tilde = 0.

    The SDE's functions are evaluated once at x0: their shapes, dtypes and devices are checked, each
    must be finite there, and a declared noise type is verified (one Jacobian for ``"additive"``).
    theta is copied (``clone``, not ``detach``), so later changes to it by the caller cannot leak into
    the state while the user's own ``torch.func`` transforms see through ``init``:
    ``jacfwd(lambda th: step(sde, init(sde, th, x0), ...).x)`` is dX/dtheta0.

    Args:
        sde: The problem (``SDE`` or ``ControlledSDE``).
        theta: The initial parameters, a pytree of float32 or float64 tensors.
        x0: The initial point, (d,) (copied to every particle) or (N, d) (one row per particle).
        particles: N, for a (d,) x0 (default 1); for an (N, d) x0 it must equal N if given.
        optimizer: Keyword only. A ``fwdtrain.optim`` rule: sets ``opt_state = optimizer.init(theta)``;
            step the state with the same rule.
        average_from: Keyword only. t0: start a Polyak-Ruppert average of theta over t_n >= t0.
        allow_low_precision: Keyword only. Accept bfloat16/float16 (their rounding can swallow the
            update alpha h G).

    Returns:
        The ``State`` at t = 0: x (N, d), x_tilde zeros (N, d, *s) per leaf, t a 0-d float64 zero.

    Raises:
        TypeError: ``sde`` is not an SDE; a function returns another dtype or a non-tensor; theta is not
            floating.
        ValueError: Bad shapes (x0, particles, the drift's, diffusion's or cost's), a function that raises
            or is not finite at x0 (named), a function that reads a tensor's value (``.item()``, a Python
            ``if`` on a tensor: named, as it cannot run batched over the particles), or a declared noise type
            that does not hold.
    """
    if not isinstance(sde, SDE):
        raise TypeError(f"init(sde, ...) expects a fwdtrain.SDE or ControlledSDE, got {type(sde).__name__}")
    dtype, device = _checks.check_theta(theta, allow_low_precision=allow_low_precision)
    x0 = _checks.check_tensor(x0, "x0", dtype, device)
    if x0.ndim == 1:
        n = 1 if particles is None else _checks.check_count(particles, "particles")
        x = x0.expand(n, -1).clone()
    elif x0.ndim == 2:
        n = x0.shape[0]
        if particles is not None and _checks.check_count(particles, "particles") != n:
            raise ValueError(
                f"x0 has {n} rows but particles={particles}; pass x0 of shape (d,) or one row per particle"
            )
        x = x0.clone()
        if n == 0:
            raise ValueError(f"x0 has shape {tuple(x0.shape)}: no particles; pass at least one row")
    else:
        raise ValueError(f"x0 must have shape (d,) or (particles, d), got {tuple(x0.shape)}")
    if x.shape[1] == 0:
        raise ValueError("x0 is empty: the state dimension d must be at least 1")
    theta = tree_map(torch.clone, theta)
    evaluate_once(sde, theta, x[0])
    check_finite(sde, theta, x[0])
    check_transformable(sde, theta, x[0])
    check_noise_type(sde, theta, x[0])
    x_tilde = tree_map(lambda leaf: torch.zeros((n, x.shape[1], *leaf.shape), dtype=dtype, device=device), theta)
    state = State(
        x, x_tilde, theta, torch.zeros((), dtype=torch.float64, device=device), score=empty_score(sde, theta, n)
    )
    return with_optimizer(state, optimizer, average_from=average_from)


__all__ = [
    "State",
    "check_finite",
    "check_transformable",
    "empty_score",
    "evaluate_once",
    "init",
    "noise_dim",
    "summary",
    "with_optimizer",
]
