"""Faithful by construction (docs/corpus.md#how-a-run-is-replayed): a corpus recorded by real
workers, some of them SIGKILLed, replayed offline against the code that recorded it, is
100 % identical, with the same effect keys in the same order, and the replay reaches
nothing outside: the reference provider and the model count no new call.

The corpus holds the example agents' runs as production makes them: research runs (their
model calls answered by the model server of examples/model_server.py) whose
worker was killed in the middle of a step (resumed by another process after the lease
expired), sales runs that waited for a sales lead's approval and whose CRM call's answer was
lost with its worker (reconciled by lookup), and runs that waited on v1 workers and were
resumed, migrated, by v2 workers after a deploy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import pytest

from ledger import Ledger, OnwardSettings, RunStatus
from ledger.bundle import read_bundle
from ledger.corpora import Corpora
from ledger.corpus import Selection
from ledger.vocabulary import Role
from tasks.corpus.replayer import ReplayOptions
from tasks.corpus.report import Policy, summarize
from tasks.corpus.runner import replay_bundle
from tasks.waiting import artifact_hash
from tests.support.cluster import Cluster, wait_for
from tests.support.corpus import table_digest
from tests.support.model_server import ModelServer, running_model_server
from tests.support.provider import Provider, running_provider

pytestmark = pytest.mark.acceptance

RECORDED_BY = ["examples.research", "examples.sales", "tests.versions.migrating_v1"]
DEPLOYED = ["examples.research", "examples.sales", "tests.versions.migrating_v2"]
CODE = ("examples.research", "examples.sales", "tests.versions.migrating_v1",
        "tests.versions.migrating_v2")
FAULTS = "in_step@extract_claims:kill:once,after_provider_response@create:kill:once"


@pytest.fixture()
def provider(tmp_path: Path) -> Iterator[Provider]:
    with running_provider(tmp_path) as running:
        yield running


@pytest.fixture()
def model(tmp_path: Path) -> Iterator[ModelServer]:
    with running_model_server(tmp_path, "--latency-ms", "20") as server:
        yield server


def stopped(ledger: Ledger, runs: list[UUID], *statuses: RunStatus) -> None:
    wait_for(lambda: all(ledger.get_run(r).status in statuses for r in runs), timeout=120,
             what=f"runs to be {[s.value for s in statuses]}",
             seen=lambda: [(ledger.get_run(r).status, ledger.get_run(r).last_error)
                           for r in runs])


def record(ledger: Ledger, cluster: Cluster, provider: Provider,
           env: dict[str, str]) -> dict[str, list[UUID]]:
    """Record the corpus: v1 workers with faults, then a deploy of v2 workers."""
    cluster.dispatcher(env=env)
    cluster.reaper(env=env)
    first = cluster.worker(concurrency=2, name="v1",
                           env={**env, "ONWARD_WORKFLOWS": ",".join(RECORDED_BY),
                                "ONWARD_FAULTS": FAULTS})
    runs = {
        "research": [ledger.start_run("research_agent", {"topic": f"topic-{i:02d}"})
                     for i in range(4)],
        "sales": [ledger.start_run("sales_offer_agent", {"customer_id": f"c-{i}"})
                  for i in range(2)],
        "migrated": [ledger.start_run("test_migrating", {"customer": f"m-{i}", "wait": w})
                     for i, w in enumerate(("signal", "approval"))],
    }
    stopped(ledger, runs["research"], RunStatus.COMPLETED)
    stopped(ledger, runs["sales"] + runs["migrated"], RunStatus.WAITING)
    lead = ledger.acting_as("dana", Role.APPROVER, ("sales_lead",))
    for run_id in runs["sales"]:
        approval = ledger.approvals(run_id=run_id)[0]
        lead.approve(approval.id, artifact_hash=artifact_hash(approval.artifact))
    stopped(ledger, runs["sales"], RunStatus.COMPLETED)
    first.stop()  # the deploy: v1 workers go, v2 workers come
    cluster.worker(concurrency=2, name="v2", env={**env, "ONWARD_WORKFLOWS": ",".join(DEPLOYED)})
    ledger.signal(runs["migrated"][0], "go", {"by": "sam"})
    approval = ledger.approvals(run_id=runs["migrated"][1])[0]
    lead.approve(approval.id, artifact_hash=artifact_hash(approval.artifact))
    stopped(ledger, runs["migrated"], RunStatus.COMPLETED)
    return runs


def test_corpus_replay__the_code_that_recorded_a_corpus_replays_it_identically(
        ledger: Ledger, cluster: Cluster, provider: Provider, model: ModelServer,
        settings: OnwardSettings, settings_env: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: replaying a corpus against the code that recorded it reports every run
    identical, checkpoint by checkpoint, with the same effect keys in the same order,
    including runs whose worker was SIGKILLed mid-step, runs that waited for approvals,
    a run whose CRM answer was lost and reconciled, and runs migrated from v1 to v2 by a
    deploy. The replay calls no model and no provider, and writes nothing to the ledger."""
    llm_log = tmp_path / "llm.log"
    env = {"ONWARD_EXAMPLE_PROVIDER_URL": provider.url, "ONWARD_FAKE_LLM_LOG": str(llm_log),
           "ONWARD_MODEL_URL": model.url, "ONWARD_TEST_CRM_CALLS": str(tmp_path / "crm.log"),
           "ONWARD_WORKER_QUEUE_TTL_S": "3"}
    runs = record(ledger, cluster, provider, env)
    cluster.stop_all()

    # what the corpus holds is what the test says it holds
    fired = sorted(p.name for p in Path(settings_env["ONWARD_FAULTS_DIR"]).glob("*.fired"))
    assert len(fired) == 2, fired
    assert sum(ledger.get_run(r).restore_count for r in runs["research"]) >= 1
    reconciled = [e for r in runs["sales"] for e in ledger.effects(r) if e.reconciled]
    assert len(reconciled) == 1
    for run_id in runs["migrated"]:
        assert ledger.get_run(run_id).workflow_version == 2
        assert ledger.checkpoints(run_id)[-1].compatibility.migrated_from is not None
    calls_before = (llm_log.read_text(), provider.stats(), model.stats()["requests"])

    Corpora(ledger).add("faithful", Selection())
    before = table_digest(ledger.engine)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    bundle = read_bundle(Corpora(ledger).snapshot("faithful"), ledger.keys)
    result = replay_bundle(settings, bundle, ReplayOptions(CODE, label="faithful"), jobs=2)

    assert table_digest(ledger.engine) == before
    assert (llm_log.read_text(), provider.stats(), model.stats()["requests"]) == calls_before
    expected = sorted(str(r) for group in runs.values() for r in group)
    assert sorted(o.run_id for o in result.outcomes) == expected
    for outcome in result.outcomes:
        assert outcome.identical, (outcome.run_id, outcome.workflow, outcome.finding)
        assert outcome.same_effect_keys, outcome.run_id
        assert outcome.steps_replayed == outcome.steps_recorded
        assert outcome.replay_status == "completed"
    for run_id in runs["migrated"]:
        replayed = next(o for o in result.outcomes if o.run_id == str(run_id))
        assert (replayed.recorded_version, replayed.replayed_version) == (2, 2)
    summary = summarize(result, Policy())
    assert (summary.identical, summary.divergent, summary.passed) == (8, 0, True)

    # why each step runs with the version the recorded step ran with: from the start on the
    # latest version, the migrated runs are not what production did
    latest = replay_bundle(settings, bundle, ReplayOptions(CODE, versions="latest"), jobs=2)
    diverged = sorted(o.run_id for o in latest.outcomes if not o.identical)
    assert diverged == sorted(str(r) for r in runs["migrated"])
