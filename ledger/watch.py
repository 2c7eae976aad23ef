"""Waiting on a run without polling: LISTEN on the run's channel, read the run when it moves.

Every change of a run's ``seq`` or ``status`` NOTIFYs ``onward_run_<id hex>`` in the same
transaction while the run has watchers (trigger ``runs_notify_progress``, migrations 0021
and 0031: a NOTIFY serializes its commit with every other notifying commit of the server,
so unwatched runs, nearly all of them, send none). A watcher LISTENs first, then registers
(``WATCH``: ``runs.watchers + 1``), then reads the run. The registration is an UPDATE of the
run row: a commit in flight on the run holds that row, so the registration waits for it
and the read sees it; a commit after the registration reads the count and notifies. So
nothing that commits after the read goes unnoticed; each notification only says "read
again". A watcher unregisters when it stops (``UNWATCH``); one that dies first leaves the
run notifying, as every run did before 0031. What it reads (the run row and the checkpoints since
the last read) is the ledger's record, so a coalesced or lost notification can delay an
event but never change it. ``RunWatch`` turns those reads into events and is shared by the
blocking ``Ledger.wait``/``Ledger.events`` here and the asyncio client (``ledger/client.py``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row

from ledger import sql
from ledger.db import connect_raw, set_tenant
from ledger.exceptions import LedgerUnavailable, UnknownRun, WaitTimedOut
from ledger.runs import Run
from ledger.vocabulary import RunStatus

__all__ = [
    "CHANNEL_PREFIX",
    "READ_RUN",
    "READ_STEPS",
    "UNWATCH",
    "WATCH",
    "BlockingWatcher",
    "EventKind",
    "RunEvent",
    "RunOutcome",
    "RunWatch",
    "events_blocking",
    "remaining",
    "run_channel",
    "stopped",
    "wait_blocking",
]


CHANNEL_PREFIX = "onward_run_"

READ_RUN = sql.statement("watched_run")
WATCH = sql.statement("watch_run")
UNWATCH = sql.statement("unwatch_run")
READ_STEPS = sql.statement("watched_steps")


def run_channel(run_id: UUID) -> str:
    """The NOTIFY channel of one run (63 bytes at most: 11 + 32 hex digits)."""
    return f"{CHANNEL_PREFIX}{run_id.hex}"


class EventKind(StrEnum):
    STEP_COMMITTED = "step_committed"
    WAITING = "waiting"  # for a person's decision, a signal or a timer
    RESUMED = "resumed"  # running again after a wait, a park or a failure
    PARKED = "parked"  # needs_review: a person must look
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DIVERGED = "diverged"


_KIND_OF_STATUS = {
    RunStatus.WAITING: EventKind.WAITING, RunStatus.RUNNING: EventKind.RESUMED,
    RunStatus.NEEDS_REVIEW: EventKind.PARKED, RunStatus.COMPLETED: EventKind.COMPLETED,
    RunStatus.FAILED: EventKind.FAILED, RunStatus.CANCELLED: EventKind.CANCELLED,
    RunStatus.DIVERGED: EventKind.DIVERGED,
}


@dataclass(frozen=True)
class RunEvent:
    """One thing that happened to a run, in ledger order."""

    kind: EventKind
    run_id: UUID
    seq: int
    status: RunStatus
    step: str | None = None  # step_committed: the step that committed checkpoint ``seq``
    next_step: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)  # waiting_on, reason, result, error


@dataclass(frozen=True)
class RunOutcome:
    """Where a run stands when it stopped: its result, or why it is not running."""

    run_id: UUID
    status: RunStatus
    seq: int
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    waiting_on: str | None
    parked_reason: str | None

    @property
    def done(self) -> bool:
        """Finished for good (completed, failed, cancelled, diverged)."""
        return self.status.terminal

    @classmethod
    def of(cls, run: Run) -> RunOutcome:
        return cls(run.id, run.status, run.seq, run.result, run.last_error, run.waiting_on,
                   run.parked_reason)


def stopped(status: RunStatus, *, through_waits: bool) -> bool:
    """A run stops when it leaves ``running``; ``through_waits`` waits past its waits."""
    if through_waits:
        return status.terminal or status is RunStatus.NEEDS_REVIEW
    return status is not RunStatus.RUNNING


@dataclass
class RunWatch:
    """Turns successive reads of one run into events (no I/O here)."""

    run_id: UUID
    after_seq: int = 0  # step_committed events are for checkpoints after this seq
    status: RunStatus | None = None

    def changes(self, run: Run, steps: list[dict[str, Any]]) -> list[RunEvent]:
        events = [RunEvent(EventKind.STEP_COMMITTED, self.run_id, row["seq"], run.status,
                           step=row["step"], next_step=row["next_step"],
                           detail={"outcome": row["outcome"]}) for row in steps]
        if steps:
            self.after_seq = steps[-1]["seq"]
        if run.status is not self.status:
            first = self.status is None
            self.status = run.status
            if not (first and run.status is RunStatus.RUNNING):
                events.append(RunEvent(_KIND_OF_STATUS[run.status], self.run_id, run.seq,
                                       run.status, step=run.step, detail=_status_detail(run)))
        return events


def _status_detail(run: Run) -> dict[str, Any]:
    detail = {"waiting_on": run.waiting_on, "reason": run.parked_reason,
              "result": run.result, "error": run.last_error}
    return {key: value for key, value in detail.items() if value is not None}


class BlockingWatcher:
    """One LISTEN connection for one run (``Ledger.wait`` and ``Ledger.events``)."""

    def __init__(self, url: str, run_id: UUID, tenant_id: str) -> None:
        self.run_id = run_id
        self.params: dict[str, Any] = {"run_id": run_id, "tenant_id": tenant_id}
        self.conn = connect_raw(url, autocommit=True)
        self.conn.row_factory = dict_row
        try:
            set_tenant(self.conn, tenant_id, local=False)  # this connection serves one tenant
            self.conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(run_channel(run_id))))
            self.conn.execute(WATCH, self.params)  # after LISTEN, before the first read
        except psycopg.Error as exc:
            self.conn.close()
            raise LedgerUnavailable(f"cannot listen for run {run_id}: {exc}") from exc

    def read(self, watch: RunWatch | None = None) -> tuple[Run, list[dict[str, Any]]]:
        try:
            row = self.conn.execute(READ_RUN, self.params).fetchone()
            if row is None:
                raise UnknownRun(f"no run {self.run_id} in this tenant")
            run = Run.from_row(row)
            steps: list[dict[str, Any]] = []
            if watch is not None and run.seq > watch.after_seq:
                steps = self.conn.execute(READ_STEPS, {
                    "run_id": self.run_id, "after": watch.after_seq, "upto": run.seq}).fetchall()
            return run, steps
        except psycopg.OperationalError as exc:
            raise LedgerUnavailable(f"ledger database failed: {exc}") from exc

    def sleep(self, timeout: float | None) -> None:
        """Block until a notification for this run (or the timeout)."""
        try:
            for _ in self.conn.notifies(timeout=timeout, stop_after=1):
                pass
        except psycopg.OperationalError as exc:
            raise LedgerUnavailable(f"ledger database failed: {exc}") from exc

    def close(self) -> None:
        with contextlib.suppress(psycopg.Error):  # if it fails, the run keeps notifying
            self.conn.execute(UNWATCH, self.params)
        self.conn.close()


def remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def wait_blocking(url: str, tenant_id: str, run_id: UUID, timeout: float | None, *,
                  through_waits: bool, shown: Callable[[Run], Run] | None = None
                  ) -> RunOutcome:
    """Block until the run stops; its outcome is of the run as ``shown`` makes it (its
    sealed result opened or masked: ``ledger.runs.shown_run``)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    watcher = BlockingWatcher(url, run_id, tenant_id)
    try:
        while True:
            run, _ = watcher.read()
            if stopped(run.status, through_waits=through_waits):
                return RunOutcome.of(shown(run) if shown is not None else run)
            left = remaining(deadline)
            if left is not None and left <= 0:
                raise WaitTimedOut(run_id, timeout or 0.0, run.status, run.seq)
            watcher.sleep(left)
    finally:
        watcher.close()


def events_blocking(url: str, tenant_id: str, run_id: UUID, *, after_seq: int,
                    timeout: float | None, shown: Callable[[Run], Run] | None = None
                    ) -> Iterator[RunEvent]:
    deadline = None if timeout is None else time.monotonic() + timeout
    watcher = BlockingWatcher(url, run_id, tenant_id)
    watch = RunWatch(run_id, after_seq=after_seq)
    try:
        while True:
            run, steps = watcher.read(watch)
            run = shown(run) if shown is not None else run
            yield from watch.changes(run, steps)
            if run.status.terminal:
                return
            left = remaining(deadline)
            if left is not None and left <= 0:
                raise WaitTimedOut(run_id, timeout or 0.0, run.status, run.seq)
            watcher.sleep(left)
    finally:
        watcher.close()
