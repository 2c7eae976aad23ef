"""``AsyncLedger``: the application's asyncio client (start, get, wait, events, signal,
approve, reject, cancel), on psycopg's asyncio connections.

Commands run the same transaction bodies as ``Ledger`` (role check first, one audit row,
refusals audited) through SQLAlchemy's asyncio engine over psycopg's ``AsyncConnection``;
starting a run runs the same single statement and check as ``Ledger.start_run_txn``.
Waiting needs no polling and no connection per waiter: one LISTEN connection per client
serves every ``wait`` and ``events`` in flight (ledger/watch.py explains why a
notification only ever means "read again").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ledger import catalog, operations, waits, watch
from ledger import runs as run_ops
from ledger.api import REFUSALS
from ledger.audit import Actor, AuditRecord, record_txn
from ledger.checkpoints import CheckpointKeys
from ledger.crypto import is_sealed
from ledger.db import SET_TENANT, TENANT_OPTION, database_url, libpq_conninfo
from ledger.exceptions import LedgerUnavailable, UnknownRun, WaitTimedOut
from ledger.settings import OnwardSettings
from ledger.vocabulary import AuditAction, AuditOutcome, Role

__all__ = ["LISTEN_CYCLE_S", "AsyncLedger"]


T = TypeVar("T")
LISTEN_CYCLE_S = 0.1
"""How often the listener looks for new channels to LISTEN to between notifications."""


class _Listener:
    """One LISTEN connection; each notification wakes the waiters of that run's channel."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.waiters: dict[str, set[asyncio.Event]] = {}
        self.listening: set[str] = set()
        self.confirmed: dict[str, asyncio.Future[None]] = {}
        self.task: asyncio.Task[None] | None = None

    async def subscribe(self, channel: str) -> asyncio.Event:
        """An event set at every notification on ``channel``, once LISTEN is in effect."""
        wake = asyncio.Event()
        self.waiters.setdefault(channel, set()).add(wake)
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run(), name="onward-listener")
        if channel not in self.listening:
            confirmed = self.confirmed.setdefault(
                channel, asyncio.get_running_loop().create_future())
            await asyncio.shield(confirmed)
        return wake

    def unsubscribe(self, channel: str, wake: asyncio.Event) -> None:
        found = self.waiters.get(channel)
        if found is not None:
            found.discard(wake)
            if not found:
                del self.waiters[channel]

    async def _run(self) -> None:
        while self.waiters or self.confirmed:
            try:
                await self._serve()
            except (psycopg.OperationalError, OSError):
                self.listening.clear()
                self._wake_all()  # every waiter reads again; LISTEN again on reconnect
                await asyncio.sleep(0.5)

    async def _serve(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.conninfo,
                                                         autocommit=True) as conn:
            while self.waiters or self.confirmed:
                await self._sync_channels(conn)
                async for notify in conn.notifies(timeout=LISTEN_CYCLE_S):
                    for wake in self.waiters.get(notify.channel, ()):
                        wake.set()

    async def _sync_channels(self, conn: psycopg.AsyncConnection[Any]) -> None:
        for channel in set(self.waiters) - self.listening:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            self.listening.add(channel)
        for channel in self.listening - set(self.waiters):
            await conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(channel)))
            self.listening.discard(channel)
        for channel in [c for c in self.confirmed if c in self.listening]:
            self.confirmed.pop(channel).set_result(None)
        for channel in [c for c in self.confirmed if c not in self.waiters]:
            self.confirmed.pop(channel).cancel()

    def _wake_all(self) -> None:
        for wakes in self.waiters.values():
            for wake in wakes:
                wake.set()

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


