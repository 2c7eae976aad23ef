"""Effects under crashes: a real worker is SIGKILLed at each named point of the protocol, and
the reference provider (a real HTTP service) counts what the outside world saw."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

import pytest

from ledger import Ledger, RunStatus
from ledger.effects import Effect
from ledger.vocabulary import EffectStatus
from tests.support.cluster import Cluster, stopped, wait_for
from tests.support.messages import redis_list
from tests.support.provider import Provider, provider_fixture

pytestmark = pytest.mark.acceptance

WORKFLOWS = "examples.sales,tests.workflows_effects"


provider = provider_fixture()


def start_fleet(cluster: Cluster, provider: Provider, faults: str = "",
                dispatcher_faults: str = "", worker_env: dict[str, str] | None = None) -> None:
    env = {"ONWARD_WORKFLOWS": WORKFLOWS, "ONWARD_EXAMPLE_PROVIDER_URL": provider.url}
    cluster.dispatcher(env={**env, "ONWARD_FAULTS": dispatcher_faults})
    cluster.reaper(env=env)
    cluster.worker(concurrency=2, env={**env, "ONWARD_FAULTS": faults, **(worker_env or {})})


def offer_run(ledger: Ledger, customer: str = "c-1") -> UUID:
    return ledger.start_run("sales_offer_agent", {"customer_id": customer, "amount": 1200,
                                                  "require_approval": False})


def assert_reconciled_once(ledger: Ledger, effect: Effect) -> None:
    """The effect was sent once and its answer lost; a lookup by its key found the object:
    it is ``completed`` and reconciled, and its attempts are that one call (no outcome
    recorded) and one lookup that found it: nothing was sent again."""
    assert effect.status is EffectStatus.COMPLETED
    assert effect.reconciled is True
    assert [(a.kind, a.outcome) for a in ledger.effect_attempts(effect)] == [
        ("call", None), ("lookup", "found")]


@pytest.mark.parametrize("point", [
    "after_effect_pending@create",
    "after_provider_response@create",
    "after_effect_recorded@create",
    "before_checkpoint_commit@create",
    "after_commit_before_publish@create",
    "after_chained_commit@create",
])
def test_effect__worker_killed_at_point_creates_one_object(
        point: str, ledger: Ledger, cluster: Cluster, provider: Provider,
        settings_env: dict[str, str]) -> None:
    """Invariant: whatever instant the worker dies at, the CRM holds exactly one offer and
    the customer one email, both effects end `completed`, and the run finishes. (The worker
    publishes a next step only when it does not run it itself: that point is reached with
    eager continuation off; with it on, and a window wide enough for a busy machine, the
    commit claims the next step instead.)"""
    publishes = point.startswith("after_commit_before_publish")
    start_fleet(cluster, provider, faults=f"{point}:kill:once",
                worker_env={"ONWARD_EAGER_STEPS": "0"} if publishes
                else {"ONWARD_EAGER_WINDOW_MS": "600000"})
    run_id = offer_run(ledger)
    assert stopped(ledger, run_id) is RunStatus.COMPLETED
    stats = provider.stats()
    assert stats["by_collection"] == {"offers": 1, "emails": 1}
    assert stats["duplicate_objects"] == 0
    effects = ledger.effects(run_id)
    assert [e.status for e in effects] == [EffectStatus.COMPLETED, EffectStatus.COMPLETED]
    fired = list(Path(settings_env["ONWARD_FAULTS_DIR"]).glob("*.fired"))
    assert len(fired) == 1, "the worker was never killed at the fault point"


def test_effect__lost_response_is_reconciled_by_lookup(
        ledger: Ledger, cluster: Cluster, provider: Provider) -> None:
    """Invariant: when the provider acted but the worker died before recording it, the
    resumed step asks the provider by key and records what it finds: no second call."""
    start_fleet(cluster, provider, faults="after_provider_response@create:kill:once")
    run_id = offer_run(ledger)
    assert stopped(ledger, run_id) is RunStatus.COMPLETED
    assert_reconciled_once(ledger, ledger.effects(run_id)[0])
    assert provider.stats()["created"] == 2  # one offer, one email


def test_effect__dispatcher_killed_after_publish_duplicates_are_noops(
        ledger: Ledger, cluster: Cluster, provider: Provider,
        settings_env: dict[str, str]) -> None:
    """Invariant: a dispatcher dying between publish and mark leaves the row unmarked, so the
    next dispatcher publishes it again; the duplicate delivery is a stale no-op and the
    provider still sees one object per effect."""
    import redis

    env = {"ONWARD_WORKFLOWS": WORKFLOWS, "ONWARD_EXAMPLE_PROVIDER_URL": provider.url}
    queue = redis.Redis.from_url(settings_env["ONWARD_BROKER_URL"])
    first = cluster.dispatcher(
        env={**env, "ONWARD_FAULTS": "dispatcher_after_publish_before_mark:kill:once"})
    run_id = offer_run(ledger)
    wait_for(lambda: not first.alive(), timeout=30, what="the dispatcher to die after publish")
    cluster.dispatcher(env=env)
    normal = redis_list(settings_env["ONWARD_QUEUE"])  # a normal-priority run's messages
    wait_for(lambda: queue.llen(normal) == 2, timeout=30,
             what="the same step message to be in the queue twice",
             seen=lambda: queue.llen(normal))
    cluster.reaper(env=env)
    cluster.worker(concurrency=2, env=env)
    assert stopped(ledger, run_id) is RunStatus.COMPLETED
    # At least the dispatcher's duplicate; a loaded machine can add fast-path re-sends.
    assert ledger.get_run(run_id).stale_deliveries >= 1
    assert ledger.batch_stats([run_id]).duplicate_commits == 0
    assert provider.stats()["by_collection"] == {"offers": 1, "emails": 1}


def test_effect__key_reused_with_other_payload_parks_without_call(
        ledger: Ledger, cluster: Cluster, provider: Provider) -> None:
    """Invariant: a retried step that asks for the same effect with a different payload is
    refused before any call (EffectConflict) and the run is parked for review."""
    start_fleet(cluster, provider, faults="after_effect_pending@send_changing:kill:once")
    run_id = ledger.start_run("test_effect_conflict", {})
    assert stopped(ledger, run_id) is RunStatus.NEEDS_REVIEW
    run = ledger.get_run(run_id)
    assert run.parked_reason == "effect_conflict"
    assert "different payload" in run.last_error["message"]
    assert provider.stats().get("requests", 0) == 0


def test_effect__lost_response_without_lookup_parks(
        ledger: Ledger, cluster: Cluster, provider: Provider) -> None:
    """Invariant: if the response is lost and the tool can neither look up nor rely on the
    provider's dedupe, onward parks the run instead of guessing: one object, no resend."""
    provider.arm("blind", drop_response=1)
    start_fleet(cluster, provider)
    run_id = ledger.start_run("test_effect_no_lookup", {})
    assert stopped(ledger, run_id) is RunStatus.NEEDS_REVIEW
    assert ledger.get_run(run_id).parked_reason == "effect_outcome_unknown"
    stats = provider.stats()
    assert stats["by_collection"] == {"blind": 1}
    assert stats["requests"] == 1
    assert ledger.effects(run_id)[0].status is EffectStatus.PENDING


