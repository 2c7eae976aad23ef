"""Fleet-wide limits and per-call retry policies (docs/limits.md), step by step against the
real ledger: the test driver executes steps in process; the model server is a real HTTP
service; other holders of a limit's slots are taken through the ledger's own functions,
standing for other workers of the fleet.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from console.cli import app
from console.http.pages import why_waiting
from ledger import Ledger
from ledger.limits import LimitStore, limit_states_txn
from ledger.vocabulary import ParkReason, Priority
from tasks.exceptions import ToolError
from tasks.executor import ReportKind
from tests import workflows_limits as flows
from tests.support.clock import set_on_store
from tests.support.driver import Driver, driver
from tests.support.model_server import ModelServer, model_server_in_thread

MODULES = ["tests.workflows_limits"]
KEY = "test-model"


@pytest.fixture()
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModelServer]:
    with model_server_in_thread(latency_ms=10) as server:
        monkeypatch.setenv("ONWARD_MODEL_URL", server.url)
        monkeypatch.setenv("ONWARD_TEST_MODEL_CONCURRENCY", "1")
        yield server


@pytest.fixture()
def steps(ledger: Ledger) -> Iterator[Driver]:
    flows.PLAN.clear()
    flows.CALLS.clear()
    with driver(ledger, MODULES) as running:
        yield running
    flows.PLAN.clear()
    flows.CALLS.clear()


def _row(ledger: Ledger, sql: str, **params: Any) -> Any:
    with ledger.engine.connect() as conn:
        return conn.execute(sa.text(sql), params).mappings().first()


def _due_in_s(steps: Driver, run_id: UUID) -> float:
    """When the run's outbox row is due, by the driver's clock (which tests move)."""
    row = steps.store.conn.one("SELECT extract(epoch FROM due_at - onward.now()) AS s FROM "
                               "onward.outbox WHERE run_id = %(id)s", {"id": run_id})
    assert row is not None
    return float(row["s"])


def _hold(limits: LimitStore, ledger: Ledger, run_id: UUID, *, hold_s: float = 60.0,
          rank: int = Priority.NORMAL.rank) -> bool:
    """Take a slot of the test limit for ``run_id``, as another worker's call would."""
    return limits.acquire(KEY, KEY, concurrency=1, rate=None, run_id=run_id, seq=0,
                          command_id="other#1", epoch=0, rank=rank, hold_s=hold_s,
                          wait_s=5.0).granted


def test_limits__a_step_that_finds_the_limit_full_waits_without_a_lease_and_is_woken(
        ledger: Ledger, steps: Driver, model: ModelServer) -> None:
    """Invariant: a call is never made beyond its limit; the step that cannot get a slot
    gives its lease back without spending an attempt, waits in the limit's queue, and is
    woken (its outbox row made due) when the slot is given back.

    Given another call holding the only slot of ``test-model``, if run B's step runs, expect
    no request at the model server, B waiting (``limit:test-model``, no lease, attempt
    not spent); once the holder gives the slot back, B's outbox row is due now, and B
    completes with its own slot given back."""
    limits = LimitStore(steps.store.conn)
    holder = ledger.start_run("test_plain", {"topic": "holder"})
    assert _hold(limits, ledger, holder)
    b = ledger.start_run("test_limited", {"topic": "b"})

    report = steps.step(b, 0)

    assert report.kind is ReportKind.WAITING
    assert model.stats()["requests"] == 0
    run = ledger.get_run(b)
    assert run is not None and run.waiting_on == f"limit:{KEY}"
    assert f"waits for a slot of the fleet-wide limit '{KEY}'" in str(why_waiting(ledger, run))
    assert run.lease_expires_at is None and run.attempt == 0 and run.attempts_total == 0
    assert _due_in_s(steps, b) > 1.0  # not before it is woken (or polls)
    with ledger.engine.connect() as conn:
        [state] = limit_states_txn(conn)
    assert (state.in_use, state.waiting, state.throttled) == (1, 1, 1)

    woken = limits.release(KEY, run_id=holder, command_id="other#1", epoch=0)

    assert woken == 1 and _due_in_s(steps, b) <= 0
    run = steps.drive(b)
    assert run.status == "completed"
    assert model.stats()["requests"] == 1
    with ledger.engine.connect() as conn:
        [state] = limit_states_txn(conn)
    assert (state.in_use, state.waiting, state.granted) == (0, 0, 2)


