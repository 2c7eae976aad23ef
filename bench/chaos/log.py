"""Progress on stderr (stdout carries only the JSON line)."""

from __future__ import annotations

import sys
import time

VERBOSE = True


def log(message: str, *, always: bool = False) -> None:
    if VERBOSE or always:
        print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def quiet(on: bool) -> None:
    """With ``--json``: only what is logged with ``always`` reaches stderr."""
    global VERBOSE
    VERBOSE = not on
