"""Dropping the tests' databases off the tests' path.

PostgreSQL 15's DROP DATABASE forces a checkpoint and waits for it: 0.5 s on a quiet
machine, 2 to 8 s on a busy one, paid in every test's teardown. A test's database is of
no use once its test ended (nothing connects to it again), so its drop can run while the
next test runs: ``Dropper`` drops on threads of its own, several at a time (concurrent
drops wait for the same checkpoint), and ``close`` waits for every drop and raises the
first that failed, so a database is never left behind silently.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from harness.databases import drop_database

__all__ = ["Dropper"]


class Dropper:
    """Drops databases of one server in the background; ``close`` waits for them all."""

    def __init__(self, admin_url: str, threads: int = 16) -> None:
        self.admin_url = admin_url
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dropdb")
        self._drops: list[Future[None]] = []

    def drop(self, name: str) -> None:
        """Drop ``name`` (WITH FORCE: sessions still on it end) soon, not now."""
        self._drops.append(self._pool.submit(drop_database, self.admin_url, name))

    def close(self) -> None:
        """Wait for every drop; raise the first error, if any."""
        self._pool.shutdown(wait=True)
        for drop in self._drops:
            drop.result()