def test_limits__a_slot_whose_holder_died_frees_itself_when_its_cover_runs_out(
        ledger: Ledger, steps: Driver, model: ModelServer) -> None:
    """Invariant: a slot held by a worker that died (it never gives it back) stops counting
    once the time its lease covered the call is over. Given a slot held for 30 s by a
    holder that never releases, B waits; 31 s later (the ledger's clock) B gets the slot."""
    limits = LimitStore(steps.store.conn)
    holder = ledger.start_run("test_plain", {"topic": "dead holder"})
    assert _hold(limits, ledger, holder, hold_s=30.0)
    b = ledger.start_run("test_limited", {"topic": "b"})
    assert steps.step(b, 0).kind is ReportKind.WAITING

    set_on_store(steps.store, timedelta(seconds=31))
    run = steps.drive(b)

    assert run.status == "completed" and model.stats()["requests"] == 1


def test_limits__waiters_are_served_by_priority_then_in_order(
        ledger: Ledger, steps: Driver, model: ModelServer) -> None:
    """Invariant: FIFO per limit, higher priority first. Given the slot held, normal runs
    N1 then N2 and then high run H wait; each release wakes one: H first, then N1, then N2;
    a waiter asking before its turn (N2 while N1 waits) is refused again."""
    limits = LimitStore(steps.store.conn)
    holder = ledger.start_run("test_plain", {"topic": "holder"})
    assert _hold(limits, ledger, holder)
    n1 = ledger.start_run("test_limited", {"topic": "n1"})
    n2 = ledger.start_run("test_limited", {"topic": "n2"})
    h = ledger.start_run("test_limited", {"topic": "h"}, priority=Priority.HIGH)
    for run_id in (n1, n2, h):
        assert steps.step(run_id, 0).kind is ReportKind.WAITING

    limits.release(KEY, run_id=holder, command_id="other#1", epoch=0)
    assert [_due_in_s(steps, r) <= 0 for r in (n1, n2, h)] == [False, False, True]
    set_on_store(steps.store, timedelta(seconds=6))  # N2's own poll is due
    assert steps.step(n2, 0).kind is ReportKind.WAITING  # not its turn: H, N1 come first
    assert steps.drive(h).status == "completed"  # its release wakes N1
    assert [_due_in_s(steps, r) <= 0 for r in (n1, n2)] == [True, False]
    assert steps.drive(n1).status == "completed"
    assert steps.drive(n2).status == "completed"
    assert model.stats()["requests"] == 3


def test_retry__a_429_defers_the_step_for_retry_after_without_spending_an_attempt(
        ledger: Ledger, steps: Driver) -> None:
    """A model call answered 429 with Retry-After: 2 is retried by the client's policy:
    the step is deferred for at least 2 s (longer than the policy's backoff), gives its
    lease back and spends no attempt; its failure is counted; the retry completes."""
    flows.PLAN.append(flows.Refusal(429, retry_after="2"))
    run_id = ledger.start_run("test_flaky_model", {"topic": "quota"})

    assert steps.step(run_id, 0).kind is ReportKind.WAITING

    run = ledger.get_run(run_id)
    assert run is not None and run.waiting_on == "retry:think@0#1"
    assert run.attempt == 0 and run.lease_expires_at is None
    deferred = _row(ledger, "SELECT extract(epoch FROM o.due_at - r.updated_at) AS s FROM "
                    "onward.outbox o JOIN onward.runs r ON r.id = o.run_id "
                    "WHERE r.id = :id", id=run_id)
    assert float(deferred["s"]) == pytest.approx(2.0, abs=0.01)  # by the deferring statement
    counted = _row(ledger, "SELECT failures, last_error FROM onward.call_retries")
    assert counted["failures"] == 1 and counted["last_error"]["failure"] == "rate_limited"
    set_on_store(steps.store, timedelta(seconds=3))
    assert steps.drive(run_id).status == "completed"
    assert flows.CALLS == ["model", "model"]


