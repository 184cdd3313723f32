"""``run``: train a problem online for a number of steps; ``setup``: the same, as a ``Loop`` one can step.

``run`` = ``setup`` (validate once, bind the solver and optimizer, build the block, position
the noise) + ``Loop.advance_to`` (the blocks of checked steps, the hooks between them) + the hooks' ends. It is a
pure function of its inputs: the same problem, start, noise and options give bitwise the same
result whatever the noise chunk size, and a continued run equals the uninterrupted one.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..compile.options import Compile, as_compile
from ..core import _checks
from ..core.history import History
from ..core.noise import NoiseLike
from ..core.solvers import Solver
from ..core.state import State
from ..core.step import GradientReduce, LearningRate
from ..optim import GradientTransformation
from ..problems.cost import as_trainable
from ..problems.trainable import Trainable
from .block import Carry, Stepping
from .checkpoint import Checkpoint
from .hooks import Hook, check_hooks
from .loop import Loop, continued
from .options import Checks, SaveAt, check_checks, check_save


class Run(NamedTuple):
    """What ``run`` returns: the final ``state`` and the ``history`` of records. Pass it back to ``run`` as the
    start to continue the run (``state, history = run(...)`` unpacks it)."""

    state: State
    history: History


def split_start(start: Any, kind: type = State) -> tuple[Any, History | None]:
    """(state, history) from a state of ``kind`` (the problem's ``state_kind``: a ``State`` for every SDE
    problem), a ``Run`` or ``Checkpoint`` to continue, or a (state, history) pair."""
    name = "fwdtrain.State" if kind is State else kind.__name__
    if isinstance(start, kind):
        return start, None
    if isinstance(start, (Run, Checkpoint)) or (isinstance(start, tuple) and len(start) == 2):
        state, history = start[0], start[1]
        if not isinstance(state, kind):
            raise TypeError(f"run(problem, start, ...): start[0] must be a {name}, got {type(state).__name__}")
        if history is not None and not isinstance(history, History):
            raise TypeError(
                f"run(problem, start, ...): start[1] must be the fwdtrain.History of the run that made "
                f"the state, got {type(history).__name__}"
            )
        return state, history
    made = " (from fwdtrain.init)" if kind is State else ""
    raise TypeError(
        f"run(problem, start, ...) starts from a {name}{made}, or continues a "
        f"run: the Run it returned, a Checkpoint from fwdtrain.load, or (state, history); "
        f"got {type(start).__name__}"
    )


def _positioned(source: Any, start: int, history: History | None) -> Any:
    """The noise source at step ``start``: a tensor or function is indexed by the step count; a stream must
    already be there (each source says which it is: ``seek``)."""
    return source.seek(start, history is not None)


def _reduce(hooks: tuple[Hook, ...]) -> GradientReduce | None:
    """The hooks' gradient maps composed in order, or None when no hook reduces the gradient."""
    reducing = [hook for hook in hooks if hook.reduces_gradient]
    if not reducing:
        return None

    def reduce(gradient: Any) -> Any:
        for hook in reducing:
            gradient = hook.reduce(gradient)
        return gradient

    return reduce


def setup(
    problem: Any,
    start: Any,
    steps: int,
    dt: float,
    lr: LearningRate,
    noise: NoiseLike | int = 0,
    *,
    solver: Solver | str | None = None,
    optimizer: GradientTransformation | None = None,
    save: SaveAt | None = None,
    checks: Checks | None = None,
    compile: Any = "auto",
    hooks: Any = (),
) -> Loop:
    """Validate everything once and build the ``Loop`` of ``run``; nothing is stepped.

    Takes the arguments of ``fwdtrain.run``. ``loop.advance_to(n)`` steps the loop to step n (it can be called
    again), ``execute(loop)`` finishes it as ``run`` does.

    Returns:
        The ``Loop``, positioned at the start's step (0 for a new run) and ending ``steps`` later; the hooks'
        ``start`` has run.

    Raises:
        TypeError, ValueError, CheckpointError: As ``fwdtrain.run``, before any step.
    """
    steps = _checks.check_count(steps, "steps", minimum=0)
    save, checks, options, hooks = check_save(save), check_checks(checks), as_compile(compile), check_hooks(hooks)
    trainable: Trainable = as_trainable(problem, solver, optimizer)
    state, history = split_start(start, trainable.state_kind)
    trainable.check(state, dt, lr)  # the opt_state's fit to the rule included: before any step
    schedule = trainable.schedule(lr, state)
    for t in (state.t, state.t + steps * float(dt)):  # alpha(t) at both ends now, in between at every check
        _checks.check_alpha(schedule(t), t, lr)
    _checks.check_initial_state(trainable.within(state, checks.bound), trainable.checked(state), checks.bound)
    first, total, _ = continued(history, state)
    source = trainable.noise_source(noise, dt, state, history.noise if history is not None else None)
    source = _positioned(source, first, history)
    plan = trainable.plan(state, options.derivative_mode())
    stepping = Stepping(trainable, float(dt) if options.enabled is not False else dt, plan, schedule, _reduce(hooks))
    loop = Loop(
        stepping,
        source,
        Carry(state, first, total, None),
        first + steps,
        save=save,
        checks=checks,
        hooks=hooks,
        previous=history,
        options=options,
        lr=lr,
    )
    for hook in hooks:
        hook.start(loop)
    return loop


