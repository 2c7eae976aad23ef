"""Operator commands with real processes: a dispatcher, a reaper and celery workers run the
replays and branches; the reference provider (a real HTTP service) and the fake model's
call log count what the outside world saw."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import pytest

from ledger import Ledger, RunStatus
from ledger.exceptions import InvalidInput, OperationRefused, PermissionDenied
from ledger.vocabulary import EffectStatus
from tasks.operator import plan_repeat, repeat_effect
from tests.support.cluster import Cluster, start_fleet, stopped, wait_for
from tests.support.provider import Provider, running_provider

pytestmark = pytest.mark.acceptance

WORKFLOWS = "examples.sales,tests.workflows_effects,tests.workflows_ops"


# One provider and one fleet serve the whole module (starting workers costs seconds); each
# test resets the provider and asserts on its own runs and on differences in the counts.
@pytest.fixture(scope="module")
def module_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    with running_provider(tmp_path_factory.mktemp("provider")) as running:
        yield running


@pytest.fixture(scope="module")
def model_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model") / "llm-calls.log"


@pytest.fixture(scope="module")
def env(module_provider: Provider, model_log: Path) -> dict[str, str]:
    return {"ONWARD_WORKFLOWS": WORKFLOWS, "ONWARD_EXAMPLE_PROVIDER_URL": module_provider.url,
            "ONWARD_FAKE_LLM_LOG": str(model_log)}


@pytest.fixture()
def settings_env(module_env: dict[str, str]) -> dict[str, str]:
    return module_env


@pytest.fixture(scope="module")
def fleet(module_cluster: Cluster, module_provider: Provider, env: dict[str, str]) -> Cluster:
    start_fleet(module_cluster, module_provider, **env)
    return module_cluster


@pytest.fixture()
def provider(module_provider: Provider, fleet: Cluster, shared_cluster: Cluster,
             env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Provider:
    module_provider.http.post("/admin/reset").raise_for_status()
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # the test process repeats effects itself
    return module_provider


@pytest.fixture()
def ops(ledger: Ledger) -> Ledger:
    configured = Ledger(ledger.engine,
                        ledger.settings.model_copy(update={"workflows": WORKFLOWS.split(",")}))
    return configured.acting_as("olga", "operator")


def model_calls(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def sales_run(ledger: Ledger, **state: object) -> UUID:
    return ledger.start_run("sales_offer_agent", {"customer_id": "c-7", "amount": 1200,
                                                  "require_approval": False, **state})


def test_replay_evidence__finished_sales_run_calls_nothing(
        ops: Ledger, provider: Provider, model_log: Path) -> None:
    """Invariant: an evidence replay of a finished sales-offer run makes zero requests at the
    provider and zero model calls, and ends in the same final state and result."""
    parent = sales_run(ops)
    assert stopped(ops, parent) is RunStatus.COMPLETED
    before = (provider.stats()["requests"], model_calls(model_log))
    assert before[0] == 2
    launched = ops.replay(parent, 0, "evidence", "what did the agent do?")
    assert stopped(ops, launched.run_id) is RunStatus.COMPLETED
    assert (provider.stats()["requests"], model_calls(model_log)) == before
    replay = ops.get_run(launched.run_id)
    assert replay.result == ops.get_run(parent).result
    assert ops.checkpoints(replay.id)[-1].state == ops.checkpoints(parent)[-1].state
    assert ops.effects(replay.id) == []


def test_replay_evidence__follows_the_recorded_approval(
        ops: Ledger, provider: Provider, model_log: Path) -> None:
    """Invariant: an evidence replay of an approved run reuses the parent's decision for the
    same seq: no new approval, no call, same result."""
    parent = sales_run(ops, require_approval=True)
    approval = wait_for(lambda: ops.approvals(run_id=parent), timeout=60,
                        what="the offer approval")[0]
    ops.acting_as("sam", "approver", ("sales_lead",)).approve(
        approval.id, artifact_hash=approval.artifact_hash)
    assert stopped(ops, parent) is RunStatus.COMPLETED
    before = (provider.stats()["requests"], model_calls(model_log))
    replay = ops.replay(parent, 0, "evidence", "check the approved path").run_id
    assert stopped(ops, replay) is RunStatus.COMPLETED
    assert ops.approvals(run_id=replay) == []
    assert (provider.stats()["requests"], model_calls(model_log)) == before
    assert ops.get_run(replay).result == ops.get_run(parent).result


def test_replay_live__irreversible_blocked_unless_allowed_and_branch(
        ops: Ledger, provider: Provider) -> None:
    """Invariant: a live replay refuses the irreversible CRM call unless allowed; a branch
    with a patched amount sends its own offer; the parent's records never change."""
    parent = sales_run(ops)
    assert stopped(ops, parent) is RunStatus.COMPLETED
    parent_effects = ops.effects(parent)
    blocked = ops.replay(parent, 0, "live", "re-run live").run_id
    assert stopped(ops, blocked) is RunStatus.FAILED
    assert ops.get_run(blocked).last_error["reason"] == "irreversible_blocked"
    assert provider.stats()["by_collection"] == {"offers": 1, "emails": 1}
    allowed = ops.replay(parent, 0, "live", "send again", allow_irreversible=True).run_id
    assert stopped(ops, allowed) is RunStatus.COMPLETED
    assert provider.stats()["by_collection"] == {"offers": 2, "emails": 2}
    with pytest.raises(InvalidInput, match="needs a reason"):
        ops.branch(parent, 2, [{"op": "replace", "path": "/amount", "value": 1500}], None)
    branch = ops.branch(parent, 2, [{"op": "replace", "path": "/amount", "value": 1500}],
                        "the customer was promised 1500", allow_irreversible=True).run_id
    assert stopped(ops, branch) is RunStatus.COMPLETED
    amounts = sorted(o["body"]["amount"] for o in provider.objects()
                     if o["collection"] == "offers")
    assert amounts == [1200, 1200, 1500]
    assert provider.stats()["duplicate_objects"] == 0
    assert ops.effects(parent) == parent_effects
    assert ops.get_run(parent).status is RunStatus.COMPLETED


