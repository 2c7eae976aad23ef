"""An async step's keyless effect calls, one cancelled in the step's queue, with its worker
SIGKILLed mid-step: real ``onward worker`` processes, a dispatcher and a reaper, and the
reference provider (examples/provider.py), which counts the objects made
(tests/workflows_async_kill.py has the step; docs/steps.md, "Async steps"). The
in-process tests of the numbering (tests/integration/test_async_cancel_refusal.py) fail an
attempt with an exception; here the process dies, with one call's answer held by the
provider, so the retry runs in another process and reconciles that call."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from uuid import UUID

import pytest

from ledger import Ledger
from ledger.vocabulary import Role
from tests.support import reads
from tests.support.cluster import Cluster, Proc, wait_for
from tests.support.provider import Provider, provider_fixture
from tests.workflows_async_kill import COLLECTION, CUSTOMERS

pytestmark = pytest.mark.acceptance

provider = provider_fixture()


def _made(provider: Provider) -> int:
    return int(provider.stats()["by_collection"].get(COLLECTION, 0))


def _fleet(cluster: Cluster, provider: Provider) -> tuple[dict[str, str], Proc]:
    """A dispatcher, a reaper and worker-a (threads) for the steps of
    tests/workflows_async_kill.py; the environment a second worker takes."""
    env = {"ONWARD_WORKFLOWS": "tests.workflows_async_kill",
           "ONWARD_EXAMPLE_PROVIDER_URL": provider.url}
    cluster.dispatcher(env=env)
    cluster.reaper(env=env)
    return env, cluster.worker(concurrency=2, pool="threads", env=env, name="worker-a")


def _kill_when_made(ledger: Ledger, provider: Provider, run_id: UUID, worker: Proc,
                    count: int) -> None:
    """Once the provider has made ``count`` objects (the last one's answer held), SIGKILL
    the worker process holding the run's lease, and wait until it is gone."""
    wait_for(lambda: _made(provider) == count, timeout=60, what=f"{count} objects made",
             seen=lambda: (provider.stats(), worker.tail()))
    owner = reads.run_row(ledger.engine, run_id)["lease_owner"]
    pid = int(owner.rsplit(":", 1)[1])
    assert pid in worker.step_pids(), (owner, worker.step_pids())
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not worker.alive(), timeout=30, what="the worker to die")


def test_async_step__keyless_calls_cancelled_and_killed_mid_step_are_each_made_once(
        ledger: Ledger, cluster: Cluster, provider: Provider, tmp_path: Path) -> None:
    """Invariant (resume, never repeat): an async step hands three keyless effect calls
    to create_task (#1 first, #2 second, #3 third). Attempt 1 cancels ``second`` while it
    is queued behind ``first`` (held by the provider), sends ``third``, and its worker is
    SIGKILLed while the provider holds ``third``'s answer (made, its effect pending). A
    second worker resumes the step: ``first``'s answer comes back from the ledger, ``third``
    is found by a lookup, ``second`` is sent: the provider holds exactly one object per
    intended call, each given back to the call that asked for it, and the run completes.
    (Numbered as the step's thread took them, ``third`` was #2 on attempt 1 and the
    retry's ``second`` met its record: the run parked ``effect_conflict``.)"""
    env, first = _fleet(cluster, provider)
    provider.arm(COLLECTION, hold=2, hold_s=4)  # first's and third's answers come late
    run_id = ledger.start_run("test_async_kill_fan", {})

    _kill_when_made(ledger, provider, run_id, first, 2)

    ops = ledger.acting_as("olga", Role.OPERATOR)
    assert [(e.command_id, e.status, e.payload) for e in ops.effects(run_id)] == [
        ("send_three@0#1", "completed", {"customer": "first"}),
        ("send_three@0#3", "pending", {"customer": "third"})]
    assert reads.run_row(ledger.engine, run_id)["seq"] == 0  # the step did not commit

    cluster.worker(concurrency=2, pool="threads", env=env, name="worker-b")
    row = reads.wait_run(ledger.engine, run_id, timeout=120, what="the run to end",
                         until=lambda r: r["status"] != "running")
    assert (row["status"], row["parked_reason"]) == ("completed", None), row["last_error"]

    objects = [o for o in provider.objects() if o["collection"] == COLLECTION]
    assert sorted(o["body"]["customer"] for o in objects) == sorted(CUSTOMERS)
    assert provider.stats()["duplicate_objects"] == 0
    by_customer = {o["body"]["customer"]: o["id"] for o in objects}
    assert row["result"]["ids"] == by_customer
    effects = sorted(ops.effects(run_id), key=lambda e: e.command_id)
    assert [(e.command_id, e.status, e.payload, e.provider_ref) for e in effects] == [
        (f"send_three@0#{n}", "completed", {"customer": name}, by_customer[name])
        for n, name in enumerate(CUSTOMERS, start=1)]
    assert [[a.kind for a in ops.effect_attempts(e)] for e in effects] == [
        ["call"], ["call"], ["call", "lookup"]]
    assert reads.committed_per_seq(ledger.engine, run_id) == {0: 1}
    tried = reads.attempts(ledger.engine, run_id)
    assert (tried[0]["attempt"], tried[0]["outcome"]) == (1, "worker_lost"), tried
    assert tried[-1]["outcome"] == "committed", tried
    assert ops.verify_run(run_id) == []


def test_async_step__a_swallowed_refusal_after_a_killed_call_does_not_commit(
        ledger: Ledger, cluster: Cluster, provider: Provider) -> None:
    """Invariant: a refusal the body swallowed does not become a commit, on a retry after
    a SIGKILL either. The step awaits one keyless effect itself (#1), then gathers two
    keyless calls made in helper tasks with ``return_exceptions=True`` and finishes.
    Attempt 1's worker is SIGKILLed while the provider holds #1's answer; the retry finds
    #1 by lookup (one object), its helper calls are refused and nothing of them is sent,
    and the run fails with the refusal at seq 0 (no commit), #1 ``completed``. (Before
    05f975a the swallowed refusal let the step commit: the run completed with #1 only.)"""
    env, first = _fleet(cluster, provider)
    provider.arm(COLLECTION, hold=1, hold_s=4)
    run_id = ledger.start_run("test_async_kill_swallow", {})
    _kill_when_made(ledger, provider, run_id, first, 1)

    cluster.worker(concurrency=2, pool="threads", env=env, name="worker-b")
    row = reads.wait_run(ledger.engine, run_id, timeout=120, what="the run to end",
                         until=lambda r: r["status"] != "running")
    assert (row["status"], row["seq"], (row["last_error"] or {}).get("type")) == (
        "failed", 0, "OutcomeError"), row
    assert "without key= in a task the async step started" in row["last_error"]["message"]
    assert reads.committed_per_seq(ledger.engine, run_id) == {}
    ops = ledger.acting_as("olga", Role.OPERATOR)
    [effect] = ops.effects(run_id)
    assert (effect.command_id, effect.status, effect.reconciled) == (
        "send_then_swallow@0#1", "completed", True)
    assert [o["body"] for o in provider.objects()] == [{"customer": "first"}]
    assert provider.stats()["duplicate_objects"] == 0
    assert [(a["attempt"], a["outcome"]) for a in reads.attempts(ledger.engine, run_id)] == [
        (1, "worker_lost"), (2, "failed")]
    assert ops.verify_run(run_id) == []