class AsyncLedger:
    """The asyncio twin of ``Ledger`` for application code."""

    def __init__(self, settings: OnwardSettings | None = None, *,
                 actor: Actor | None = None) -> None:
        self.settings = settings or OnwardSettings()
        self.url = database_url(self.settings)
        self.conninfo = libpq_conninfo(self.url)
        self.keys = CheckpointKeys.from_settings(self.settings)
        self.actor = actor or Actor(self.settings.actor, Role.ADMIN, self.settings.tenant_id)
        self.engine: AsyncEngine = create_async_engine(
            self.url, pool_size=5, max_overflow=5,
            execution_options={TENANT_OPTION: self.actor.tenant_id})
        self._listener = _Listener(self.conninfo)

    async def close(self) -> None:
        await self._listener.close()
        await self.engine.dispose()

    async def __aenter__(self) -> AsyncLedger:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- starting and reading ----------------------------------------------------------------
    async def start(self, workflow: str, input: dict[str, Any], *,
                    conversation_id: str | None = None, idempotency_key: str | None = None,
                    max_attempts: int | None = None, budgets: run_ops.Budgets | None = None,
                    allow_unadvertised: bool | None = None,
                    sensitive: tuple[str, ...] = ()) -> UUID:
        """``Ledger.start_run``: same checks (known workflow, input its state model accepts),
        same single statement, the same sensitive input fields sealed."""
        run_ops.validate_input(input, self.settings.max_state_bytes, self.settings.max_json_depth)
        request = run_ops.StartRequest(
            workflow=workflow, input=input, tenant_id=self.actor.tenant_id,
            conversation_id=conversation_id, idempotency_key=idempotency_key,
            max_attempts=max_attempts or self.settings.step_max_attempts,
            budgets=budgets or run_ops.Budgets())
        run_ops.validate_request(request)
        allowed = (self.settings.start_unadvertised if allow_unadvertised is None
                   else allow_unadvertised)
        try:
            async with await psycopg.AsyncConnection.connect(self.conninfo) as conn:
                await conn.execute(SET_TENANT, {"tenant": request.tenant_id, "local": True})
                if not allowed:
                    await catalog.check_start_async(conn, workflow, input)
                if self.keys.crypt is None:
                    params = run_ops.start_params(self.keys, request)
                else:  # sealing may read the tenant's data key: off the event loop
                    sealed = run_ops.input_sealed(
                        await catalog.sensitive_fields_async(conn, workflow), sensitive, input)
                    params = await asyncio.to_thread(run_ops.start_params, self.keys,
                                                     request, sealed)
                cursor = await conn.execute(run_ops.START_RUN, params)
                run_id = run_ops.started_id(await cursor.fetchone())
                if run_id is not None:
                    return run_id
                found = await conn.cursor(row_factory=dict_row).execute(
                    run_ops.EXISTING_RUN, {"tenant_id": request.tenant_id,
                                           "idempotency_key": idempotency_key})
                return run_ops.existing_run(await found.fetchone(), request, self.keys)
        except psycopg.OperationalError as exc:
            raise LedgerUnavailable(f"starting a run: {exc}") from exc

    async def get(self, run_id: UUID) -> run_ops.Run | None:
        """The run, if it exists in the actor's tenant."""
        async with self.engine.connect() as conn:
            run = await conn.run_sync(lambda c: run_ops.get_run(c, run_id))
        if run is None or run.tenant_id != self.actor.tenant_id:
            return None
        return await self._shown_run(run)

    async def _shown_run(self, run: run_ops.Run) -> run_ops.Run:
        """The run with its sealed finish result opened (a viewer sees it masked), as
        ``Ledger`` shows it; opening may read the tenant's data key: off the event loop."""
        if not is_sealed(run.result):
            return run
        may_see = self.actor.role is not Role.VIEWER and self.keys.crypt is not None
        return await asyncio.to_thread(run_ops.shown_run, self.keys.crypt, run,
                                       may_see=may_see)

    async def _require(self, run_id: UUID) -> run_ops.Run:
        run = await self.get(run_id)
        if run is None:
            raise UnknownRun(f"no run {run_id} in this tenant")
        return run

    # -- waiting ---------------------------------------------------------------------------
    async def wait(self, run_id: UUID, timeout: float | None = None, *,
                   through_waits: bool = False) -> watch.RunOutcome:
        """``Ledger.wait`` without a connection of its own: the result, or why it stopped."""
        run = await self._require(run_id)
        if watch.stopped(run.status, through_waits=through_waits):
            return watch.RunOutcome.of(run)
        channel = watch.run_channel(run_id)
        async with asyncio.timeout(timeout):
            wake = await self._listener.subscribe(channel)
        try:
            await self._watch(watch.WATCH, run_id)  # after LISTEN, before the first read
            try:
                return await self._wait_subscribed(run_id, wake, timeout, through_waits)
            finally:
                await self._watch(watch.UNWATCH, run_id)
        finally:
            self._listener.unsubscribe(channel, wake)

    async def _watch(self, statement: str, run_id: UUID) -> None:
        """Register (or unregister) a watcher of the run (ledger/watch.py); an unregistration
        that fails leaves the run notifying."""
        try:
            async with self.engine.begin() as conn:
                await conn.exec_driver_sql(statement, {"run_id": run_id,
                                                       "tenant_id": self.actor.tenant_id})
        except (sa_exc.DBAPIError, psycopg.Error) as exc:
            if statement is watch.WATCH:
                raise LedgerUnavailable(f"cannot watch run {run_id}: {exc}") from exc

    async def _wait_subscribed(self, run_id: UUID, wake: asyncio.Event, timeout: float | None,
                               through_waits: bool) -> watch.RunOutcome:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            wake.clear()
            run = await self._require(run_id)
            if watch.stopped(run.status, through_waits=through_waits):
                return watch.RunOutcome.of(run)
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise WaitTimedOut(run_id, timeout or 0.0, run.status, run.seq)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), left)

    async def events(self, run_id: UUID, *, after_seq: int = 0,
                     timeout: float | None = None) -> AsyncIterator[watch.RunEvent]:
        """``Ledger.events`` as an async iterator."""
        channel = watch.run_channel(run_id)
        wake = await self._listener.subscribe(channel)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        progress = watch.RunWatch(run_id, after_seq=after_seq)
        try:
            async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True,
                                                             row_factory=dict_row) as conn:
                # the connection serves its one tenant
                await conn.execute(SET_TENANT, {"tenant": self.actor.tenant_id, "local": False})
                params = {"run_id": run_id, "tenant_id": self.actor.tenant_id}
                await conn.execute(watch.WATCH, params)  # after LISTEN, before the first read
                try:
                    async for event in self._follow(conn, run_id, wake, progress, deadline,
                                                    timeout):
                        yield event
                finally:
                    with contextlib.suppress(psycopg.Error):  # if it fails, it keeps notifying
                        await conn.execute(watch.UNWATCH, params)
        finally:
            self._listener.unsubscribe(channel, wake)

    async def _follow(self, conn: psycopg.AsyncConnection[dict[str, Any]], run_id: UUID,
                      wake: asyncio.Event, progress: watch.RunWatch, deadline: float | None,
                      timeout: float | None) -> AsyncIterator[watch.RunEvent]:
        loop = asyncio.get_running_loop()
        while True:
            wake.clear()
            run, steps = await self._read(conn, run_id, progress)
            for event in progress.changes(run, steps):
                yield event
            if run.status.terminal:
                return
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise WaitTimedOut(run_id, timeout or 0.0, run.status, run.seq)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), left)

    async def _read(self, conn: psycopg.AsyncConnection[dict[str, Any]], run_id: UUID,
                    progress: watch.RunWatch) -> tuple[run_ops.Run, list[dict[str, Any]]]:
        row = await (await conn.execute(watch.READ_RUN, {
            "run_id": run_id, "tenant_id": self.actor.tenant_id})).fetchone()
        if row is None:
            raise UnknownRun(f"no run {run_id} in this tenant")
        run = await self._shown_run(run_ops.Run.from_row(row))  # type: ignore[arg-type]
        steps: list[dict[str, Any]] = []
        if run.seq > progress.after_seq:
            steps = await (await conn.execute(watch.READ_STEPS, {
                "run_id": run_id, "after": progress.after_seq, "upto": run.seq})).fetchall()
        return run, steps

    # -- commands (role checked, audited: the same bodies as Ledger's) -----------------------
    async def _command(self, action: AuditAction, body: Callable[[Connection], T], *,
                       reason: str | None = None, run_id: UUID | None = None,
                       approval_id: UUID | None = None) -> T:
        try:
            self.actor.require(action)
            async with self.engine.begin() as conn:
                return await conn.run_sync(body)
        except REFUSALS as exc:
            refusal = AuditRecord(action, AuditOutcome.REFUSED, reason, run_id=run_id,
                                  approval_id=approval_id,
                                  details={"error": str(exc), "type": type(exc).__name__})
            async with self.engine.begin() as conn:
                await conn.run_sync(lambda c: record_txn(c, self.keys, self.actor, refusal))
            raise

    async def signal(self, run_id: UUID, name: str, payload: Any = None) -> bool:
        """Send a named signal; True when it woke the run now (``Ledger.signal``)."""
        def body(conn: Connection) -> bool:
            if run_ops.get_run(conn, run_id) is None:
                raise UnknownRun(f"no run {run_id}")
            woke = waits.signal_txn(conn, self.keys, run_id, name,
                                    payload if payload is not None else {},
                                    max_bytes=self.settings.max_signal_bytes,
                                    max_depth=self.settings.max_json_depth)
            record_txn(conn, self.keys, self.actor, AuditRecord(
                AuditAction.SIGNAL, AuditOutcome.DONE, run_id=run_id,
                details={"name": name, "woke": woke}))
            return woke

        await self._require(run_id)  # tenant scope
        return await self._command(AuditAction.SIGNAL, body, run_id=run_id)

    async def approve(self, approval_id: UUID, *, artifact_hash: str,
                      comment: str | None = None) -> waits.Approval:
        """``Ledger.approve``: decide on the hash of what the approver was shown."""
        return await self._decide(approval_id, True, artifact_hash, comment)

    async def reject(self, approval_id: UUID, *, artifact_hash: str,
                     comment: str | None = None) -> waits.Approval:
        return await self._decide(approval_id, False, artifact_hash, comment)

    async def _decide(self, approval_id: UUID, approve: bool, artifact_hash: str,
                      comment: str | None) -> waits.Approval:
        return await self._command(
            AuditAction.APPROVE if approve else AuditAction.REJECT,
            lambda c: operations.decide_approval_txn(c, self.keys, self.actor, approval_id,
                                                     approve=approve, artifact_hash=artifact_hash,
                                                     comment=comment),
            reason=comment, approval_id=approval_id)

    async def cancel(self, run_id: UUID, reason: str | None = None) -> operations.Cancelled:
        """Stop a non-terminal run; a step in flight cannot commit afterwards."""
        return await self._command(
            AuditAction.CANCEL, lambda c: operations.cancel_txn(c, self.keys, self.actor, run_id,
                                                              reason),
            reason=reason, run_id=run_id)