def test_continue__after_a_provider_outage(
        ops: Ledger, provider: Provider) -> None:
    """Invariant: a run that gave up during a provider outage (every call refused with a
    429, which the provider answers before it acts: nothing landed) closes its effect
    ``unsent`` in the statement that fails it; continued at the same seq, the step sends it
    once with the same key, no lookup needed; one object. (A 500 to a create would not do:
    the provider may have committed before it failed, so each is looked up.)"""
    provider.arm("poisoned", error_429=3)
    run_id = ops.start_run("test_effect_poison", {})
    assert stopped(ops, run_id) is RunStatus.FAILED
    assert ops.effects(run_id)[0].status is EffectStatus.UNSENT
    with pytest.raises(OperationRefused, match="evidence replay"):
        ops.continue_run(ops.replay(run_id, 0, "evidence", "look").run_id, "go")
    ops.continue_run(run_id, "provider is back")
    assert stopped(ops, run_id) is RunStatus.COMPLETED
    assert provider.stats()["by_collection"] == {"poisoned": 1}
    kinds = [a.kind for a in ops.effect_attempts(ops.effects(run_id)[0])]
    assert kinds == ["call", "call", "call", "call"]
    with pytest.raises(OperationRefused, match="completed"):
        ops.continue_run(run_id, "once more")


def test_repeat_effect__admin_only_one_new_provider_object(
        ops: Ledger, provider: Provider) -> None:
    """Invariant: repeating an effect needs the admin role; it sends once more under a new
    recorded key, so the provider creates exactly one new object; one audit row each."""
    parent = sales_run(ops)
    assert stopped(ops, parent) is RunStatus.COMPLETED
    offer = next(e for e in ops.effects(parent) if e.effect_type == "crm.create_offer")
    plan = plan_repeat(ops, offer)
    assert (plan.dedup, plan.as_dict()["recipient"]) == ("lookup", "c-7")
    with pytest.raises(PermissionDenied, match="admin"):
        repeat_effect(ops, plan, "customer lost the offer")
    admin = ops.acting_as("ada", "admin")
    done = repeat_effect(admin, plan_repeat(admin, offer), "customer lost the offer")
    assert done.outcome == "completed"
    stats = provider.stats()
    assert stats["by_collection"] == {"offers": 2, "emails": 1}
    assert stats["duplicate_objects"] == 0
    keys = {o["idempotency_key"] for o in provider.objects() if o["collection"] == "offers"}
    assert keys == {offer.effect_id, done.started.idempotency_key}
    rows = [(a.actor, a.outcome) for a in reversed(ops.audit(action="repeat_effect"))
            if a.effect_id == offer.effect_id]
    assert rows == [("olga", "refused"), ("ada", "done")]
