"""``fwdtrain cache [--clear | --limit SIZE] [--json]``: the compiled kernels' folder (``fwdtrain.compile.cache``),
shown, pruned now or emptied."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from ..compile import cache


def show() -> dict[str, Any]:
    """The folder, its packages (count, bytes), the cap on them and its ``inductor/`` together (bytes, None: no
    cap), the bytes of its ``inductor/`` and ``$TORCHINDUCTOR_CACHE_DIR`` when it names another folder (inductor's
    caches are there, not counted).
    ``ValueError`` for a bad ``$FWDTRAIN_CACHE_LIMIT``."""
    limit = cache.limit_bytes()
    used = cache.usage()
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    elsewhere = chosen if chosen and Path(chosen) != cache.cache_dir() / "inductor" else None
    return {
        "folder": str(cache.cache_dir()),
        "packages": used.packages,
        "package_bytes": used.package_bytes,
        "limit_bytes": limit,
        "inductor_bytes": used.inductor_bytes,
        "torchinductor_cache_dir": elsewhere,  # the user's choice of inductor's folder: neither counted nor cleared
    }


def render(shown: dict[str, Any]) -> str:
    """``show()`` as lines for a person."""
    limit = shown["limit_bytes"]
    cap = "none" if limit is None else cache.format_size(limit)
    lines = [
        f"cache folder  {shown['folder']}",
        f"packages      {shown['packages']}, {cache.format_size(shown['package_bytes'])} (kernels/)",
        f"cap           {cap} (${cache.LIMIT_ENV}; packages and inductor/ together, the least recently used go first)",
        f"inductor      {cache.format_size(shown['inductor_bytes'])} "
        "(inductor/: its caches, headers and the last hour's builds; --clear empties it)",
    ]
    if shown["torchinductor_cache_dir"]:
        lines.append(f"              inductor writes to $TORCHINDUCTOR_CACHE_DIR={shown['torchinductor_cache_dir']}")
    if "freed_bytes" in shown:
        lines.insert(0, shown["done"])
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """The command: print what it did and the folder's state (or one JSON object); the exit status, 0.
    ``ValueError`` (exit status 2) for a bad ``$FWDTRAIN_CACHE_LIMIT``."""
    if args.clear:
        cleared = cache.clear()
        freed = cleared.package_bytes + cleared.inductor_bytes
        done = {
            "cleared": True,
            "folder": str(cache.cache_dir()),
            "packages": cleared.packages,
            "freed_bytes": freed,
        }
        message = (
            f"cleared {done['folder']}: freed {cache.format_size(freed)} ({_packages(cleared.packages)}, "
            f"{cache.format_size(cleared.inductor_bytes)} of inductor's caches)"
        )
        print(json.dumps({**done, "exit_status": 0}) if args.json else message)
        return 0
    shown: dict[str, Any] = {}
    if args.limit is not None:
        limit = cache.parse_size(args.limit)
        pruned = cache.prune_to(limit)
        shown["freed_bytes"] = pruned.freed
        shown["removed"] = pruned.removed
        cap = "no cap" if limit is None else cache.format_size(limit)
        shown["done"] = f"pruned to {cap}: removed {_packages(pruned.removed)}, freed {cache.format_size(pruned.freed)}"
    shown = {**show(), **shown}
    print(json.dumps({**shown, "exit_status": 0}) if args.json else render(shown))
    return 0


def _packages(count: int) -> str:
    return f"{count} package{'' if count == 1 else 's'}"


__all__ = ["render", "run", "show"]
