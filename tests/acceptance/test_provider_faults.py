"""The reference provider misbehaving after it acted: a create that commits and then answers
500 or drops the connection, an answer slower than the step's lease, lookups and status
reads that answer 500 or time out. Real `celery worker` processes, a real dispatcher and
reaper, and the provider (a real HTTP service) counting what the outside world saw: one
object per effect, whatever it answered.

The provider forgets idempotency keys at once (``key_ttl_s=0``) in the tests of a create, so
a blind resend after a call that landed makes a second object: only a lookup by key (which
finds objects for as long as they exist) keeps it to one. A call's time limit is 2 s
(``ONWARD_TOOL_TIMEOUT_S``) and the lease 3 s, so a provider that holds an answer 5 s is
slower than both."""

from __future__ import annotations

from uuid import UUID

import pytest

from ledger import Ledger, RunStatus, operations
from ledger.effects import Effect
from ledger.vocabulary import EffectStatus, Role
from tests.support.cluster import Cluster, start_fleet, stopped
from tests.support.provider import Provider, provider_fixture

pytestmark = pytest.mark.acceptance

WORKFLOWS = "examples.sales"
FLEET = {"ONWARD_WORKFLOWS": WORKFLOWS, "ONWARD_TOOL_TIMEOUT_S": "2"}


provider = provider_fixture()


SLOWER_THAN_A_CALL_S = 5.0


def offer_run(ledger: Ledger) -> UUID:
    return ledger.start_run("sales_offer_agent", {"customer_id": "c-1", "amount": 1200,
                                                  "require_approval": False})


def the_offer(ledger: Ledger, run_id: UUID) -> Effect:
    return next(e for e in ledger.effects(run_id) if e.effect_type == "crm.create_offer")


def kinds(ledger: Ledger, effect: Effect) -> list[tuple[str, str | None]]:
    return [(a.kind, a.outcome) for a in ledger.effect_attempts(effect)]


def test_commit_then_500__reconciled_by_lookup_not_sent_again(
        ledger: Ledger, cluster: Cluster, provider: Provider) -> None:
    """Invariant: a create the provider committed and then answered 500 is an unknown
    outcome, not a refusal: the retry looks the key up, finds the object and records it
    (reconciled); nothing is sent again. One offer. (Before, the client raised a
    retryable ToolError, onward read it as "nothing happened" and sent again blind: a second
    offer at a provider that no longer remembered the key.)"""
    provider.configure(key_ttl_s=0)
    provider.arm("offers", commit_error_500=1)
    start_fleet(cluster, provider, **FLEET)
    run_id = offer_run(ledger)
    assert stopped(ledger, run_id) is RunStatus.COMPLETED, ledger.get_run(run_id).last_error
    stats = provider.stats()
    assert stats["committed_errors_500"] == 1
    assert stats["by_collection"] == {"offers": 1, "emails": 1}
    assert stats["duplicate_objects"] == 0
    offer = the_offer(ledger, run_id)
    assert (offer.status, offer.reconciled) == (EffectStatus.COMPLETED, True)
    assert kinds(ledger, offer) == [("call", "unknown"), ("lookup", "found")]
    assert [o["id"] for o in provider.objects() if o["collection"] == "offers"] == [
        offer.provider_ref]


@pytest.mark.parametrize("fault", ["drop_response", "hold"])
def test_commit_then_no_answer__reconciled_by_lookup_not_sent_again(
        fault: str, ledger: Ledger, cluster: Cluster, provider: Provider,
        settings_env: dict[str, str]) -> None:
    """Invariant: a create the provider committed and then answered nobody (it dropped the
    connection; or it held the answer past the call's time limit and the step's lease) is
    an unknown outcome: the retry looks the key up and records the object. One offer.
    Pinning test: main already behaved (a dropped connection and a timeout were never
    read as refusals); the provider's faults existed, no test drove them with a lookup."""
    assert float(settings_env["ONWARD_LEASE_TTL_S"]) < SLOWER_THAN_A_CALL_S
    provider.configure(key_ttl_s=0)
    provider.arm("offers", **{fault: 1}, hold_s=SLOWER_THAN_A_CALL_S)
    start_fleet(cluster, provider, **FLEET)
    run_id = offer_run(ledger)
    assert stopped(ledger, run_id) is RunStatus.COMPLETED, ledger.get_run(run_id).last_error
    stats = provider.stats()
    assert stats["dropped_responses" if fault == "drop_response" else "held_responses"] == 1
    assert stats["by_collection"] == {"offers": 1, "emails": 1}
    offer = the_offer(ledger, run_id)
    assert (offer.status, offer.reconciled) == (EffectStatus.COMPLETED, True)
    assert kinds(ledger, offer) == [("call", "unknown"), ("lookup", "found")]


READ_FAULTS = {
    "lookup_error_500": {"lookup_error_500": 1},
    "lookup_slow": {"lookup_slow": 1, "lookup_slow_s": SLOWER_THAN_A_CALL_S},
}
READ_FAULT_COUNTERS = {"lookup_error_500": "lookup_errors_500",
                       "lookup_slow": "lookup_slow_requests"}


