"""Monkey-patch the standard library for a gevent worker, before anything else is imported.

``console/__init__.py`` calls ``patch_for_green_pool()`` first thing: psycopg chooses its
wait function when it is imported and only cooperates with gevent when ``select`` is
already patched (so do redis-py, kombu and httpx with sockets). This module imports nothing
but ``sys`` for that reason.
"""

from __future__ import annotations

import sys

__all__ = ["GREEN_POOLS", "green_pool_requested", "patch_for_green_pool"]


GREEN_POOLS = frozenset({"gevent"})


def green_pool_requested(argv: list[str]) -> str | None:
    """The green pool an ``onward worker`` command line asks for, if any (read before any
    other import, so the standard library can be patched first)."""
    command = argv[0].rsplit("/", 1)[-1] if argv else ""
    if command not in ("onward", "-m", "__main__.py") or "worker" not in argv:
        return None  # not the onward command (e.g. pytest importing console)
    for index, arg in enumerate(argv):
        value = None
        if arg in ("-P", "--pool") and index + 1 < len(argv):
            value = argv[index + 1]
        elif arg.startswith("--pool="):
            value = arg.split("=", 1)[1]
        elif arg.startswith("-P") and len(arg) > 2:
            value = arg[2:]
        if value in GREEN_POOLS:
            return value
    return None


def patch_for_green_pool(argv: list[str] | None = None) -> str | None:
    """Monkey-patch the standard library when the command line runs a gevent worker."""
    pool = green_pool_requested(sys.argv if argv is None else argv)
    if pool == "gevent":
        try:
            from gevent import monkey
        except ImportError:
            sys.exit("onward worker -P gevent needs gevent: pip install 'onward[gevent]'")
        monkey.patch_all()
    return pool