def run(
    problem: Any,
    start: Any,
    steps: int,
    dt: float,
    lr: LearningRate,
    noise: NoiseLike | int = 0,
    *,
    solver: Solver | str | None = None,
    optimizer: GradientTransformation | None = None,
    save: SaveAt | None = None,
    checks: Checks | None = None,
    compile: Compile | bool | str = "auto",
    hooks: Hook | tuple[Hook, ...] = (),
) -> Run:
    """Train ``problem`` online for ``steps`` steps of size ``dt`` from ``start``: X, Xtilde and theta together.

    The loop draws the noise, takes the steps in blocks (eagerly, or one compiled call per block), records
    the history, checks for divergence and calls the hooks. A pure function of its inputs: the same problem,
    start, noise and options give bitwise the same result whatever the noise chunk size, and a continued run
    equals the uninterrupted one. On KeyboardInterrupt the last completed block is returned with
    ``history.interrupted`` True (and written by a ``Checkpointing`` hook).

    Args:
        problem: What to train: an ``SDE`` / ``ControlledSDE`` (on its running cost), a
            ``calibration.Calibration``, an ``sgdct.DriftEstimation``, an ``ensemble.Ensemble`` of any of
            these, or any ``fwdtrain.problems.Trainable``.
        start: A ``State`` (``fwdtrain.init``) for a new run, or the run to continue: the ``Run`` this
            function returned, a ``Checkpoint`` (``fwdtrain.load``), or a (state, history) pair. A continued
            run goes on with the same step count, running cost and noise stream.
        steps: The number of steps this call takes (a continued run takes ``steps`` more).
        dt: The step h > 0.
        lr: The learning rate alpha: a number, a 0-d tensor or a schedule t -> alpha(t)
            (``fwdtrain.schedules``); for an ensemble also one value per member or an ``ensemble.PerMember``.
        noise: The Brownian increments: an int seeds ``BrownianNoise`` (default 0; member e of an ensemble
            draws seed + e, or pass E seeds); or a ``BrownianNoise``, a (steps, N, m) tensor whose row n is
            dW_n, or a function (start, count) -> (count, N, m), n counted from the start of training.
        solver: ``fwdtrain.Euler()`` (default), ``Heun()`` or ``Milstein()``, or its name.
        optimizer: The update rule, a ``fwdtrain.optim`` transformation; ``state.opt_state`` must be its
            state (``init(..., optimizer=...)``). None: theta <- theta - alpha h G.
        save: ``SaveAt(every, record)``: what the history records and how often (default every 100 steps).
        checks: ``Checks(every, bound)``: the bound of the divergence check made at every step (default none:
            finiteness), and the grid at which a process group checks together (default every 100 steps).
        compile: ``"auto"`` (default), ``True``, ``False`` or a ``Compile(...)``: whether and how steps are
            compiled (``fwdtrain.Compile``). Compiled steps equal the eager ones to rounding.
        hooks: ``Progress()``, ``Checkpointing(path, every)``, ``Callback(fn, every)``, or others of
            ``fwdtrain.driver.hooks``.

    Returns:
        ``Run(state, history)``: the final state and the records (``fwdtrain.History``).

    Raises:
        TypeError, ValueError: For bad input, before any step (shapes, dtypes, non-finite values, a state of
            another rule, a learning rate that is negative or non-finite at either end, a noise of the
            wrong shape, a solver that does not take this noise).
        CheckpointError: A checkpoint path that cannot be written (probed before the first step).
        DivergenceError: x, x_tilde or theta became non-finite (or exceeded ``Checks(bound=...)``), or the
            learning rate did; it carries the state of the step before and its history, and names the step and
            the problem's function that returned NaN or inf there, when there is one.
        CheckpointWriteError: Training finished but a checkpoint could not be written; it carries the results.
    """
    return execute(
        setup(
            problem,
            start,
            steps,
            dt,
            lr,
            noise,
            solver=solver,
            optimizer=optimizer,
            save=save,
            checks=checks,
            compile=compile,
            hooks=hooks,
        )
    )


def choose_route(
    problem: Any,
    start: Any,
    steps: int,
    dt: float,
    lr: LearningRate,
    noise: NoiseLike | int = 0,
    *,
    solver: Solver | str | None = None,
    optimizer: GradientTransformation | None = None,
    compile: Compile | bool | str = "auto",
) -> str:
    """How ``run`` would take its first steps with these arguments, in one line, without stepping: "compiled"
    (``compile=True``, or the kernel's package on disk, found by its own key) or "eager" (and why).

    Raises:
        TypeError, ValueError: As ``fwdtrain.run``, for bad input.
    """
    loop = setup(
        problem, start, steps, dt, lr, noise, solver=solver, optimizer=optimizer, compile=compile, save=None, hooks=()
    )
    return loop.first_route()


def execute(loop: Loop) -> Run:
    """Step ``loop`` to its end, then call the hooks' ``end``.

    Args:
        loop: A ``Loop`` from ``setup`` (possibly advanced already).

    Returns:
        The ``Run(state, history)``; on Ctrl-C the last whole block's, with ``history.interrupted`` True.

    Raises:
        DivergenceError, CheckpointWriteError: As ``fwdtrain.run``.
    """
    interrupted = False
    try:
        loop.advance_to(loop.end)
    except KeyboardInterrupt:
        interrupted = True
        loop.check()  # DivergenceError if it diverged (with members: freezes those that did)
        loop.record_now()
    previous = loop.previous
    if loop.carry.n == loop.start and previous is not None:
        result = Run(loop.carry.state, previous._replace(interrupted=torch.tensor(interrupted)))
    else:
        result = Run(loop.carry.state, loop.history(interrupted=interrupted))
    for hook in loop.hooks:
        hook.end(loop, interrupted)
    return result


__all__ = ["Run", "choose_route", "execute", "run", "setup", "split_start"]
