"""The application client: waiting on a run without polling (LISTEN/NOTIFY), its events as
they happen, the asyncio client, and start_run's refusals from what workers advertise.

Steps are executed in-process by the test driver (real executor, real ledger) from a
second thread while the client waits, so each wake-up comes from a real commit's NOTIFY.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

import psycopg
import pytest
import sqlalchemy as sa

from ledger import Ledger, watch
from ledger.client import AsyncLedger
from ledger.db import database_url, libpq_conninfo
from ledger.exceptions import InvalidInput, UnknownWorkflow, WaitTimedOut
from ledger.fleet import FleetStore
from ledger.watch import EventKind
from tasks.routing import worker_queues
from tasks.workflow import Registry
from tests.support import reads
from tests.support.driver import Driver, driver
from workers.settings import WorkerSettings

MODULES = ["tests.workflows", "tests.workflows_waits"]


@pytest.fixture()
def steps(ledger: Ledger) -> Iterator[Driver]:
    with driver(ledger, MODULES) as running:
        yield running


def later(delay_s: float, action: Callable[[], Any]) -> threading.Thread:
    """Run ``action`` in a thread after ``delay_s`` (the worker side of the test)."""
    def body() -> None:
        time.sleep(delay_s)
        action()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def test_client__wait_returns_the_result_when_the_run_completes(ledger: Ledger,
                                                                steps: Driver) -> None:
    """wait() blocks while the run is running and returns the completed run's result as
    soon as the last commit's NOTIFY arrives (well within the 10 s timeout, not after it)."""
    run_id = ledger.start_run("test_chain", {"steps": 3})
    worker = later(0.3, lambda: steps.drive(run_id))
    began = time.monotonic()

    outcome = ledger.wait(run_id, timeout=10)

    assert time.monotonic() - began < 5
    worker.join()
    assert (outcome.status, outcome.done, outcome.seq) == ("completed", True, 3)
    assert outcome.result == {"done": 3}


def test_client__wait_returns_a_stop_that_needs_a_person(ledger: Ledger,
                                                         steps: Driver) -> None:
    """A run that stops for an approval is returned as waiting (what it waits on named);
    with through_waits=True wait() goes on past it and times out instead."""
    run_id = ledger.start_run("test_review", {"doc": "offer"})
    later(0.2, lambda: steps.drive(run_id))

    outcome = ledger.wait(run_id, timeout=10)

    assert (outcome.status, outcome.done) == ("waiting", False)
    assert outcome.waiting_on is not None and "approval" in outcome.waiting_on
    with pytest.raises(WaitTimedOut) as timed_out:
        ledger.wait(run_id, timeout=0.3, through_waits=True)
    assert timed_out.value.status == "waiting"


def test_client__wait_times_out_on_a_run_that_does_not_move(ledger: Ledger) -> None:
    """No step runs: wait() raises WaitTimedOut after its timeout, naming the run's state."""
    run_id = ledger.start_run("test_chain", {"steps": 2})
    began = time.monotonic()
    with pytest.raises(WaitTimedOut, match="running at seq 0"):
        ledger.wait(run_id, timeout=0.5)
    assert 0.5 <= time.monotonic() - began < 5


def test_client__events_yield_each_commit_and_the_final_status(ledger: Ledger,
                                                               steps: Driver) -> None:
    """events() yields one step_committed per checkpoint, in seq order, then completed;
    the iterator ends by itself at the final status."""
    run_id = ledger.start_run("test_chain", {"steps": 3})
    later(0.2, lambda: steps.drive(run_id))

    seen = list(ledger.events(run_id, timeout=10))

    assert [(e.kind, e.seq) for e in seen] == [
        (EventKind.STEP_COMMITTED, 1), (EventKind.STEP_COMMITTED, 2),
        (EventKind.STEP_COMMITTED, 3), (EventKind.COMPLETED, 3)]
    assert {e.step for e in seen[:3]} == {"tick"}
    assert seen[-1].detail["result"]["done"] == 3


def _notified(conn: psycopg.Connection[Any], ledger: Ledger, channel: str) -> list[str]:
    """The channels ``conn`` (LISTENing on ``channel`` and ``fence``) was notified on until
    the fence: a NOTIFY committed after everything before it, so nothing earlier is missed."""
    conn.execute("LISTEN fence")
    with psycopg.connect(libpq_conninfo(ledger.url), autocommit=True) as other:
        other.execute("NOTIFY fence")
    seen = []
    for notify in conn.notifies(timeout=30):
        if notify.channel == "fence":
            return seen
        seen.append(notify.channel)
    raise AssertionError(f"the fence notification never came (saw {seen})")


def test_client__only_watched_runs_notify_their_progress(ledger: Ledger,
                                                         steps: Driver) -> None:
    """A NOTIFY serializes its commit with every other notifying commit of the server, so a
    step commit sends one only while someone waits on the run (migration 0031): none while
    nobody watches, one per commit while wait()/events() watch, none again afterwards."""
    run_id = ledger.start_run("test_chain", {"steps": 4})
    channel = watch.run_channel(run_id)
    with psycopg.connect(libpq_conninfo(ledger.url), autocommit=True) as listener:
        listener.execute(f"LISTEN {channel}")
        steps.step(run_id, 0)
        assert _notified(listener, ledger, channel) == []

        watcher = watch.BlockingWatcher(ledger.url, run_id, ledger.actor.tenant_id)
        steps.step(run_id, 1)
        assert _notified(listener, ledger, channel) == [channel]
        watcher.close()

        steps.step(run_id, 2)
        assert _notified(listener, ledger, channel) == []
    with ledger.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT watchers FROM onward.runs WHERE id = :id"),
                            {"id": run_id}).scalar_one() == 0