def test_effect__expired_provider_key_reconciled_by_lookup(
        ledger: Ledger, cluster: Cluster, provider: Provider) -> None:
    """Invariant: after the provider forgot the idempotency key (retention expired), a blind
    resend would duplicate; reconciliation by lookup still finds the one object."""
    provider.configure(key_ttl_s=0.2)
    start_fleet(cluster, provider, faults="after_provider_response@create:kill:once")
    run_id = offer_run(ledger)
    assert stopped(ledger, run_id) is RunStatus.COMPLETED
    stats = provider.stats()
    assert stats["by_collection"] == {"offers": 1, "emails": 1}
    assert stats["duplicate_objects"] == 0


def test_effect__poison_effect_does_not_loop(
        ledger: Ledger, cluster: Cluster, provider: Provider) -> None:
    """Invariant: a provider that always fails costs at most the step's attempt budget;
    the run fails with the error visible and nothing was created: the effect, never
    landed, is closed ``unsent`` with the run."""
    provider.arm("poisoned", error_500=1000)
    start_fleet(cluster, provider)
    run_id = ledger.start_run("test_effect_poison", {})
    assert stopped(ledger, run_id) is RunStatus.FAILED
    run = ledger.get_run(run_id)
    assert run.attempts_total == 3
    assert "500" in run.last_error["message"]
    assert provider.stats()["errors_500"] == 3
    assert provider.stats()["objects"] == 0
    assert ledger.effects(run_id)[0].status is EffectStatus.UNSENT


def test_effect__accepted_waits_without_worker_then_completes(
        ledger: Ledger, cluster: Cluster, provider: Provider) -> None:
    """Invariant: an effect the provider only accepted is not completed: the run waits with
    no lease, polls status through delayed outbox rows, and continues once it completes."""
    provider.configure(async_complete_s=1.5)
    start_fleet(cluster, provider)
    run_id = offer_run(ledger)
    waiting = wait_for(lambda: (r := ledger.get_run(run_id)).waiting_on and r, timeout=30,
                       what="the run to wait on the accepted offer")
    assert waiting.lease_owner is None
    assert stopped(ledger, run_id) is RunStatus.COMPLETED
    effects = ledger.effects(run_id)
    assert all(e.status is EffectStatus.COMPLETED for e in effects)
    assert effects[0].polls >= 1
    assert provider.stats()["by_collection"] == {"offers": 1, "emails": 1}


