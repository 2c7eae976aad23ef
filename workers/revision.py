"""A long-running process and the ledger's schema revision (docs/operating.md, "Upgrading").

At start, a worker, dispatcher or reaper waits for a database it cannot reach (PostgreSQL
restarting, a failover, a host booting), retrying with backoff and logging what it waits
for, and refuses at once a database at another revision (``SchemaMismatch``: exit 2). While
it runs, ``ledger.db.RevisionWatch`` notices an upgrade and the process stops taking work.
"""

from __future__ import annotations

import structlog
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential

from ledger.db import (
    HEAD_REVISION,
    Engine,
    database_url,
    require_current_schema,
    revision_changed,
    stored_revision,
)
from ledger.exceptions import LedgerUnavailable
from ledger.settings import OnwardSettings

__all__ = ["MAX_BACKOFF_S", "schema_changed_under", "wait_for_ledger"]


log = structlog.get_logger("onward.revision")

MAX_BACKOFF_S = 30.0


def wait_for_ledger(engine: Engine, process: str, *, first_s: float = 0.5,
                    max_backoff_s: float = MAX_BACKOFF_S) -> None:
    """Return once the ledger database answers at this code's revision; wait (first_s, then
    doubling up to ``max_backoff_s``, for as long as it takes) while it cannot be reached;
    raise ``SchemaMismatch`` for another revision or no schema."""

    def waiting(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        sleep = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning("waiting for the ledger database", process=process,
                    attempt=state.attempt_number, retry_in_s=round(sleep, 1),
                    error=str(error).strip().splitlines()[0] if error else None)

    retrying = Retrying(retry=retry_if_exception_type(LedgerUnavailable),
                        wait=wait_exponential(multiplier=first_s, max=max_backoff_s),
                        before_sleep=waiting, reraise=True)
    retrying(require_current_schema, engine)
    attempts = retrying.statistics.get("attempt_number", 1)
    if attempts > 1:
        log.info("ledger database reachable", process=process, attempts=attempts)


def schema_changed_under(settings: OnwardSettings) -> str | None:
    """Why a process that ran at this code's revision must not go on, if the ledger is now
    at another one (None when it is not, or cannot be reached to say)."""
    try:
        found = stored_revision(database_url(settings))
    except LedgerUnavailable:
        return None
    return None if found == HEAD_REVISION else str(revision_changed(found))
