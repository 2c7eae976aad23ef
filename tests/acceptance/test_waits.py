"""Approvals, signals, timers and budgets with real workers, dispatcher and reaper."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from uuid import UUID

import pytest
import sqlalchemy as sa

from ledger import Ledger, RunStatus
from ledger.exceptions import ApprovalRefused
from ledger.runs import Budgets
from ledger.vocabulary import ApprovalStatus
from tasks.waiting import artifact_hash
from tests.conftest import make_settings_env
from tests.support import reads
from tests.support.cluster import Cluster, wait_for

pytestmark = pytest.mark.acceptance

WORKFLOWS = "tests.workflows_waits"
ENV = {"ONWARD_WORKFLOWS": WORKFLOWS}



def approver(ledger: Ledger, name: str, *roles: str) -> Ledger:
    """``ledger`` acting as ``name`` with the approver role and these approver roles."""
    return ledger.acting_as(name, "approver", roles)


def fleet(cluster: Cluster) -> None:
    cluster.dispatcher(env=ENV)
    cluster.reaper(env=ENV)
    cluster.worker(concurrency=2, env=ENV)


# Starting a fleet costs seconds of CPU (three interpreters importing onward and Celery):
# the tests that kill no process, arm no fault and need no run started before the fleet
# share one per module (``shared_fleet``: its own database, each test asserts on its own
# runs); the others start their own on a database of their own (``cluster``).
@pytest.fixture()
def settings_env(request: pytest.FixtureRequest, server_urls: dict[str, str],
                 tmp_path: Path) -> dict[str, str]:
    if "shared_fleet" in request.fixturenames:
        env: dict[str, str] = request.getfixturevalue("module_env")
        return env
    return make_settings_env(request.getfixturevalue("database"), server_urls,
                             tmp_path / "faults")


@pytest.fixture(scope="module")
def module_fleet(module_cluster: Cluster) -> Cluster:
    fleet(module_cluster)
    return module_cluster


@pytest.fixture()
def shared_fleet(module_fleet: Cluster, shared_cluster: Cluster) -> Cluster:
    """The module's dispatcher, reaper and worker; their logs are printed when the test
    fails."""
    return shared_cluster


def wait_status(ledger: Ledger, run_id: UUID, status: RunStatus, timeout: float = 60) -> None:
    wait_for(lambda: ledger.get_run(run_id).status is status, timeout=timeout,
             what=f"run {run_id} to be {status.value}", seen=lambda: ledger.get_run(run_id))


def pending_approval(ledger: Ledger, run_id: UUID) -> object:
    return wait_for(lambda: ledger.approvals(run_id=run_id, status=ApprovalStatus.PENDING),
                    timeout=60, what="the approval to be requested")[0]


DOC_HASH = artifact_hash({"doc": "offer v1: 10 seats at 1000 EUR"})


def test_approval__approved_after_all_workers_restarted(ledger: Ledger,
                                                        cluster: Cluster) -> None:
    """Invariant: a waiting run holds no worker, lease or message; approving it after every
    worker was replaced resumes it exactly at the approved step."""
    fleet(cluster)
    run_id = ledger.start_run("test_review", {})
    approval = pending_approval(ledger, run_id)
    wait_status(ledger, run_id, RunStatus.WAITING)
    run = ledger.get_run(run_id)
    assert run.lease_owner is None and run.waiting_on == f"approval:{approval.id}"
    for proc in [p for p in cluster.procs if p.name == "worker"]:
        proc.kill_tree()
    cluster.worker(concurrency=2, env=ENV)
    approver(ledger, "alice").approve(approval.id, artifact_hash=DOC_HASH, comment="ship it")
    wait_status(ledger, run_id, RunStatus.COMPLETED)
    assert ledger.get_run(run_id).result == {"decided_by": "alice", "status": "approved",
                                             "comment": "ship it"}


def test_approval__refusals(ledger: Ledger, shared_fleet: Cluster) -> None:
    """Invariant: a decision about another artifact, by someone not allowed, or a second
    decision is refused with a clear error and changes nothing; a role can approve."""
    run_id = ledger.start_run("test_review", {})
    approval = pending_approval(ledger, run_id)
    with pytest.raises(ApprovalRefused, match="artifact changed"):
        approver(ledger, "alice").approve(approval.id, artifact_hash=artifact_hash({"doc": "v0"}))
    with pytest.raises(ApprovalRefused, match="may not approve"):
        approver(ledger, "mallory").approve(approval.id, artifact_hash=DOC_HASH)
    assert ledger.get_approval(approval.id).status is ApprovalStatus.PENDING
    approver(ledger, "bob", "sales_lead").approve(approval.id, artifact_hash=DOC_HASH)
    with pytest.raises(ApprovalRefused, match="already approved by bob"):
        approver(ledger, "alice").reject(approval.id, artifact_hash=DOC_HASH)
    wait_status(ledger, run_id, RunStatus.COMPLETED)


def test_approval__reject_goes_to_declared_step(ledger: Ledger, shared_fleet: Cluster) -> None:
    """Invariant: rejecting runs the workflow's rejection step, which sees the decision."""
    run_id = ledger.start_run("test_review", {})
    approval = pending_approval(ledger, run_id)
    approver(ledger, "alice").reject(approval.id, artifact_hash=DOC_HASH, comment="too cheap")
    wait_status(ledger, run_id, RunStatus.FAILED)
    assert ledger.get_run(run_id).result == {"failed": {"reason": "rejected by reviewer",
                                                        "by": "alice"}}


