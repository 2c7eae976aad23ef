"""The moving parts the model-based test drives: a clock, two workers, a broker, a dispatcher.

Everything here is the real thing except the broker (an in-memory list of messages, so
the test decides which message is delivered to which worker, duplicated or lost) and the
process boundary (a worker is a thread with its own ledger connection; a ``Crash`` raised in
it is a SIGKILL: the thread ends, nothing in onward catches it, and the worker comes back
with a new connection and a new id).

Only one thread runs at a time: the test's thread waits while a worker thread executes, and
a worker thread stops (``suspend``) only inside a provider call told to hang, until the
test resumes it. Interleavings are therefore exactly the ones hypothesis chooses.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from sqlalchemy.engine import Engine

import ledger.db
import ledger.outbox
import ledger.steps
import tasks.clock
import tasks.executor
import tasks.scope
from ledger import schema
from ledger.checkpoints import CheckpointKeys
from ledger.fleet import FleetStore
from ledger.outbox import OutboxMessage, OutboxStore
from ledger.steps import Claim, StepStore, error_record
from tasks import faults
from tasks.executor import ExecutorConfig, StepMessage, StepReport, execute_step
from tasks.routing import worker_queues
from tasks.workflow import Registry
from tests.model.world import Crash, crash, current_runner, set_current_runner, still_alive
from tests.support import clock as test_clock

LEASE_TTL_S = 30.0
OUTBOX_GRACE_S = 10.0
OUTBOX_REPUBLISH_S = 5.0
OUTBOX_REPUBLISH_MAX_S = 60.0
STALL_AFTER_S = 60.0
THREAD_PATIENCE_S = 60.0  # a worker thread that neither finishes nor suspends is stuck
# the database's time when the clock's offset is 0 (mid-month: months_pass crosses months)
EPOCH = datetime(2026, 1, 14, 12, 0, tzinfo=UTC)


# -- the clock -------------------------------------------------------------------------------
class Clock:
    """The only time there is: ``onward.now()`` is ``EPOCH`` plus ``offset`` (``freeze``),
    and a worker's own clocks (a step's ``ctx.now()``, the countdown of its lease) run on
    ``offset`` too (``install``). Real seconds never count: an example that ran slowly (a
    busy machine) must do exactly what it did when it ran fast, or hypothesis cannot replay
    it (``FlakyStrategyDefinition``: a precondition, or a bundle, came out otherwise).

    Moves ``onward.now()`` on every connection the test and the code under test use:
    raw psycopg connections (dispatcher, the test's reads) as they are opened and whenever
    time moves, engine connections at checkout, and a worker's hot connection (a pool of
    one) before its first statement after time moved (``version`` counts the moves)."""

    def __init__(self) -> None:
        self.box = [timedelta(0)]
        self.version = 0
        self.on_advance: list[Callable[[float], None]] = []  # called with the new offset (s)
        self._raw: list[psycopg.Connection[Any]] = []
        self._original = ledger.db.connect_raw

    @property
    def offset(self) -> timedelta:
        return self.box[0]

    def seconds(self) -> float:
        """The model's time in seconds: what a worker's monotonic clocks read."""
        return self.offset.total_seconds()

    def now(self) -> datetime:
        """What ``onward.now()`` answers on a frozen database."""
        return EPOCH + self.offset

    def _set(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute("SELECT set_config(%s, %s, false)",
                     (test_clock.SETTING, test_clock.interval(self.offset)))
        if not conn.autocommit:
            conn.commit()  # a session setting made in a transaction rolls back with it

    def connect_raw(self, url: str, *, autocommit: bool = True) -> psycopg.Connection[Any]:
        conn = self._original(url, autocommit=autocommit)
        self._set(conn)
        self._raw = [c for c in self._raw if not c.closed] + [conn]
        return conn

    def install(self, monkeypatch: Any) -> None:
        """Route the ledger's raw connections through this clock, and run a step's clock
        (``StepClock``: the claim's time plus the time since) and a lease's countdown
        (``lease_clock``) on the model's seconds (for one test)."""
        monkeypatch.setattr(ledger.outbox, "connect_raw", self.connect_raw)
        monkeypatch.setattr(tasks.clock, "time", _ModelTime(self))
        monkeypatch.setattr(tasks.executor, "StepClock", self._step_clock)
        for module in (ledger.steps, tasks.scope):
            monkeypatch.setattr(module, "lease_clock", self.seconds)

    def _step_clock(self, claimed_at: datetime) -> tasks.clock.StepClock:
        return tasks.clock.StepClock(claimed_at, self.seconds())

    def freeze(self, engine: Engine) -> None:
        """Stop the real clock of ``engine``'s database (the test's own): ``onward.now()``
        is ``EPOCH`` plus the offset from now on."""
        test_clock.freeze(engine, EPOCH)

    def setting(self) -> dict[str, Any]:
        """The statement that moves a connection's clock, for ``HotConnection.one``."""
        return {"sql": "SELECT set_config(%(name)s, %(value)s, false)",
                "params": {"name": test_clock.SETTING,
                           "value": test_clock.interval(self.offset)}}

    def follow(self, engine: Engine) -> None:
        test_clock.follow_engine(engine, self.box)

    def reset(self) -> None:
        self.box[0] = timedelta(0)
        self.advance(0)

    def advance(self, seconds: float) -> None:
        self.version += 1
        self.box[0] = self.offset + timedelta(seconds=seconds)
        self._raw = [c for c in self._raw if not c.closed]
        for conn in self._raw:
            self._set(conn)
        for hook in self.on_advance:
            hook(self.offset.total_seconds())


@dataclass(frozen=True)
class _ModelTime:
    """``time`` as tasks/clock.py reads it: its monotonic clock is the model's."""

    clock: Clock

    def monotonic(self) -> float:
        return self.clock.seconds()


# -- crashes ---------------------------------------------------------------------------------
@dataclass
class Crashes:
    """Where the next crash happens: at a named fault point, or after the k-th ledger
    statement of the next delivery (a SIGKILL between any two statements)."""

    point: str | None = None
    after_statement: int | None = None
    # a fault point where the next delivery's worker stops (a SIGSTOP, a long pause) until the
    # test resumes it: on (``act_*``/``no_act_answer``/``*_lose``) or killed (``*_crash``)
    stall: str | None = None

    def fault_point(self, name: str, step: str | None = None) -> None:
        still_alive()
        if self.point == name:
            self.point = None
            raise crash(f"killed at fault point {name}")
        if self.stall == name:
            self.stall = None
            runner = current_runner()
            if runner is not None and runner.suspend(f"fault point {name}").endswith("crash"):
                raise crash(f"killed while stopped at fault point {name}")

    def clear(self) -> None:
        """No crash or stall armed."""
        self.point = self.after_statement = self.stall = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[Crashes]:
        original = faults.point
        faults.point = self.fault_point
        try:
            yield self
        finally:
            faults.point = original


class CrashingConnection:
    """The worker's hot connection (a pool of one connection), on the test's clock, counting
    statements so a crash can follow any one."""

    def __init__(self, inner: Any, worker: Worker, clock: Clock) -> None:
        self._inner = inner
        self._worker = worker
        self._clock = clock
        self._clock_version = -1

    def _before(self) -> None:
        still_alive()
        if self._clock_version != self._clock.version:
            setting = self._clock.setting()
            self._inner.one(setting["sql"], setting["params"])
            self._clock_version = self._clock.version

    def _after(self) -> None:
        crashes = self._worker.crashes
        self._worker.statements += 1
        if crashes.after_statement is not None \
                and self._worker.statements >= crashes.after_statement:
            crashes.after_statement = None
            raise crash(f"killed after ledger statement {self._worker.statements}")

    def one(self, sql: str, params: dict[str, Any], **options: Any) -> dict[str, Any] | None:
        self._before()
        row = self._inner.one(sql, params, **options)
        self._after()
        return row  # type: ignore[no-any-return]

    def all(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        self._before()
        rows = self._inner.all(sql, params)
        self._after()
        return rows  # type: ignore[no-any-return]

    def close(self) -> None:
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


# -- the broker ------------------------------------------------------------------------------
@dataclass
class Broker:
    """Messages ``(run_id, seq)`` published and not yet delivered (duplicates allowed)."""

    messages: list[tuple[UUID, int]] = field(default_factory=list)

    def publish(self, run_id: UUID, seq: int, *_: Any) -> None:
        self.messages.append((run_id, seq))

    def take(self, pick: int, keep: bool) -> tuple[UUID, int]:
        index = pick % len(self.messages)
        message = self.messages[index]
        if not keep:
            del self.messages[index]
        return message


# -- workers ---------------------------------------------------------------------------------
@dataclass
class Delivery:
    """How one delivery to a worker ended (``suspended`` until it is resumed)."""

    state: str  # done, crashed, error, suspended
    reports: list[StepReport] = field(default_factory=list)
    error: BaseException | None = None
    where: str = ""


class Worker:
    """One worker process: a ledger connection, a registry (its deployed code), a thread."""

    def __init__(self, index: int, url: str, keys: CheckpointKeys, config: ExecutorConfig,
                 registry: Registry, broker: Broker, crashes: Crashes, clock: Clock) -> None:
        self.index = index
        self.generation = 0
        self._url, self._keys, self.config = url, keys, config
        self.registry = registry
        self.broker = broker
        self.crashes = crashes
        self.clock = clock
        self.statements = 0
        self.killed = False  # crashed in this delivery: no further call (world.crash)
        self.run_id: UUID | None = None
        self._cond = threading.Condition()
        self._state = "idle"  # idle, running, suspended, finished
        self._resume: str | None = None
        self._delivery = Delivery("done")
        self._thread: threading.Thread | None = None
        self.suspended_at = ""
        self.store = self._new_store()
        self.advertise()

    @property
    def name(self) -> str:
        return f"worker{self.index}:{self.generation}"

    @property
    def idle(self) -> bool:
        return self._state == "idle"

    @property
    def suspended(self) -> bool:
        return self._state == "suspended"

    def _new_store(self) -> StepStore:
        store = StepStore(self._url, self._keys, lease_ttl_s=LEASE_TTL_S)
        store.conn = CrashingConnection(store.conn, self, self.clock)  # type: ignore[assignment]
        return store

    def use_keys(self, keys: CheckpointKeys, config: ExecutorConfig) -> None:
        """Restart with other keys (encryption keys configured, or not)."""
        self._keys, self.config = keys, config
        self.restart()

    def restart(self) -> None:
        """The process is gone; a new one starts with a new connection and a new id."""
        self.store.close()
        self.generation += 1
        self.store = self._new_store()
        self.advertise()

    def advertise(self) -> None:
        """What a starting worker tells the ledger (workers/app.py ``start_advertising``):
        the workflow versions it runs and their state models (``start_run`` checks them)."""
        queues = []
        for queue, workflow, version in worker_queues(self.config.queue, self.registry):
            code = self.registry.get(workflow, version or None)
            start = code.start.name if code is not None and code.start is not None else None
            queues.append((queue, workflow, version, start))
        schemas = {(w.name, w.version): w.state.model_json_schema() for w in self.registry.all()}
        FleetStore(self._url).advertise(None, queues, schemas)

    # -- the test's side --------------------------------------------------------------------
    def deliver(self, message: tuple[UUID, int], eager: int) -> Delivery:
        if not self.idle:
            raise RuntimeError(f"{self.name} is busy")
        self.statements = 0
        self.killed = False
        self._delivery = Delivery("running")
        self._state = "running"
        self._thread = threading.Thread(target=self._main, args=(message, eager),
                                        name=self.name, daemon=True)
        self._thread.start()
        return self._wait()

    def resume(self, action: str) -> Delivery:
        if not self.suspended:
            raise RuntimeError(f"{self.name} is not suspended")
        with self._cond:
            self._resume = action
            self._state = "running"
            self._cond.notify_all()
        return self._wait()

    def _wait(self) -> Delivery:
        with self._cond:
            if not self._cond.wait_for(lambda: self._state in ("suspended", "finished"),
                                       timeout=THREAD_PATIENCE_S):
                raise RuntimeError(f"{self.name} neither finished nor suspended in "
                                   f"{THREAD_PATIENCE_S}s (blocked in the database?)")
            if self._state == "suspended":
                return Delivery("suspended", list(self._delivery.reports),
                                where=self.suspended_at)
        assert self._thread is not None
        self._thread.join()
        self._state = "idle"
        delivery = self._delivery
        if delivery.state == "crashed":
            self.restart()
        return delivery

    # -- the worker thread's side -----------------------------------------------------------
    def suspend(self, where: str) -> str:
        """Called in the worker thread: stop here until the test says how to go on."""
        with self._cond:
            self.suspended_at = where
            self._resume = None
            self._state = "suspended"
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._resume is not None)
            action = self._resume
        assert action is not None
        return action

    def _main(self, message: tuple[UUID, int], eager: int) -> None:
        set_current_runner(self)
        try:
            self._deliver(message, eager)
            self._delivery.state = "done"
        except Crash as exc:
            self._delivery.state, self._delivery.error = "crashed", exc
        except BaseException as exc:
            self._delivery.state, self._delivery.error = "error", exc
        finally:
            set_current_runner(None)
            with self._cond:
                self._state = "finished"
                self._cond.notify_all()

    def _deliver(self, first: tuple[UUID, int], eager: int) -> None:
        """What ``workers.runtime.WorkerRuntime.handle`` does with one message: execute it,
        then (eager continuation) up to ``eager`` next steps of the run, then publish."""
        message = StepMessage(run_id=first[0], seq=first[1])
        follow: list[tuple[UUID, int, str]] = []
        delivered = False
        claimed: Claim | None = None  # the next step, claimed by the previous commit
        while True:
            follow.clear()
            self.run_id = message.run_id
            try:
                report = execute_step(self.store, self.registry, self.config, message,
                                      worker=self.name, publish=lambda *m: follow.append(m),
                                      count_stale=not delivered, chain=(eager > 0).__bool__,
                                      claimed=claimed)
            except Exception as exc:
                if claimed is not None:  # as WorkerRuntime._give_back: the lease goes back
                    self.store.release(claimed, error_record(type(exc).__name__, str(exc)))
                if delivered:
                    self.broker.publish(message.run_id, message.seq)
                raise
            self._delivery.reports.append(report)
            delivered = True
            claimed = report.next_claim
            if claimed is not None:
                eager -= 1
                message = StepMessage(run_id=claimed.run_id, seq=claimed.seq)
                continue
            if not follow:
                return
            run_id, seq, _queue = follow[0]
            if eager <= 0:
                self.broker.publish(run_id, seq)
                return
            eager -= 1
            message = StepMessage(run_id=run_id, seq=seq)


# -- the dispatcher --------------------------------------------------------------------------
class Dispatcher:
    """``OutboxStore.sweep`` publishing into the in-memory broker; it can die after
    publishing and before marking (``dispatcher_after_publish_before_mark``)."""

    def __init__(self, url: str, broker: Broker, rank: Callable[[UUID], int]) -> None:
        self._url = url
        self.broker = broker
        self._rank = rank
        self.store = self._new_store()

    def _new_store(self) -> OutboxStore:
        return OutboxStore(self._url, grace_s=OUTBOX_GRACE_S, republish_s=OUTBOX_REPUBLISH_S,
                           republish_max_s=OUTBOX_REPUBLISH_MAX_S)

    def sweep(self, crash_before_mark: bool) -> int:
        """One sweep; the batch enters the broker in a fixed order (rows due at the same
        instant come back from the ledger in any order, and hypothesis needs every example
        to replay the same way)."""
        batch: list[tuple[UUID, int]] = []

        def publish(message: OutboxMessage) -> None:
            batch.append((message.run_id, message.seq))

        def after_publish() -> None:
            self._publish(batch)
            if crash_before_mark:
                raise Crash("dispatcher killed after publishing, before marking")

        try:
            return self.store.sweep(publish, after_publish=after_publish)
        except Crash:
            self.store.close()
            self.store = self._new_store()
            return 0

    def _publish(self, batch: list[tuple[UUID, int]]) -> None:
        for run_id, seq in sorted(batch, key=lambda m: (self._rank(m[0]), m[1])):
            self.broker.publish(run_id, seq)

    def close(self) -> None:
        self.store.close()


def empty_ledger(engine: Engine) -> None:
    """Delete every row of every onward table, children first (cheaper than TRUNCATE for the
    few rows one example writes)."""
    with engine.begin() as conn:
        for table in reversed(schema.metadata.sorted_tables):
            conn.execute(table.delete())


Resume = Callable[[str], Delivery]