def test_retry__a_call_whose_attempts_are_spent_fails_the_step(
        ledger: Ledger, steps: Driver) -> None:
    """The policy allows 3 calls: after three 503s the error reaches the step, which fails
    (a step retry); a 4xx is never retried by the policy."""
    flows.PLAN.extend([flows.Refusal(503), flows.Refusal(503), flows.Refusal(503),
                       flows.Refusal(400)])
    run_id = ledger.start_run("test_flaky_model", {"topic": "down"})
    kinds = []
    for _ in range(4):
        set_on_store(steps.store, timedelta(seconds=len(kinds)))
        kinds.append(steps.step(run_id, 0).kind)

    assert kinds == [ReportKind.WAITING, ReportKind.WAITING, ReportKind.RETRY,
                     ReportKind.RETRY]
    assert flows.CALLS == ["model"] * 4
    assert steps.drive(run_id).status == "completed"


def test_retry__an_irreversible_write_is_never_retried_blindly(
        ledger: Ledger, steps: Driver) -> None:
    """Invariant: an irreversible call whose outcome is unknown (a timeout) is not sent
    again by its policy: with no lookup, the run is parked for a person, and the provider
    saw one call. A 429 (refused before acting) is retried, once, and completes."""
    flows.PLAN.append(TimeoutError("read timed out"))
    run_id = ledger.start_run("test_flaky_effect", {"topic": "wire"})

    run = steps.drive(run_id)

    assert run.status == "needs_review"
    assert run.parked_reason == ParkReason.EFFECT_OUTCOME_UNKNOWN
    assert flows.CALLS == ["send"]

    flows.CALLS.clear()
    flows.PLAN.append(ToolError("slow down", retryable=True, status_code=429,
                                retry_after_s=0.0))
    second = ledger.start_run("test_flaky_effect", {"topic": "mail"})
    assert steps.step(second, 0).kind is ReportKind.WAITING
    set_on_store(steps.store, timedelta(seconds=2))  # the class's backoff (1 s at most)
    assert steps.drive(second).status == "completed"
    assert flows.CALLS == ["send", "send"]


def test_retry__an_idempotent_write_that_timed_out_is_resent_under_the_same_key(
        ledger: Ledger, steps: Driver) -> None:
    """An idempotent write's timeout is retried by its policy (deferred, no attempt spent):
    the provider dedupes by key, so the resend is safe; it completes."""
    flows.PLAN.append(TimeoutError("read timed out"))
    run_id = ledger.start_run("test_flaky_effect", {"topic": "sync", "tool": "idempotent"})

    assert steps.step(run_id, 0).kind is ReportKind.WAITING
    set_on_store(steps.store, timedelta(seconds=1))
    run = steps.drive(run_id)

    assert run.status == "completed" and run.attempts_total == 1
    assert flows.CALLS == ["send", "send"]


def test_limits__the_cli_shows_each_limit_and_starts_runs_by_priority(
        ledger: Ledger, steps: Driver, model: ModelServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``onward limits --json`` shows the limit's declared concurrency, the slot in use and
    the run waiting for it; ``onward start --priority high`` starts a high-priority run."""
    monkeypatch.setenv("ONWARD_AUTH", "off")
    limits = LimitStore(steps.store.conn)
    assert _hold(limits, ledger, ledger.start_run("test_plain", {"topic": "holder"}))
    started = CliRunner().invoke(app, ["start", "test_limited", "--input", '{"topic": "cli"}',
                                       "--priority", "high"])
    assert started.exit_code == 0, started.output
    run_id = UUID(started.stdout.strip())
    assert steps.step(run_id, 0).kind is ReportKind.WAITING

    shown = CliRunner().invoke(app, ["limits", "--json"])

    assert shown.exit_code == 0, shown.output
    [state] = json.loads(shown.stdout)["limits"]
    assert (state["key"], state["concurrency"], state["in_use"], state["waiting"]) == (
        KEY, 1, 1, 1)
    run = ledger.get_run(run_id)
    assert run is not None and run.priority is Priority.HIGH
    table = CliRunner().invoke(app, ["limits"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "1/1" in table.output, table.output