def test_approval__expired_is_refused_and_fails_run(ledger: Ledger, shared_fleet: Cluster) -> None:
    """Invariant: after expiry nobody can approve; the reaper fails the run with reason
    approval_expired when the workflow declared no expiry step."""
    run_id = ledger.start_run("test_review_strict", {"expires_s": 1})
    approval = pending_approval(ledger, run_id)
    wait_status(ledger, run_id, RunStatus.FAILED, timeout=30)
    assert ledger.get_run(run_id).last_error["reason"] == "approval_expired"
    assert ledger.get_approval(approval.id).status is ApprovalStatus.EXPIRED
    with pytest.raises(ApprovalRefused):
        approver(ledger, "alice").approve(approval.id, artifact_hash=DOC_HASH)


def test_signal__sent_before_and_after_the_wait(ledger: Ledger, cluster: Cluster) -> None:
    """Invariant: a signal is never lost: sent after the run waits it wakes the run; sent
    before (the run still queued) it is kept and consumed when the wait begins."""
    early = ledger.start_run("test_signal", {})
    assert ledger.signal(early, "go", {"n": 1}) is False  # nobody is waiting yet
    fleet(cluster)
    late = ledger.start_run("test_signal", {})
    wait_status(ledger, late, RunStatus.WAITING)
    assert ledger.get_run(late).waiting_on == "signal:go"
    assert ledger.signal(late, "go", {"n": 2}) is True
    wait_status(ledger, early, RunStatus.COMPLETED)
    wait_status(ledger, late, RunStatus.COMPLETED)
    assert ledger.get_run(early).result == {"payload": {"n": 1}}
    assert ledger.get_run(late).result == {"payload": {"n": 2}}


def test_signal__early_signal_survives_a_kill_right_after_the_waiting_commit(
        ledger: Ledger, cluster: Cluster, settings_env: dict[str, str]) -> None:
    """Invariant: a signal sent before its run waits is never lost: the commit that begins
    the wait consumes it in the same statement, so a worker SIGKILLed right after that
    commit (fault after_checkpoint_commit) leaves the run woken with its next message, not
    waiting forever. No reaper runs here: the commit alone must have done it. The wait
    commits once and the signal is consumed once, by the waiting checkpoint's seq."""
    run_id = ledger.start_run("test_signal", {})
    assert ledger.signal(run_id, "go", {"n": 7}) is False  # stored: nobody waits yet
    cluster.dispatcher(env=ENV)
    worker = cluster.worker(concurrency=1, env={
        **ENV, "ONWARD_FAULTS": "after_checkpoint_commit@wait_go:kill:once"})
    wait_status(ledger, run_id, RunStatus.COMPLETED, timeout=60)
    marker = Path(settings_env["ONWARD_FAULTS_DIR"]) / "after_checkpoint_commit@wait_go.kill.fired"
    assert marker.exists(), "the fault never fired"
    assert "exited with 'signal 9 (SIGKILL)'" in worker.log()
    assert ledger.get_run(run_id).result == {"payload": {"n": 7}}
    with ledger.engine.connect() as conn:
        consumed = conn.execute(sa.text(
            "SELECT consumed_seq FROM onward.signals WHERE run_id = :id"),
            {"id": run_id}).scalars().all()
    assert consumed == [1]
    assert reads.checkpoint_outcomes(ledger.engine, run_id) == ["start", "wait", "finish"]
    assert reads.committed_per_seq(ledger.engine, run_id) == {0: 1, 1: 1}


