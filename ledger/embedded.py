"""The embedded PostgreSQL: a real server from ``pgserver``, kept under ``ONWARD_HOME``.

Started once and left running for every process of the project (workers, dispatcher,
reaper, CLI, tests); ``onward embedded down`` stops it.
"""

from __future__ import annotations

import fcntl
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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


def stop_postgres(home: Path) -> bool:
    """Stop the embedded PostgreSQL if it runs; return whether it was running."""
    pgdata = home / "pg"
    if not (pgdata / "postmaster.pid").exists():
        return False
    with home_lock(home), _quiet_pgserver():
        import pgserver

        pgserver.get_server(pgdata, cleanup_mode="stop").cleanup()  # type: ignore[attr-defined]
    return True
