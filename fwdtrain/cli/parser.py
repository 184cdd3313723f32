"""The command line's options: ``fwdtrain [PROBLEM] [options]``, one subcommand per built-in problem, and
``fwdtrain cache [--clear | --limit SIZE]``."""

from __future__ import annotations

import argparse
import difflib
import inspect
import math
from collections.abc import Callable
from typing import Any, NoReturn

import torch

from .. import examples, optim
from ..compile import cache
from ..core.solvers import SOLVERS
from .events import events_parser

SCHEDULES = ("constant", "inverse-time", "staged")
CACHE = "cache"  # the subcommand that shows, prunes or clears the compiled kernels' folder
DTYPES = {"float32": torch.float32, "float64": torch.float64}


class UsageError(ValueError):
    """A command line that cannot run: bad options, an unknown problem (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not the usage block
        raise UsageError(f"{message} (see fwdtrain --help)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _finite_float(positive: bool) -> Callable[[str], float]:
    """An argparse type: a finite float, > 0 when ``positive``, else >= 0."""
    what = "a positive finite number" if positive else "a finite number >= 0"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


positive_float = _finite_float(positive=True)
rate = _finite_float(positive=False)


def _training_options(add: Callable[..., Any]) -> None:
    add(
        "--total-steps",
        "--steps",
        dest="steps",
        type=_positive_int,
        metavar="N",
        help="train up to N steps in total, counted from the start of the run: a --resume'd run continues up to "
        "N (fwdtrain.run's steps counts the steps of one call)",
    )
    add("--dt", type=positive_float, help="time step h")
    add(
        "--particles",
        type=_positive_int,
        help="number of particles N (per process under torchrun: R processes simulate R N particles)",
    )
    add("--lr", type=rate, help="learning rate alpha(0); without --schedule the problem's schedule is scaled to it")
    add(
        "--schedule",
        choices=SCHEDULES,
        help="learning-rate schedule: constant alpha; inverse-time alpha T0/(T0 + t); "
        "staged alpha, alpha/2 after t=50, /5 after 100, /10 after 500 (default: the problem's)",
    )
    add("--lr-offset", type=positive_float, metavar="T0", help="T0 of the inverse-time schedule (default 50)")
    add("--seed", type=int, help="seed of the initial network and the noise (default 0)")
    add("--dtype", choices=tuple(DTYPES), help="floating type (default: the problem's, float32 for lqr-1d)")
    add(
        "--solver",
        choices=tuple(SOLVERS),
        help="the scheme: " + "; ".join(f"{name}, {cls.summary}" for name, cls in SOLVERS.items()),
    )
    add(
        "--optimizer",
        choices=tuple(optim.OPTIMIZERS),
        help="update rule (default sgd: theta <- theta - alpha h G); "
        "momentum 0.9, adam (0.9, 0.999), rmsprop 0.99 with their default options; the rate stays alpha(t) h",
    )
    add("--clip", type=positive_float, metavar="NORM", help="clip the gradient's global norm at NORM before the rule")
    add(
        "--average-from",
        type=rate,
        metavar="T",
        help="Polyak-Ruppert average of theta over t >= T: recorded, and evaluated next to the last iterate",
    )


def _output_options(add: Callable[..., Any]) -> None:
    add("--record-every", type=_positive_int, default=100, help="steps between history records (default 100)")
    add(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile the step (traced once; kept on disk, so a later run loads it); --no-compile: eager. "
        "Default: compile when the run is long enough to repay it, as measured on this machine",
    )
    add(
        "--fuse",
        type=_positive_int,
        metavar="K",
        help="compiled runs take K steps per iteration of their loop (fwdtrain.Compile(unroll=K)): less overhead "
        "per step for small problems, a longer first compile (default 1)",
    )
    add(
        "--checkpoint",
        metavar="PATH",
        help="save a checkpoint here at the end, on Ctrl-C and every "
        "--checkpoint-every steps (the folder must exist and be writable; checked before the first step)",
    )
    add("--checkpoint-every", type=_positive_int, default=10_000, metavar="STEPS", help="default 10000")
    add(
        "--resume",
        metavar="PATH",
        help="continue the run saved in this checkpoint (its seed, dt, particles "
        "and dtype; a different --seed is refused)",
    )
    add(
        "--plot",
        metavar="PATH",
        help="write the PNG here (default fwdtrain-<problem>.png; the folder is checked before the first step)",
    )
    add("--no-plot", action="store_true", help="do not write a plot")
    add("--no-progress", action="store_true", help="no progress bar (it is off anyway when stderr is not a terminal)")
    add(
        "--json",
        action="store_true",
        help='print one JSON object (also for an error: {"error": ..., "exit_status": ...}) instead of the table',
    )
    add(
        "--ensemble",
        type=_positive_int,
        metavar="E",
        help="train seeds seed .. seed+E-1 as one vmapped run (under torchrun: on every rank's particles) "
        "and print each member's result and the mean and standard deviation over members (no plot)",
    )


def _options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _training_options(common.add_argument)
    _output_options(common.add_argument)
    return common


def defaults_of(builder: Callable[..., Any], built: bool = True) -> str:
    """The problem's defaults as the help shows them: "steps 6000, dt 0.01, particles 256, lr 0.5", lr being
    alpha(0), what --lr sets (read from the built example; ``built=False``: the builder's own defaults only)."""
    parameters = inspect.signature(builder).parameters
    shown = [
        f"{name} {parameters[name].default:g}"
        for name in ("steps", "dt", "particles")
        if name in parameters and isinstance(parameters[name].default, (int, float))
    ]
    if built:
        shown.append(f"lr {float(builder().lr(torch.zeros((), dtype=torch.float64))):g}")
    return ", ".join(shown)


def build_parser(helping: bool = True) -> argparse.ArgumentParser:
    """The parser: one subcommand per problem of ``fwdtrain.examples.REGISTRY``, sharing the options
    (``helping``: each problem's help shows its learning rate alpha(0), which builds the example)."""
    parser = _Parser(
        prog="fwdtrain",
        usage="fwdtrain [-h] [PROBLEM] [options]",
        description="Online forward-propagation training of SDEs: train a built-in problem and compare "
        f"with its known optimum. Without a problem name, trains {examples.DEFAULT}.",
        epilog="options: fwdtrain PROBLEM --help (--total-steps, --dt, --particles, --lr, --schedule, "
        "--seed, --dtype, --solver, --checkpoint, --resume, --plot, --json, ...). Event streams fitted by the "
        f"exact likelihood: {', '.join(examples.EVENT_REGISTRY)} (fwdtrain hawkes-2d --help). "
        f"fwdtrain {CACHE}: the compiled kernels' folder, its size and cap (--clear empties it)",
    )
    sub: Any = parser.add_subparsers(dest="problem", metavar="PROBLEM", parser_class=_Parser)
    common = _options()
    for name, builder in examples.REGISTRY.items():
        summary = getattr(builder, "summary", None) or name
        defaults = defaults_of(builder, built=helping)
        sub.add_parser(
            name,
            parents=[common],
            help=f"{summary} (defaults: {defaults})",
            description=f"{summary}. Defaults: {defaults}.",
            usage=f"fwdtrain {name} [options]",
        )
    _cache_command(sub)
    return parser


def _size(text: str) -> str:
    """An argparse type: ``text`` when ``cache.parse_size`` reads it (bytes, a size with a unit, "none")."""
    try:
        cache.parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _cache_command(sub: Any) -> None:
    what = "the compiled kernels' folder: its packages, their size and cap, and inductor's caches"
    command = sub.add_parser(
        CACHE,
        help=f"show {what}",
        description=f"Show {what}; --clear removes them all, --limit prunes them now.",
        usage=f"fwdtrain {CACHE} [--clear | --limit SIZE] [--json]",
    )
    action = command.add_mutually_exclusive_group()
    action.add_argument("--clear", action="store_true", help="remove every package and inductor's caches")
    action.add_argument(
        "--limit",
        type=_size,
        metavar="SIZE",
        help="remove the least recently used packages and inductor's files until they hold at most SIZE (500M, "
        f"2G, 1.5GB, 512MiB, bytes); the cap of later runs is ${cache.LIMIT_ENV}",
    )
    command.add_argument("--json", action="store_true", help="print one JSON object instead of the lines")


def with_problem(argv: list[str]) -> list[str]:
    """``argv`` with the default problem first when none is named; a word that is not a problem is refused,
    with the list of problems and the closest name."""
    if argv and argv[0] in (*examples.REGISTRY, CACHE, "-h", "--help"):
        return argv
    if argv and not argv[0].startswith("-"):
        names = sorted([*examples.REGISTRY, *examples.EVENT_REGISTRY])
        close = difflib.get_close_matches(argv[0].lower(), names, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UsageError(f"unknown problem {argv[0]!r}{hint} The problems are: {', '.join(names)}")
    return [examples.DEFAULT, *argv]


def parse(argv: list[str]) -> tuple[argparse.Namespace, bool]:
    """(the options, whether the problem was named). ``UsageError`` for a bad command line; SystemExit(0)
    for --help."""
    if argv and argv[0] in examples.EVENT_REGISTRY:  # event streams: their own options (``cli.events``)
        return events_parser(argv[0]).parse_args(argv[1:]), True
    named = bool(argv) and argv[0] in examples.REGISTRY
    helping = any(word in ("-h", "--help") for word in argv)
    args = build_parser(helping).parse_args(with_problem(argv))
    if args.problem == CACHE:
        return args, False
    if args.fuse is not None and args.compile is False:
        raise UsageError(f"--fuse {args.fuse} asks for compiled steps but --no-compile for eager ones; drop one")
    return args, named


__all__ = [
    "CACHE",
    "DTYPES",
    "SCHEDULES",
    "UsageError",
    "build_parser",
    "defaults_of",
    "parse",
    "positive_float",
    "rate",
    "with_problem",
]