def test_signal__timeout_fails_run(ledger: Ledger, shared_fleet: Cluster) -> None:
    """Invariant: a signal wait with a timeout ends when the timeout passes."""
    run_id = ledger.start_run("test_signal", {"timeout_s": 1})
    wait_status(ledger, run_id, RunStatus.FAILED, timeout=30)
    assert ledger.get_run(run_id).last_error["reason"] == "signal_timeout"


def test_timer__continues_after_delay_without_worker(ledger: Ledger, shared_fleet: Cluster) -> None:
    """Invariant: a durable timer is a delayed outbox row: the next step starts no earlier
    than the requested time and the run completes."""
    run_id = ledger.start_run("test_timer", {"seconds": 1.5})
    wait_status(ledger, run_id, RunStatus.COMPLETED, timeout=30)
    entries = ledger.timeline(run_id)
    assert (entries[1].started_at - entries[0].ended_at) >= timedelta(seconds=1.4)


def test_budget__crash_loop_cannot_exceed_attempt_budget(ledger: Ledger,
                                                         cluster: Cluster) -> None:
    """Invariant: attempts live in the ledger: a step that kills its worker every time runs
    at most the run's attempt budget, then the run fails with budget_exhausted."""
    fleet(cluster)
    run_id = ledger.start_run("test_crash_budget", {}, budgets=Budgets(attempts=2))
    wait_status(ledger, run_id, RunStatus.FAILED, timeout=90)
    run = ledger.get_run(run_id)
    assert run.last_error["reason"] == "budget_exhausted"
    executed = [e for e in ledger.timeline(run_id) if e.outcome == "worker_lost"]
    assert len(executed) == 2


def test_budget__token_budget_exhaustion(ledger: Ledger, shared_fleet: Cluster) -> None:
    """Invariant: model usage is debited at each commit; once the token budget is spent the
    next call is not made and the run fails with budget_exhausted, showing what was spent."""
    run_id = ledger.start_run("test_talker", {}, budgets=Budgets(tokens=200))
    wait_status(ledger, run_id, RunStatus.FAILED, timeout=60)
    run = ledger.get_run(run_id)
    assert run.last_error["reason"] == "budget_exhausted"
    assert run.used_tokens >= 200
    assert run.last_error["spent"]["tokens"] == run.used_tokens


def test_budget__deadline_passes_while_waiting(ledger: Ledger, shared_fleet: Cluster) -> None:
    """Invariant: a run's wall-clock deadline holds while it waits: the reaper fails it."""
    run_id = ledger.start_run("test_signal", {}, budgets=Budgets(deadline=timedelta(seconds=2)))
    wait_status(ledger, run_id, RunStatus.WAITING)
    wait_status(ledger, run_id, RunStatus.FAILED, timeout=30)
    assert ledger.get_run(run_id).last_error["reason"] == "deadline_exceeded"


def test_waits__made_runnable_in_the_database_park_before_their_step(
        ledger: Ledger, shared_fleet: Cluster) -> None:
    """Invariant (docs/design.md section 13, 5: what runs is what was signed): a run waiting for
    a signal and one waiting for an approval, made runnable by SQL (row set running at the
    wait's ``then``, an outbox row inserted: someone with write access to the database but
    not the MAC key), are parked integrity by a real worker before their step runs: the
    signal's step never reads ``ctx.signal`` as None, the approval stays pending. Failed
    before: the signal run completed ``{"payload": None}``, the approval run ended failed
    (approval_invalid)."""
    edited = {ledger.start_run("test_signal", {}): "got_go",
              ledger.start_run("test_review", {}): "act"}
    for run_id in edited:
        wait_status(ledger, run_id, RunStatus.WAITING)
    for run_id, step in edited.items():
        assert reads.execute(ledger.engine, "UPDATE onward.runs SET status = 'running', "
                             "waiting_on = NULL, wait_until = NULL, step = :step "
                             "WHERE id = :r", r=run_id, step=step) == 1
        assert reads.execute(ledger.engine, "INSERT INTO onward.outbox (run_id, seq) "
                             "SELECT id, seq FROM onward.runs WHERE id = :r", r=run_id) == 1
    for run_id in edited:
        wait_status(ledger, run_id, RunStatus.NEEDS_REVIEW)
        run = ledger.get_run(run_id)
        assert (run.parked_reason, run.result) == ("integrity", None), run
    [approval] = ledger.approvals(run_id=list(edited)[1])
    assert approval.status is ApprovalStatus.PENDING