def test_evidence__reexecuted_step_reuses_recorded_model_answer(
        ledger: Ledger, cluster: Cluster, provider: Provider, tmp_path: Path) -> None:
    """Invariant: a step re-executed after a crash gets the recorded model response for the
    same command id: the model is paid once per call, not once per attempt."""
    calls = tmp_path / "llm-calls.log"
    env = {"ONWARD_WORKFLOWS": WORKFLOWS, "ONWARD_EXAMPLE_PROVIDER_URL": provider.url,
           "ONWARD_FAKE_LLM_LOG": str(calls)}
    cluster.dispatcher(env=env)
    cluster.reaper(env=env)
    cluster.worker(env={**env, "ONWARD_FAULTS": "before_checkpoint_commit@draft:kill:once"})
    run_id = offer_run(ledger)
    assert stopped(ledger, run_id) is RunStatus.COMPLETED
    assert ledger.get_run(run_id).restore_count >= 1
    assert len(calls.read_text().splitlines()) == 2  # classify + draft, each exactly once


@pytest.mark.parametrize(("pool", "runs"), [("threads", 4), ("gevent", 6)])
def test_effect__worker_process_killed_with_every_steps_call_in_flight(
        ledger: Ledger, cluster: Cluster, provider: Provider, pool: str, runs: int) -> None:
    """Invariant: on the threads and gevent pools one process runs many steps; SIGKILLed
    while each of its steps has an offer call in flight (the provider created every
    offer and holds its answer), it takes them all down at once. A second worker of the
    same pool resumes every run: each offer is found by its key, never sent again (one
    create request per offer and per email, no duplicate), every run completes."""
    env = {"ONWARD_WORKFLOWS": WORKFLOWS, "ONWARD_EXAMPLE_PROVIDER_URL": provider.url}
    provider.arm("offers", hold=runs, hold_s=60.0)
    cluster.dispatcher(env=env)
    cluster.reaper(env=env)
    first = cluster.worker(concurrency=runs, pool=pool, env=env, name="worker-a")
    started = [offer_run(ledger, customer=f"c-{i}") for i in range(runs)]
    wait_for(lambda: provider.stats().get("created", 0) == runs, timeout=60,
             what=f"all {runs} offer calls to be in flight", seen=provider.stats)
    first.kill_tree()
    cluster.worker(concurrency=runs, pool=pool, env=env, name="worker-b")

    for run_id in started:
        assert stopped(ledger, run_id, timeout=120) is RunStatus.COMPLETED
    stats = provider.stats()
    assert stats["by_collection"] == {"offers": runs, "emails": runs}, stats
    assert (stats["requests"], stats["duplicate_objects"]) == (2 * runs, 0), stats
    for run_id in started:
        assert_reconciled_once(ledger, ledger.effects(run_id)[0])
        assert ledger.get_run(run_id).restore_count >= 1


@pytest.mark.parametrize("finish", [False, True], ids=["goto", "finish"])
def test_effect__retry_that_skips_the_call_resolves_it_before_commit(
        finish: bool, ledger: Ledger, cluster: Cluster, provider: Provider,
        tmp_path: Path) -> None:
    """Invariant: a step never commits past an effect of its own whose outcome is unknown.
    Attempt 1 sends, the provider creates the object, the worker dies before recording it;
    the retry takes another path (a file outside ctx says so) and never calls again. Before
    its commit, as failing would, the effect is looked up by key: found, it is recorded
    ``completed`` (reconciled), and the run goes on, with no second object."""
    start_fleet(cluster, provider, faults="after_provider_response@maybe_send:kill:once")
    run_id = ledger.start_run("test_effect_orphan", {"marker": str(tmp_path / "sent"),
                                                     "finish": finish})
    assert stopped(ledger, run_id) is RunStatus.COMPLETED
    [effect] = ledger.effects(run_id)
    assert_reconciled_once(ledger, effect)
    stats = provider.stats()
    assert stats["by_collection"] == {"orphaned": 1}
    assert stats["requests"] == 1  # one call (a lookup is not counted): nothing sent again


