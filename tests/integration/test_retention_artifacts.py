"""Retention deletes the artifacts nothing references any more (ledger/artifact_sweep.py):
a compacted run's own artifacts (its states stored apart, its kept model request) go in
its compaction's transaction, counted in the plan and the audit row; one another run still
references (legal hold, corpus pin, or simply not due) stays until that run lets go of it;
an artifact whose lock a writer holds (a reference in flight) survives the pass and goes at
a later one; every run still verifies. The operator tools' notes workflow, driven in the
test process, states over 64 bytes stored apart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import pytest
import sqlalchemy as sa

from ledger import Ledger
from ledger.corpora import Corpora
from ledger.corpus import Selection
from tests.support.corpus import record_note
from tests.support.driver import Driver, driver
from tests.support.plans import sent_by

MODULES = ["tests.workflows_ops"]
REFERENCED = """
SELECT a.sha256, a.size FROM onward.artifacts a
 WHERE a.sha256 IN (SELECT artifact_sha256 FROM onward.evidence WHERE run_id = :run
                    UNION SELECT request_hash FROM onward.evidence WHERE run_id = :run
                    UNION SELECT state -> '$artifact' ->> 'sha256' FROM onward.checkpoints
                           WHERE run_id = :run AND state ? '$artifact')"""


@pytest.fixture()
def admin(ledger: Ledger) -> Ledger:
    return Ledger(ledger.engine, ledger.settings.model_copy(
        update={"workflows": MODULES, "retention_policies": "*/*=0"}))


@pytest.fixture()
def drv(admin: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    monkeypatch.setenv("ONWARD_TEST_OPS_CALLS", str(tmp_path / "tool.log"))
    monkeypatch.delenv("ONWARD_TEST_OPS_VARIANT", raising=False)
    with driver(admin, MODULES, state_inline_bytes=64) as running:
        yield running


def referenced(admin: Ledger, run_id: UUID) -> dict[str, int]:
    with admin.engine.connect() as conn:
        return {r.sha256: r.size for r in conn.execute(sa.text(REFERENCED), {"run": run_id})}


def stored(admin: Ledger, shas: set[str]) -> set[str]:
    with admin.engine.connect() as conn:
        return set(conn.execute(sa.text("SELECT sha256 FROM onward.artifacts "
                                        "WHERE sha256 = ANY(:s)"), {"s": list(shas)}).scalars())


def test_artifacts__a_compacted_runs_own_artifacts_go_and_their_bytes_are_counted(
        drv: Driver, admin: Ledger) -> None:
    """Plan counts the run's artifacts and bytes; apply deletes them in the run's
    compaction (its audit row counts them) and the run still verifies."""
    run_id = record_note(drv, "alone")
    own = referenced(admin, run_id)
    assert len(own) >= 2  # a request and states stored apart

    plan = admin.retention_plan()
    assert (plan.runs, plan.artifacts, plan.artifact_bytes) == (1, len(own), sum(own.values()))
    done = admin.retention_apply()

    assert (done.runs, done.artifacts, done.artifact_bytes) == (1, len(own), sum(own.values()))
    assert stored(admin, set(own)) == set()
    [row] = [a for a in admin.audit(run_id=run_id) if a.action == "retention"]
    assert (row.details["artifacts"], row.details["artifact_bytes"]) == (len(own),
                                                                          sum(own.values()))
    assert admin.verify_run(run_id) == []
    assert admin.retention_plan().artifacts == 0


@pytest.mark.parametrize("keep", ["hold", "pin"])
def test_artifacts__one_another_run_references_stays_until_it_lets_go(
        drv: Driver, admin: Ledger, keep: str) -> None:
    """Two runs of the same note store the same states and request, i.e. share every
    artifact: with the second on legal hold (or pinned in a corpus) the first's compaction
    deletes none of them, and the kept run still reads and verifies; released, they go."""
    first, second = record_note(drv, "shared"), record_note(drv, "shared")
    shared = referenced(admin, first)
    assert shared and referenced(admin, second) == shared
    if keep == "hold":
        admin.hold(second, "litigation")
    else:
        Corpora(admin).add("golden", Selection(run_ids=(second,)))

    assert (admin.retention_plan().runs, admin.retention_plan().artifacts) == (1, 0)
    assert (admin.retention_apply().runs, admin.retention_apply().artifacts) == (1, 0)

    assert stored(admin, set(shared)) == set(shared)
    assert admin.verify_run(first) == [] and admin.verify_run(second) == []
    assert admin.checkpoints(second)[-1].state is not None
    if keep == "hold":
        admin.hold(second, "case closed", release=True)
        assert admin.retention_plan().artifact_bytes == sum(shared.values())
        assert admin.retention_apply().artifacts == len(shared)
        assert stored(admin, set(shared)) == set() and admin.verify_run(second) == []


def test_artifacts__a_replay_keeps_the_state_it_was_copied_from(
        drv: Driver, admin: Ledger) -> None:
    """A replay's fork checkpoint copies its parent's state stored apart as a reference:
    the parent's compaction keeps that artifact (and deletes the rest of its own) while
    the replay, on hold, keeps it; the replay reads and verifies."""
    parent = record_note(drv, "replayed")
    launched = admin.replay(parent, 1, "evidence", "look again")
    drv.drive(launched.run_id)
    admin.hold(launched.run_id, "under review")
    own = set(referenced(admin, parent))
    copied = own & set(referenced(admin, launched.run_id))
    assert copied

    done = admin.retention_apply()

    assert (done.runs, done.artifacts) == (1, len(own - copied))
    assert stored(admin, own) == copied
    assert admin.verify_run(parent) == [] and admin.verify_run(launched.run_id) == []
    assert admin.checkpoints(launched.run_id)[0].state is not None


def test_artifacts__a_reference_in_flight_keeps_its_artifact_until_it_commits(
        drv: Driver, admin: Ledger) -> None:
    """A writer holding an artifact's lock shared (a commit, branch or import storing a
    reference to it, not committed yet) keeps it through a compaction that took the run's
    last reference; the next pass, the writer gone, deletes it (an orphan sweep, audited)."""
    from ledger.artifact_sweep import share_txn

    run_id = record_note(drv, "in flight")
    own = referenced(admin, run_id)
    busy = min(own)
    with admin.engine.connect() as writer, writer.begin():
        share_txn(writer, [busy])
        done = admin.retention_apply()
        assert done.artifacts == len(own) - 1
        assert stored(admin, set(own)) == {busy}
    again = admin.retention_apply()
    assert (again.runs, again.artifacts, again.artifact_bytes) == (0, 1, own[busy])
    assert stored(admin, set(own)) == set() and admin.verify_run(run_id) == []
    assert [a.reason for a in admin.audit() if a.action == "retention"].count(
        "unreferenced artifacts") == 1


def test_artifacts__verify_during_a_compaction_sees_one_history(
        drv: Driver, admin: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """A verify that read the run's checkpoints before a compaction committed (it deleted
    the states stored apart they name) reads the artifacts of that same moment: no
    'missing' problem for an artifact that went with the states naming it."""
    from ledger import verify

    run_id = record_note(drv, "verified meanwhile")
    checked = verify._check_evidence
    compacted: list[int] = []

    def compaction_commits_meanwhile(*args: object) -> object:
        if not compacted:
            compacted.append(1)
            assert admin.retention_apply().runs == 1  # its own transaction, committed
        return checked(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(verify, "_check_evidence", compaction_commits_meanwhile)
    assert admin.verify_run(run_id) == []
    assert compacted and admin.verify_run(run_id) == []


def test_artifacts__a_pass_stopped_at_max_runs_leaves_the_sweep_to_the_last(
        drv: Driver, admin: Ledger) -> None:
    """The reaper applies retention 500 runs at a time and calls again at once while runs
    are left: the sweep, which reads every artifact, runs only at the call that finishes
    (an orphan stays through a call stopped at max_runs, and goes at the last)."""
    from ledger import retention

    record_note(drv, "first")
    record_note(drv, "second")
    orphan = "0" * 64
    with admin.engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO onward.artifacts (sha256, size, media_type, body) "
                             "VALUES (:s, 2, 'application/json', '{}')"), {"s": orphan})
    policies = retention.parse_policies("*/*=0")

    stopped = retention.apply(admin.engine, admin.keys, policies, batch=1, max_runs=1)
    assert (stopped.runs, stored(admin, {orphan})) == (1, {orphan})
    last = retention.apply(admin.engine, admin.keys, policies, batch=1, max_runs=500)
    assert (last.runs, stored(admin, {orphan})) == (1, set())


def test_artifacts__the_plan_counts_them_in_one_statement_whatever_their_number(
        drv: Driver, admin: Ledger) -> None:
    """The plan counts the artifacts a due run would free and those already unreferenced
    (1,200 orphans: more than a page) in one set-based statement: it paged through every
    artifact comparing each reference with every due run's id (artifacts x due runs)."""
    run_id = record_note(drv, "counted")
    own = referenced(admin, run_id)
    with admin.engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO onward.artifacts (sha256, size, media_type, body) "
                             "SELECT 'orphan' || g, 2, 'application/json', '{}' "
                             "FROM generate_series(1, 1200) g"))

    with sent_by(admin.engine) as sent:
        plan = admin.retention_plan()

    assert (plan.runs, plan.artifacts, plan.artifact_bytes) == (
        1, len(own) + 1200, sum(own.values()) + 2400)
    assert len([s for s in sent if "FROM onward.artifacts" in s]) == 1
