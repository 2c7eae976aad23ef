"""The reference provider misbehaving after it acted: a create that commits and then answers
500 or drops the connection, an answer slower than the step's lease, lookups and status
reads that answer 500 or time out. Real `celery worker` processes, a real dispatcher and
reaper, and the provider (a real HTTP service) counting what the outside world saw: one
object per effect, whatever it answered.

The provider forgets idempotency keys at once (``key_ttl_s=0``) in the tests of a create, so
a blind resend after a call that landed makes a second object: only a lookup by key (which
finds objects for as long as they exist) keeps it to one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import pytest

from ledger import Ledger, RunStatus
from ledger.effects import Effect
from ledger.vocabulary import EffectStatus
from tests.support.cluster import Cluster, wait_for
from tests.support.provider import Provider, running_provider

pytestmark = pytest.mark.acceptance

WORKFLOWS = "examples.sales"


@pytest.fixture()
def provider(tmp_path: Path) -> Iterator[Provider]:
    with running_provider(tmp_path) as running:
        yield running


def start_fleet(cluster: Cluster, provider: Provider, **env: str) -> None:
    shared = {"ONWARD_WORKFLOWS": WORKFLOWS, "ONWARD_EXAMPLE_PROVIDER_URL": provider.url,
              **env}
    cluster.dispatcher(env=shared)
    cluster.reaper(env=shared)
    cluster.worker(concurrency=2, env=shared)


def stopped(ledger: Ledger, run_id: UUID, timeout: float = 90) -> RunStatus:
    def status() -> RunStatus | None:
        run = ledger.get_run(run_id)
        return run.status if run and run.status is not RunStatus.RUNNING else None

    return wait_for(status, timeout=timeout, what=f"run {run_id} to stop running",
                    seen=lambda: ledger.get_run(run_id))


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
    start_fleet(cluster, provider)
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