def test_effect__retry_that_skips_a_call_without_lookup_parks(
        ledger: Ledger, cluster: Cluster, provider: Provider, tmp_path: Path) -> None:
    """Invariant: the same, through a tool with no lookup: onward cannot learn whether the
    write happened, so the run parks ``effect_outcome_unknown`` naming the effect, instead
    of committing past it; nothing is sent again."""
    start_fleet(cluster, provider, faults="after_provider_response@maybe_send:kill:once")
    run_id = ledger.start_run("test_effect_orphan", {"marker": str(tmp_path / "sent"),
                                                     "blind": True})
    assert stopped(ledger, run_id) is RunStatus.NEEDS_REVIEW
    run = ledger.get_run(run_id)
    assert run.parked_reason == "effect_outcome_unknown"
    assert run.seq == 0  # the step did not commit
    [effect] = ledger.effects(run_id)
    assert effect.status is EffectStatus.PENDING
    assert effect.effect_id[:16] in run.last_error["message"]
    assert provider.stats()["by_collection"] == {"orphaned_blind": 1}
    assert provider.stats()["requests"] == 1
    # continued without anyone resolving it, the step is attempt 1 again: it parks again
    ran = run.attempts_total
    ledger.continue_run(run_id, "continued before the provider was checked")
    assert stopped(ledger, run_id) is RunStatus.NEEDS_REVIEW
    run = ledger.get_run(run_id)
    assert run.attempts_total == ran + 1
    assert (run.parked_reason, run.seq) == ("effect_outcome_unknown", 0)
    assert ledger.effects(run_id)[0].status is EffectStatus.PENDING
    assert provider.stats()["requests"] == 1


def test_effect__retry_that_skips_a_never_sent_effect_closes_it_unsent(
        ledger: Ledger, cluster: Cluster, provider: Provider, tmp_path: Path) -> None:
    """Invariant: an intent an earlier attempt recorded but never sent (its worker died
    before the call), which the retry does not ask for again, is closed ``unsent`` when the
    step commits without it, as failing the run closes it: not left ``pending`` for good."""
    start_fleet(cluster, provider, faults="after_effect_pending@maybe_send:kill:once")
    run_id = ledger.start_run("test_effect_orphan", {"marker": str(tmp_path / "sent")})
    assert stopped(ledger, run_id) is RunStatus.COMPLETED
    [effect] = ledger.effects(run_id)
    assert effect.status is EffectStatus.UNSENT
    assert ledger.effect_attempts(effect) == []
    assert provider.stats().get("requests", 0) == 0


def test_effect__deferred_poll_rerun_that_skips_the_call_resolves_it_before_commit(
        ledger: Ledger, cluster: Cluster, provider: Provider, tmp_path: Path) -> None:
    """Invariant: a step re-run after it deferred to poll an accepted effect never commits
    past that effect. A deferral gives its attempt back, so the re-run is claimed as attempt
    1 again, not as a retry; its body takes another path (a file outside ctx says so) and
    never polls. Before its commit the job is polled, as a retry's would be: done by then,
    the effect is recorded ``completed`` and the run goes on, nothing sent again."""
    provider.configure(async_complete_s=0.1)  # 202 first; done before the 0.25 s poll
    start_fleet(cluster, provider)
    run_id = ledger.start_run("test_effect_orphan", {"marker": str(tmp_path / "sent")})
    assert stopped(ledger, run_id) is RunStatus.COMPLETED
    [effect] = ledger.effects(run_id)
    assert effect.status is EffectStatus.COMPLETED
    assert [(a.kind, a.outcome) for a in ledger.effect_attempts(effect)] == [
        ("call", "accepted"), ("status", "completed")]
    stats = provider.stats()
    assert stats["by_collection"] == {"orphaned": 1}
    assert stats["requests"] == 1


def test_effect__continued_run_that_skips_the_call_resolves_it_before_commit(
        ledger: Ledger, cluster: Cluster, provider: Provider, tmp_path: Path) -> None:
    """Invariant: the same after `onward runs continue`: a step of one attempt
    (max_attempts 1) dies after the provider acted; the reaper parks the run
    (attempts_exhausted); continuing it gives the step its attempts back, so the re-run is
    attempt 1 again. Its body skips the call; before its commit the effect is looked up by
    its key: found, ``completed`` (reconciled), one object, the run completes."""
    start_fleet(cluster, provider, faults="after_provider_response@maybe_send:kill:once")
    run_id = ledger.start_run("test_effect_orphan", {"marker": str(tmp_path / "sent")},
                              max_attempts=1)
    assert stopped(ledger, run_id) is RunStatus.NEEDS_REVIEW
    assert ledger.get_run(run_id).parked_reason == "attempts_exhausted"
    ledger.continue_run(run_id, "the worker was killed; try the step again")
    assert stopped(ledger, run_id) is RunStatus.COMPLETED
    [effect] = ledger.effects(run_id)
    assert_reconciled_once(ledger, effect)
    stats = provider.stats()
    assert stats["by_collection"] == {"orphaned": 1}
    assert stats["requests"] == 1