@pytest.mark.parametrize("fault", sorted(READ_FAULTS))
def test_lookup_fails_once__the_next_attempt_looks_again_and_finds(
        fault: str, ledger: Ledger, cluster: Cluster, provider: Provider) -> None:
    """Invariant: a lookup that answers 500 or times out decides nothing: the effect stays
    unknown, nothing is sent, and the step's next attempt looks again and finds the one
    object. Pinning test: main already read a failed lookup as deciding nothing."""
    provider.configure(key_ttl_s=0)
    provider.arm("offers", drop_response=1, **READ_FAULTS[fault])
    start_fleet(cluster, provider, **FLEET)
    run_id = offer_run(ledger)
    assert stopped(ledger, run_id) is RunStatus.COMPLETED, ledger.get_run(run_id).last_error
    stats = provider.stats()
    assert stats[READ_FAULT_COUNTERS[fault]] == 1
    assert stats["by_collection"] == {"offers": 1, "emails": 1}
    assert stats["requests"] == 2  # the offer once, the email once: nothing sent again
    offer = the_offer(ledger, run_id)
    assert kinds(ledger, offer) == [("call", "unknown"), ("lookup", "unknown"),
                                    ("lookup", "found")]


@pytest.mark.parametrize("fault", sorted(READ_FAULTS))
def test_lookup_never_answers__parks_then_a_person_resolves_it(
        fault: str, ledger: Ledger, cluster: Cluster, provider: Provider) -> None:
    """Invariant: when no lookup can decide (every one answers 500, or times out), the run
    is not failed and nothing is sent again: it parks ``effect_outcome_unknown`` naming the
    effect. A person who found the object records it (``onward effects resolve``'s
    ledger call), continues the run, and it completes with that object; one offer.
    Pinning test: main already parked (a failed lookup decides nothing)."""
    provider.configure(key_ttl_s=0)
    always = {name: (1000 if name != "lookup_slow_s" else value)
              for name, value in READ_FAULTS[fault].items()}
    provider.arm("offers", drop_response=1, **always)
    start_fleet(cluster, provider, **FLEET)
    run_id = offer_run(ledger)
    assert stopped(ledger, run_id) is RunStatus.NEEDS_REVIEW
    run = ledger.get_run(run_id)
    offer = the_offer(ledger, run_id)
    assert run.parked_reason == "effect_outcome_unknown"
    assert offer.effect_id[:16] in run.last_error["message"], run.last_error
    assert offer.status is EffectStatus.PENDING
    attempts = kinds(ledger, offer)
    assert attempts[0] == ("call", "unknown")
    assert attempts[1:] and set(attempts[1:]) == {("lookup", "unknown")}
    [created] = provider.objects()
    assert created["idempotency_key"] == offer.effect_id

    admin = ledger.acting_as("ada", Role.ADMIN)
    plan = operations.resolve_plan(offer, operations.Finding.COMPLETED, created["id"], created)
    admin.resolve_effect(offer.effect_type, offer.effect_id, "found it in the CRM", plan,
                         finding=operations.Finding.COMPLETED, provider_ref=created["id"],
                         result=created)
    operator = Ledger(ledger.engine, ledger.settings.model_copy(
        update={"workflows": WORKFLOWS.split(",")})).acting_as("olga", Role.OPERATOR)
    operator.continue_run(run_id, "the offer exists")
    assert stopped(ledger, run_id) is RunStatus.COMPLETED, ledger.get_run(run_id).last_error
    assert ledger.get_run(run_id).result["offer_id"] == created["id"]
    assert provider.stats()["by_collection"] == {"offers": 1, "emails": 1}


STATUS_FAULTS = {
    "status_error_500": {"status_error_500": 2},
    "status_slow": {"status_slow": 1, "status_slow_s": SLOWER_THAN_A_CALL_S},
}


@pytest.mark.parametrize("fault", sorted(STATUS_FAULTS))
def test_status_poll_fails__polled_again_later_then_completes(
        fault: str, ledger: Ledger, cluster: Cluster, provider: Provider) -> None:
    """Invariant: a status poll of an accepted job that answers 500 or times out decides
    nothing: the run waits (no worker held) and polls again; the job's completion is
    recorded once, nothing is sent again. One offer. Pinning test: main already behaved."""
    provider.configure(async_complete_s=1.0)
    provider.arm("offers", **STATUS_FAULTS[fault])
    start_fleet(cluster, provider, **FLEET)
    run_id = offer_run(ledger)
    assert stopped(ledger, run_id) is RunStatus.COMPLETED, ledger.get_run(run_id).last_error
    stats = provider.stats()
    assert stats["by_collection"] == {"offers": 1, "emails": 1}
    assert stats["requests"] == 2
    offer = the_offer(ledger, run_id)
    assert offer.status is EffectStatus.COMPLETED
    polls = [outcome for kind, outcome in kinds(ledger, offer) if kind == "status"]
    failed = STATUS_FAULTS[fault].get("status_error_500", 1)
    assert polls[:failed] == ["unknown"] * failed and polls[-1] == "completed", polls