def test_client__async_client_starts_waits_streams_signals_and_cancels(
        settings: WorkerSettings, ledger: Ledger, steps: Driver) -> None:
    """One AsyncLedger (one LISTEN connection) serves several waits at once: three runs
    started through it complete and each wait returns its own result; events() streams a
    signal run to 'waiting', signal() wakes it, and cancel() ends another run, whose
    waiter returns 'cancelled'."""
    async def scenario() -> None:
        async with AsyncLedger(settings) as client:
            chains = [await client.start("test_chain", {"steps": n}) for n in (1, 2, 3)]
            waits = [asyncio.create_task(client.wait(run_id, timeout=20)) for run_id in chains]
            await asyncio.sleep(0.3)
            await asyncio.to_thread(lambda: [steps.drive(r) for r in chains])
            outcomes = await asyncio.gather(*waits)
            assert [o.result["done"] for o in outcomes] == [1, 2, 3]  # type: ignore[index]

            signalled = await client.start("test_signal", {})
            first = asyncio.create_task(asyncio.to_thread(steps.drive, signalled))
            kinds: list[EventKind] = []
            async for event in client.events(signalled, timeout=20):
                kinds.append(event.kind)
                if event.kind is EventKind.WAITING:
                    await first
                    assert await client.signal(signalled, "go", {"ok": True})
                    await asyncio.to_thread(steps.drive, signalled)
            # Resumed-then-completed happened while this loop was busy: a status the run
            # passed through between two reads is not reported; every commit is.
            assert kinds == [EventKind.STEP_COMMITTED, EventKind.WAITING,
                             EventKind.STEP_COMMITTED, EventKind.COMPLETED]

            doomed = await client.start("test_chain", {"steps": 5})
            waiter = asyncio.create_task(client.wait(doomed, timeout=20))
            await asyncio.sleep(0.3)
            await client.cancel(doomed, "no longer needed")
            assert (await waiter).status == "cancelled"
            assert (await client.get(doomed)).status == "cancelled"  # type: ignore[union-attr]

        with pytest.raises(WaitTimedOut):
            async with AsyncLedger(settings) as client:
                await client.wait(await client.start("test_chain", {}), timeout=0.3)

    # its own thread: a browser test (pytest-playwright's sync API) run earlier by the same
    # xdist worker leaves an event loop running in the main thread
    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, scenario()).result()
    assert reads.run_row(ledger.engine, ledger_run_of(ledger, "test_signal"))["status"] \
        == "completed"


def ledger_run_of(ledger: Ledger, workflow: str) -> UUID:
    [run] = [r for r in ledger.list_runs() if r.workflow == workflow]
    return run.id


def _advertise(settings: WorkerSettings) -> None:
    """What a worker importing MODULES advertises when it starts (workers/app.py)."""
    registry = Registry()
    registry.load_modules(MODULES)
    schemas = {(w.name, w.version): w.state.model_json_schema() for w in registry.all()}
    queues = [(queue, workflow, version, None)
              for queue, workflow, version in worker_queues(settings.queue, registry)]
    FleetStore(database_url(settings)).advertise(None, queues, schemas)


@pytest.fixture()
def checked(settings: WorkerSettings) -> Ledger:
    """A ledger that checks starts against what workers advertise (the default outside
    the test suite, which turns it off for tests that start runs with no worker)."""
    return Ledger.from_env(settings.model_copy(update={"start_unadvertised": False}))


def test_client__start_refuses_unknown_workflows_and_bad_input(checked: Ledger,
                                                               settings: WorkerSettings) -> None:
    """Before any worker advertised, every name is unknown; after one advertised
    tests.workflows, a typo is refused listing the known workflows, an input the state
    model rejects is refused naming the field, and nothing was written for either.
    allow_unadvertised=True starts a workflow no worker has yet."""
    with pytest.raises(UnknownWorkflow, match=r"known workflows: \(none yet\)"):
        checked.start_run("test_chain", {})
    _advertise(settings)

    with pytest.raises(UnknownWorkflow) as typo:
        checked.start_run("test_chian", {"steps": 2})
    assert "test_chain" in str(typo.value) and "allow_unadvertised=True" in str(typo.value)
    with pytest.raises(InvalidInput, match="steps: 'two' is not of type 'integer'"):
        checked.start_run("test_chain", {"steps": "two"})
    assert checked.list_runs() == []

    assert checked.start_run("test_chain", {"steps": 2}) is not None
    early = checked.start_run("brand_new_flow", {}, allow_unadvertised=True)
    assert checked.get_run(early) is not None


def test_client__start_run_txn_on_a_psycopg_connection(ledger: Ledger) -> None:
    """start_run_txn on a plain psycopg connection joins the caller's transaction: rolled
    back, no run exists; committed, the run, checkpoint 0 and its outbox row exist; the
    same idempotency key returns the same run."""
    with psycopg.connect(libpq_conninfo(ledger.url)) as conn:
        ghost = ledger.start_run_txn(conn, "test_chain", {"steps": 1})
        conn.rollback()
        kept = ledger.start_run_txn(conn, "test_chain", {"steps": 1}, idempotency_key="k1")
        again = ledger.start_run_txn(conn, "test_chain", {"steps": 1}, idempotency_key="k1")
        conn.commit()

    assert ledger.get_run(ghost) is None
    assert again == kept
    assert reads.checkpoint_seqs(ledger.engine, kept) == [0]
    assert [r["seq"] for r in reads.outbox_rows(ledger.engine, kept)] == [0]
