"""A provider call never outlives its lease, and a cancel stops a step without abandoning an
effect: real `celery worker` processes, a real reaper and dispatcher, and the reference
provider (a real HTTP service) counting what the outside world saw."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from ledger import Ledger, RunStatus
from ledger.vocabulary import EffectStatus, Role
from tests.support.cluster import Cluster, start_fleet, stopped, wait_for
from tests.support.provider import Provider, provider_fixture

pytestmark = pytest.mark.acceptance

WORKFLOWS = "tests.workflows_outcomes"


provider = provider_fixture()


def test_slow_call__lease_covers_the_call_so_no_second_worker_sends_again(
        ledger: Ledger, cluster: Cluster, provider: Provider,
        settings_env: dict[str, str]) -> None:
    """Invariant: a provider call slower than the lease TTL (the provider holds the request
    4.5 s; ONWARD_LEASE_TTL_S is 3 s) does not lead to two provider objects: the statement
    that began the call extended the lease over the tool's timeout (10 s), so the second
    worker never finds the lease expired while the call is in flight. The provider forgets
    keys after 0.5 s, so a second send would have made a second object."""
    assert settings_env["ONWARD_LEASE_TTL_S"] == "3"
    provider.configure(slow_s=4.5, key_ttl_s=0.5)
    start_fleet(cluster, provider, ONWARD_WORKFLOWS=WORKFLOWS)
    run_id = ledger.start_run("test_outcome_slow_send", {})
    assert stopped(ledger, run_id) is RunStatus.COMPLETED
    [effect] = ledger.effects(run_id)
    wait_for(lambda: all(a.ended_at for a in ledger.effect_attempts(effect)), timeout=60,
             what="every call of the effect to end", seen=lambda: ledger.effect_attempts(effect))
    stats = provider.stats()
    assert stats["by_collection"] == {"slow_offers": 1}
    assert stats["requests"] == 1
    assert ledger.effects(run_id)[0].status is EffectStatus.COMPLETED
    assert [a.kind for a in ledger.effect_attempts(effect)] == ["call"]
    assert [a.outcome for a in ledger.timeline(run_id)] == ["committed"]


def test_cancel__a_step_in_flight_stops_paying_and_sends_nothing(
        ledger: Ledger, cluster: Cluster, provider: Provider, tmp_path: Path) -> None:
    """Invariant: cancelling a run while a real worker runs its step stops that step at its
    next call: no more model calls are paid (at most the one in flight), the offer the step
    would have sent never reaches the provider, and the worker ends the run ``cancelled``
    (its attempt ``cancelled``)."""
    calls = tmp_path / "llm-calls.log"
    start_fleet(cluster, provider, ONWARD_WORKFLOWS=WORKFLOWS, ONWARD_FAKE_LLM_LOG=str(calls))

    def paid() -> int:
        return len(calls.read_text().splitlines()) if calls.exists() else 0

    run_id = ledger.start_run("test_outcome_talker", {"talks": 40})
    wait_for(lambda: paid() >= 2, timeout=60, what="the step to pay the model twice")
    cancelled = ledger.acting_as("olga", Role.OPERATOR).cancel(run_id, "customer withdrew")
    at_cancel = paid()
    assert cancelled.requested is True and cancelled.was_leased_by is not None
    assert stopped(ledger, run_id) is RunStatus.CANCELLED
    wait_for(lambda: all(a.outcome for a in ledger.timeline(run_id)), timeout=60,
             what="the step's attempt to end", seen=lambda: ledger.timeline(run_id))
    # on a loaded machine the first attempt may have lost its lease before the cancel (the
    # next one took over the step): whichever attempt held the step ends it cancelled
    *earlier, last = [a.outcome for a in ledger.timeline(run_id)]
    assert last == "cancelled" and set(earlier) <= {"lease_lost"}, earlier
    assert paid() <= at_cancel + 1 < 40
    assert provider.stats().get("requests", 0) == 0
    assert ledger.effects(run_id) == []
    with ledger.engine.connect() as conn:
        outbox = conn.execute(sa.text("SELECT count(*) FROM onward.outbox WHERE run_id = :id"),
                              {"id": run_id}).scalar_one()
    assert outbox == 0
