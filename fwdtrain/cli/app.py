"""``python -m fwdtrain [PROBLEM] [options]``: train a built-in problem and print what it learned against the
known optimum (``lqr-1d`` when no problem is named). ``python -m fwdtrain cache [--clear | --limit SIZE]``: the
compiled kernels' folder (``cache_command``; exit status 0, or 2 for a bad size or ``$FWDTRAIN_CACHE_LIMIT``).

Exit status:
  0    success
  1    another rank of a process group failed or was lost (every rank that leaves says why on stderr)
  2    bad options; a --checkpoint or --plot path that cannot be written (checked before the first step);
       a --resume file that is not a fwdtrain checkpoint, is damaged, of another problem or shape, saved
       without a history, or resumed with a different --seed
  3    divergence (the last finite state is saved to --checkpoint when given); with --ensemble only when
       every member diverged (a member that diverges is frozen, flagged in the results, and the others go on)
  4    trained, but the checkpoint could not be saved: the results are printed, the error names the path
  5    trained, but the plot could not be written: the results are printed (and the checkpoint saved)
  130  interrupted with Ctrl-C (after printing the results so far and saving the checkpoint; a second
       Ctrl-C during the evaluation skips it and still prints the training results)

With ``--json`` the command prints exactly one JSON object: the results, or for an error
``{"error": {"type": ..., "message": ...}, "exit_status": N}``; either carries ``exit_status``.

Under ``torchrun --nproc-per-node R -m fwdtrain ...`` every rank runs this same command: each simulates
``--particles`` particles with its own noise (``distributed.rank_seed``), the gradient is averaged over the
group every step, and rank 0 alone prints, plots, evaluates and writes one checkpoint holding every rank's
particles. With ``--ensemble E`` every rank steps the same E members on its own particles (member e's noise
seeded with rank seed + e): each member is the group's run, and rank 0 prints all E.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from .. import distributed, examples
from ..core.errors import CheckpointError
from . import cache_command
from .configure import prepare
from .events import run_events
from .parser import CACHE, UsageError, parse
from .report import render, report
from .train import Diverged, train

EXIT_OK, EXIT_GROUP, EXIT_USAGE, EXIT_DIVERGED, EXIT_CHECKPOINT, EXIT_PLOT, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 5, 130
EXIT_WAIT = 600.0  # seconds the other ranks of a group wait at exit for rank 0 to finish


def fail(error: BaseException | str, status: int, as_json: bool, every_rank: bool = False) -> int:
    """Print the error in one line on stderr (rank 0 only, unless every rank has its own to tell) and, with
    --json, as one JSON object on stdout; return ``status``."""
    if not (every_rank or distributed.is_main()):
        return status
    message = str(error)
    where = (
        f"rank {distributed.rank()}: "
        if every_rank and distributed.is_initialized() and not message.startswith(f"rank {distributed.rank()}:")
        else ""
    )
    print(f"fwdtrain: {where}error: {message}", file=sys.stderr)
    if as_json and distributed.is_main():
        kind = type(error).__name__ if isinstance(error, BaseException) else "Error"
        kind = "DivergenceError" if isinstance(error, Diverged) else kind
        print(json.dumps({"error": {"type": kind, "message": message}, "exit_status": status}))
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m fwdtrain`` and the ``fwdtrain`` script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    if argv and argv[0] in examples.EVENT_REGISTRY:  # event streams: fitted by the exact likelihood, not run()
        try:
            return run_events(argv[0], argv[1:])
        except SystemExit as stop:
            return stop.code if isinstance(stop.code, int) else EXIT_USAGE
        except (ValueError, TypeError) as error:
            return fail(error, EXIT_USAGE, as_json)
    quiet = not distributed.is_main()  # a rank > 0 under torchrun: rank 0 says it all
    try:
        with (
            contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext(),
            contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext(),
        ):
            args, named = parse(argv)
    except SystemExit as stop:  # --help
        return stop.code if isinstance(stop.code, int) else EXIT_USAGE
    except UsageError as error:
        return fail(error, EXIT_USAGE, as_json)
    if args.problem == CACHE:
        try:
            return cache_command.run(args)
        except (ValueError, OSError) as error:  # a bad $FWDTRAIN_CACHE_LIMIT, a folder that cannot be read
            return fail(error, EXIT_USAGE, as_json)
    status = EXIT_GROUP
    try:
        distributed.init_process_group()  # a no-op outside torchrun
        status = _main(args, named)
        return status
    except ValueError as error:  # a torchrun environment given only in part
        return fail(error, EXIT_USAGE, as_json)
    except RuntimeError as error:  # in a group (e.g. a peer gone while joining it): every rank says why
        if distributed.world_size() <= 1:
            raise
        return fail(f"{type(error).__name__}: {error}", EXIT_GROUP, as_json, every_rank=True)
    finally:  # after a run, every rank waits for rank 0's evaluation and plots, then all leave together
        distributed.destroy_process_group(wait=EXIT_WAIT if status in (EXIT_OK, EXIT_INTERRUPTED) else None)


def entry() -> NoReturn:
    """``python -m fwdtrain`` and the ``fwdtrain`` script: exit with ``main``'s status. A rank whose group broke
    (a peer killed or hung) leaves at once, its message printed: torch's teardown of a gloo context whose peer
    is gone can abort the process ("terminate called without an active exception", SIGABRT) instead of
    exiting with the status."""
    status = main()
    if distributed.lost():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


def _status(result: dict[str, Any]) -> int:
    if result["interrupted"]:
        return EXIT_INTERRUPTED
    if result.get("checkpoint_error"):
        return EXIT_CHECKPOINT
    return EXIT_PLOT if result.get("plot_error") else EXIT_OK


def _main(args: Any, named: bool) -> int:
    try:
        job = prepare(args, named)
        trained = train(job)
    except Diverged as error:
        return fail(error, EXIT_DIVERGED, args.json)
    except distributed.GroupError as error:  # a rank whose peers are gone (rank 0 among them) says why itself
        status = EXIT_DIVERGED if error.reason == "non-finite" else EXIT_GROUP
        return fail(error, status, args.json, every_rank=error.reason == "lost")
    except (ValueError, TypeError, CheckpointError) as error:
        return fail(error, EXIT_USAGE, args.json)
    if not distributed.is_main():
        return EXIT_INTERRUPTED if bool(trained.history.interrupted) else EXIT_OK
    result = report(job, trained)
    result["exit_status"] = status = _status(result)
    print(json.dumps(result) if args.json else render(result))
    for key in ("checkpoint_error", "plot_error"):
        if result.get(key):
            print(f"fwdtrain: error: {result[key]}", file=sys.stderr)
    return status


__all__ = [
    "EXIT_CHECKPOINT",
    "EXIT_DIVERGED",
    "EXIT_GROUP",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PLOT",
    "EXIT_USAGE",
    "entry",
    "fail",
    "main",
]
