"""The embedded PostgreSQL: a real server from ``pgserver``, kept under ``ONWARD_HOME``.

Started once and left running for every process of the project (workers, dispatcher,
reaper, CLI, tests); ``onward embedded down`` stops it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ledger.exceptions import LedgerUnavailable

__all__ = ["DATABASE", "home_lock", "postgres_url", "stop_postgres"]


DATABASE = "postgres"


@contextmanager
def home_lock(home: Path) -> Iterator[None]:
    """Serialize embedded-server start-up between processes that start at once."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "embedded.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def _quiet_pgserver() -> Iterator[None]:
    """pgserver asks platformdirs for a runtime dir, which warns on hosts without one; and
    it logs at INFO what no operator acts on (initdb skipped, the server already running,
    its postmaster's details: three long lines before ``onward console``'s login link), so
    its logger says warnings only unless someone set its level."""
    quiet = logging.getLogger("pgserver")
    if quiet.level == logging.NOTSET:
        quiet.setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        yield


def postgres_url(home: Path) -> str:
    """Start the embedded PostgreSQL if it is not running and return its SQLAlchemy URL."""
    pgdata = home / "pg"
    with home_lock(home), _quiet_pgserver():
        import pgserver  # imported lazily: only the embedded default needs it

        server = pgserver.get_server(pgdata, cleanup_mode=None)  # type: ignore[attr-defined]
    # pgserver listens on a Unix socket; its URI names the socket directory.
    uri: str = server.get_uri(DATABASE)
    return uri.replace("postgresql://", "postgresql+psycopg://", 1)


def stop_postgres(home: Path, timeout_s: float = 60.0) -> bool:
    """Stop the embedded PostgreSQL if it runs; return whether it was running.

    Asks the postmaster for a fast shutdown itself (SIGINT) and waits until it has gone.
    pgserver's own cleanup stops the server only when no other process is registered as
    using it (``pg/.handle_pids.json``), and a process that was SIGKILLed (the demo kills
    workers) stays registered for good: after ``make demo`` it stopped nothing, while
    ``onward embedded down`` said it had."""
    pgdata = home / "pg"
    with home_lock(home):
        pid = _postmaster_pid(pgdata)
        if pid is None:
            return False
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            return False
        deadline = time.monotonic() + timeout_s
        while _alive(pid) and _postmaster_pid(pgdata) == pid:
            if time.monotonic() > deadline:
                raise LedgerUnavailable(f"the embedded PostgreSQL (pid {pid}) did not stop "
                                        f"within {timeout_s:.0f} s")
            time.sleep(0.1)
        (pgdata / ".handle_pids.json").unlink(missing_ok=True)  # every user of it is gone
    return True


def _postmaster_pid(pgdata: Path) -> int | None:
    try:
        return int((pgdata / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True
