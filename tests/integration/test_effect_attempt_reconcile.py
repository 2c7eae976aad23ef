"""A call whose outcome is unknown is looked up before anything is sent again, even when
its attempt is edited in SQL without the key (docs/guarantees.md, integrity): counted at the
reference provider (examples/provider.py, in a thread of the test process) with its
idempotency window closed (``key_ttl_s`` 0), so a resend under the same key creates a second
object, as a provider whose window passed would. Steps run in the test process against a
real PostgreSQL (tests/support/driver.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import pytest

from harness.waiting import wait_for
from ledger import Ledger, RunStatus
from tasks import faults
from tests.support import reads
from tests.support.driver import Driver, driver_fixture
from tests.support.provider import Provider, provider_in_thread

drv = driver_fixture(["tests.workflows_effects"])

_OPEN_CALL = ("FROM onward.effects e WHERE e.run_id = :r AND a.effect_type = e.effect_type "
              "AND a.effect_id = e.effect_id AND a.kind = 'call' AND a.outcome IS NULL")
EDITS = {
    "none": None,
    # the open call made to look like a lookup that was under way: no call left to reconcile
    "kind_lookup": f"UPDATE onward.effect_attempts a SET kind = 'lookup' {_OPEN_CALL}",
    "kind_status": f"UPDATE onward.effect_attempts a SET kind = 'status' {_OPEN_CALL}",
    # the open call made to look refused by the provider (its MAC cannot be made)
    "outcome_failed": (f"UPDATE onward.effect_attempts a SET outcome = 'failed', "
                       f"ended_at = now() {_OPEN_CALL}"),
}


@pytest.fixture()
def provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Provider]:
    with provider_in_thread(tmp_path) as running:
        monkeypatch.setenv("ONWARD_EXAMPLE_PROVIDER_URL", running.url)
        running.configure(key_ttl_s=0)  # no provider-side dedupe: a resend is a duplicate
        yield running


@pytest.fixture()
def answer_lost(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The act step fails once right after the provider answered, before the answer is
    recorded: its call attempt stays open (the outcome is unknown)."""
    monkeypatch.setenv("ONWARD_FAULTS", "after_provider_response@act:raise:once")
    faults.arm_from_env()
    yield
    monkeypatch.delenv("ONWARD_FAULTS")
    faults.arm_from_env()


@pytest.mark.parametrize("case", sorted(EDITS))
def test_effect_attempts__an_unknown_call_is_looked_up_not_sent_again(
        drv: Driver, ledger: Ledger, provider: Provider, answer_lost: None,
        case: str) -> None:
    """Invariant: the provider holds one object for the effect whatever was edited: an
    unedited or re-kinded open call attempt is reconciled by lookup (found, the run
    completes with it), and an attempt whose outcome was forged parks the run `integrity`
    before anything is sent."""
    run_id = ledger.start_run("test_effect_chain", {"steps": 1})
    drv.step(run_id, 0)
    assert provider.stats()["created"] == 1
    edit = EDITS[case]
    if edit is not None:
        assert reads.execute(ledger.engine, edit, r=run_id) == 1

    run = drv.drive(run_id)

    assert provider.stats()["created"] == 1  # never sent a second time
    if case == "outcome_failed":
        assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity")
    else:
        assert run.status is RunStatus.COMPLETED


@pytest.mark.parametrize("edited", [False, True])
def test_effect_attempts__an_accepted_effect_is_polled_at_its_own_reference_only(
        drv: Driver, ledger: Ledger, provider: Provider, edited: bool) -> None:
    """Invariant: an effect the provider accepted is completed only with what the provider
    says about the job it accepted: its provider reference edited in SQL to another object
    (one the attacker made, completed, with a body of their choosing) parks the run
    `integrity` before any poll, and the effect is not recorded with the other object;
    unedited, the job's own completion completes it."""
    from examples import provider_client

    provider.configure(async_complete_s=60 if edited else 0.3)
    run_id = ledger.start_run("test_effect_chain", {"steps": 1})
    drv.step(run_id, 0)
    [effect] = ledger.effects(run_id)
    assert effect.status.value == "accepted" and effect.provider_ref is not None
    if edited:
        provider.configure(async_complete_s=0)
        other = provider_client.create("chained", {"n": 0, "run": "mallory"}, "mallory-key")
        assert reads.execute(ledger.engine, "UPDATE onward.effects SET provider_ref = :ref "
                             "WHERE run_id = :r", ref=other.provider_ref, r=run_id) == 1
    else:
        wait_for(lambda: all(o["status"] == "completed" for o in provider.objects()),
                 timeout=10, what="the provider completing the accepted job")

    # the status poll is deferred (the step's wait): a claim before it is due is stale
    wait_for(lambda: _polled(drv, ledger, run_id), timeout=10, what="the deferred poll")
    run = drv.drive(run_id)

    [after] = ledger.effects(run_id)
    if not edited:
        assert run.status is RunStatus.COMPLETED
        assert (after.status.value, after.provider_ref) == ("completed", effect.provider_ref)
        assert ledger.verify_run(run_id) == []
        return
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity")
    assert after.status.value == "accepted"  # not completed with the other object
    assert {p.kind for p in ledger.verify_run(run_id)} >= {"effect"}


def _polled(drv: Driver, ledger: Ledger, run_id: UUID) -> bool:
    """Step the run once; whether that claim was taken (not stale: the poll was due)."""
    before = ledger.get_run(run_id)
    assert before is not None
    drv.step(run_id, before.seq)
    after = ledger.get_run(run_id)
    assert after is not None
    return after.stale_deliveries == before.stale_deliveries
