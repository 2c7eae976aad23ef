"""Retention keeps history verifiable (issue 15 item 5, ledger/retention.py): compaction
drops a terminal run's checkpoint states and keeps each checkpoint's hash, the sha256 of its
state and a seal, and turns its other payloads (evidence, effects, the approval's artifact,
the result) into digests, so verify stays clean and still catches an edit of a digest; runs on
legal hold or in a corpus are kept; a run that does not verify is not compacted. Steps run
in the test process against a real PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa

from ledger import Ledger, RunStatus
from ledger.corpora import Corpora
from ledger.corpus import Selection, pin_ids_txn
from ledger.exceptions import IntegrityViolation, InvalidInput, OperationRefused
from ledger.retention import compact_run_txn, parse_policies
from tests.support import reads
from tests.support.cluster import wait_for
from tests.support.corpus import record_note
from tests.support.driver import Driver, driver, driver_fixture

MODULES = ["tests.workflows"]


@pytest.fixture()
def admin(ledger: Ledger) -> Ledger:
    """The local admin, with a policy that makes every finished run due at once."""
    return Ledger(ledger.engine, ledger.settings.model_copy(
        update={"workflows": MODULES, "retention_policies": "*/*=0"}))


drv = driver_fixture(MODULES, ledger="admin")


def finished(drv: Driver, admin: Ledger, steps: int = 6) -> UUID:
    run_id = admin.start_run("test_notes_chain", {"steps": steps, "sleep_ms": 0, "notes": []})
    assert drv.drive(run_id, max_steps=steps + 2).status is RunStatus.COMPLETED
    return run_id


def test_retention__compaction_keeps_verify_clean_and_catches_an_edited_digest(
        drv: Driver, admin: Ledger) -> None:
    """Invariant: after apply, every checkpoint of the run is compacted (no state, no
    delta), its history verifies clean, one audit row records it, and a second plan finds
    nothing (apply is resumable and idempotent); an UPDATE of one checkpoint's digest in
    SQL is reported by verify at that checkpoint; a replay from it is refused."""
    run_id = finished(drv, admin)
    plan = admin.retention_plan()
    assert (plan.runs, plan.checkpoints) == (1, 7) and plan.bytes > 0

    done = admin.retention_apply(batch=1)

    assert (done.runs, done.checkpoints, done.refused) == (1, 7, [])
    assert set(reads.checkpoint_kinds(admin.engine, run_id).values()) == {"compacted"}
    assert admin.verify_run(run_id) == []
    assert [a.action for a in admin.audit(run_id=run_id)].count("retention") == 1
    assert admin.retention_plan().runs == 0
    assert reads.execute(admin.engine, "UPDATE onward.checkpoints SET state_sha256 = "
                         "repeat('0', 64) WHERE run_id = :run AND seq = 3", run=run_id) == 1
    assert [(p.seq, p.kind) for p in admin.verify_run(run_id)] == [(3, "compacted")]
    with pytest.raises(OperationRefused, match="compacted"):
        admin.replay(run_id, 2, "live", "look again")


def test_retention__a_compacted_run_still_reads_as_checkpoint_envelopes(
        drv: Driver, admin: Ledger) -> None:
    """Invariant: ``Ledger.checkpoints`` (``onward runs show``) reads a compacted run: each
    checkpoint's envelope with its hash and no state (found by the model-based test: it
    raised a validation error, the envelope's state being required)."""
    run_id = finished(drv, admin)
    assert admin.retention_apply().runs == 1
    envelopes = admin.checkpoints(run_id)
    assert [e.identity.seq for e in envelopes] == list(range(7))
    assert {e.state is None for e in envelopes} == {True}
    assert all(e.identity.hash for e in envelopes)


def test_retention__held_and_pinned_runs_are_kept(drv: Driver, admin: Ledger) -> None:
    """Invariant: a run on legal hold and a run pinned in a corpus are counted as kept by
    the plan and left whole by apply (compacting a held run directly is refused); once the
    hold is released, the run is compacted."""
    held, pinned, plain = finished(drv, admin), finished(drv, admin), finished(drv, admin)
    admin.hold(held, "litigation 2026-17")
    Corpora(admin).add("golden", Selection(run_ids=(pinned,)))

    plan = admin.retention_plan()
    assert (plan.runs, plan.held, plan.pinned) == (1, 1, 1)
    assert admin.retention_apply().runs == 1

    kinds = {run: set(reads.checkpoint_kinds(admin.engine, run).values())
             for run in (held, pinned, plain)}
    assert kinds == {held: {"snapshot", "delta"}, pinned: {"snapshot", "delta"},
                     plain: {"compacted"}}
    with pytest.raises(InvalidInput, match="legal hold"), admin.engine.begin() as conn:
        compact_run_txn(conn, admin.keys, held)
    admin.hold(held, "case closed", release=True)
    assert admin.retention_apply().runs == 1
    assert set(reads.checkpoint_kinds(admin.engine, held).values()) == {"compacted"}
    assert admin.verify_run(held) == []


def test_retention__a_run_that_does_not_verify_is_not_compacted(
        drv: Driver, admin: Ledger) -> None:
    """A run whose history was edited keeps its states for investigation: apply reports it
    and compacts nothing of it."""
    run_id = finished(drv, admin)
    assert reads.execute(admin.engine, "UPDATE onward.checkpoints SET next_step = 'x' "
                         "WHERE run_id = :run AND seq = 2", run=run_id) == 1
    done = admin.retention_apply()
    assert done.runs == 0 and "does not verify" in done.refused[0]
    assert "compacted" not in reads.checkpoint_kinds(admin.engine, run_id).values()


def test_parse_policies__the_most_specific_entry_wins() -> None:
    from ledger.retention import days_for

    policies = parse_policies("*/*=30, acme/*=7, */chat=90, acme/chat=1")
    assert days_for(policies, "acme", "chat") == 1
    assert days_for(policies, "acme", "other") == 7
    assert days_for(policies, "beta", "chat") == 90
    assert days_for(policies, "beta", "other") == 30
    assert days_for(parse_policies(""), "beta", "other") is None
    with pytest.raises(InvalidInput):
        parse_policies("acme=3")


def test_parse_policies__a_kind_is_kept_by_its_own_entry_within_the_same_scope() -> None:
    """``tenant/workflow:kind=days`` sets one kind; a more specific scope wins over a kind
    (``acme/*=365`` keeps acme's attempts a year beside ``*/*:attempts=7``); an unknown kind
    is refused naming the kinds."""
    from ledger.retention import Kind, days_for

    policies = parse_policies("*/*=30, */*:attempts=7, acme/*=365, */chat:evidence=90")
    assert days_for(policies, "beta", "other", Kind.ATTEMPTS) == 7
    assert days_for(policies, "beta", "other", Kind.STATES) == 30
    assert days_for(policies, "acme", "other", Kind.ATTEMPTS) == 365
    assert days_for(policies, "beta", "chat", Kind.EVIDENCE) == 90
    assert days_for(policies, "beta", "chat", Kind.ARTIFACTS) == 30
    assert days_for(parse_policies("*/*:evidence=1"), "beta", "x", Kind.STATES) is None
    with pytest.raises(InvalidInput, match="states, evidence, artifacts, attempts"):
        parse_policies("*/*:logs=3")


def test_reaper__applies_the_policies_when_due(drv: Driver, admin: Ledger) -> None:
    """The reaper compacts a due run on its sweep, audited as the reaper in the run's
    tenant, and the run still verifies."""
    from workers.reaper import Reaper

    run_id = finished(drv, admin)
    reaper = Reaper(admin.settings)
    reaper.retention_if_due()
    assert set(reads.checkpoint_kinds(admin.engine, run_id).values()) == {"compacted"}
    [row] = [a for a in admin.audit(run_id=run_id) if a.action == "retention"]
    assert row.actor == "onward-reaper"
    assert admin.verify_run(run_id) == []


@pytest.fixture()
def ops_drv(admin: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    monkeypatch.setenv("ONWARD_TEST_OPS_CALLS", str(tmp_path / "tool.log"))
    monkeypatch.delenv("ONWARD_TEST_OPS_VARIANT", raising=False)
    with driver(admin, ["tests.workflows_ops"]) as running:
        yield running


def _rows(admin: Ledger, sql: str, run_id: UUID) -> list[dict[str, Any]]:
    with admin.engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(sql), {"run": run_id}).mappings()]


def test_retention__payloads_become_digests_and_the_run_still_verifies(
        ops_drv: Driver, admin: Ledger) -> None:
    """Invariant: compaction of a run with a model call, effects and an approval leaves of
    each payload only what its MAC needs: evidence responses become their digest (the
    evidence MAC signs it), effect payloads and the approval's artifact are dropped (their
    request and artifact hashes stay signed), effect results and the run's result become a
    digest under a seal, errors and step attempts go; verify stays clean, and an edit of
    any digest that is left is reported where it is."""
    run_id = record_note(ops_drv, "retained", approve=True)
    evidence_before = _rows(admin, "SELECT response FROM onward.evidence WHERE run_id = :run",
                            run_id)
    assert evidence_before and all("$compacted" not in (r["response"] or {})
                                   for r in evidence_before)
    assert _rows(admin, "SELECT 1 FROM onward.step_attempts WHERE run_id = :run", run_id)
    assert admin.retention_plan().runs == 1

    assert admin.retention_apply().runs == 1

    for row in _rows(admin, "SELECT response, artifact_sha256 FROM onward.evidence "
                     "WHERE run_id = :run", run_id):
        assert list(row["response"]) == ["$compacted"] and row["artifact_sha256"] is None
    found = _rows(admin, "SELECT payload, result, recipient, status FROM onward.effects "
                  "WHERE run_id = :run", run_id)
    assert len(found) == 2 and {r["status"] for r in found} == {"completed"}
    for row in found:
        assert row["payload"] in (None, {"$dropped": True}) and row["recipient"] is None
        assert set(row["result"]["$compacted"]) == {"sha256", "seal"}
    [approval] = _rows(admin, "SELECT artifact, comment FROM onward.approvals "
                       "WHERE run_id = :run", run_id)
    assert approval == {"artifact": {"$dropped": True}, "comment": None}
    [run] = _rows(admin, "SELECT result, last_error FROM onward.runs WHERE id = :run", run_id)
    assert set(run["result"]["$compacted"]) == {"sha256", "seal"}
    assert _rows(admin, "SELECT 1 FROM onward.step_attempts WHERE run_id = :run", run_id) == []
    assert admin.verify_run(run_id) == []
    assert admin.retention_plan().runs == 0

    zeros = "'\"" + "0" * 64 + "\"'"
    edits = {
        "evidence": "UPDATE onward.evidence SET response = jsonb_set(response, "
                    "'{$compacted,sha256}', " + zeros + ") WHERE run_id = :run",
        "effect": "UPDATE onward.effects SET result = jsonb_set(result, "
                  "'{$compacted,sha256}', " + zeros + ") WHERE run_id = :run",
        "result": "UPDATE onward.runs SET result = jsonb_set(result, "
                  "'{$compacted,sha256}', " + zeros + ") WHERE id = :run",
    }
    for kind, edit in edits.items():
        assert reads.execute(admin.engine, edit, run=run_id) >= 1
        assert kind in {p.kind for p in admin.verify_run(run_id)}, kind


def test_retention__a_compacted_run_is_not_pinned_in_a_corpus(
        drv: Driver, admin: Ledger) -> None:
    """A compacted run keeps digests of its answers, so a corpus could not replay it: named
    by id it is refused by name, a selection leaves it out, and a pin that waited for the
    compaction's row lock is refused once the compaction committed (nothing is pinned)."""
    compacted, whole = finished(drv, admin), finished(drv, admin)
    with admin.engine.begin() as conn:
        assert compact_run_txn(conn, admin.keys, compacted) == 7
    corpora = Corpora(admin)
    with pytest.raises(OperationRefused, match=f"run {compacted} was compacted"):
        corpora.add("golden", Selection(run_ids=(compacted,)))
    assert corpora.add("golden", Selection()).run_ids == [whole]

    with admin.engine.begin() as conn, pytest.raises(OperationRefused, match="compacted"):
        pin_ids_txn(conn, admin.actor, "golden", [compacted], {})


def _kinds_left(admin: Ledger, run_id: UUID) -> dict[str, bool]:
    """Which payloads of the run are still whole."""
    return {
        "states": "compacted" not in set(reads.checkpoint_kinds(admin.engine, run_id).values()),
        "evidence": any("$compacted" not in (r["response"] or {}) for r in _rows(
            admin, "SELECT response FROM onward.evidence WHERE run_id = :run", run_id)),
        "artifacts": _rows(admin, "SELECT artifact FROM onward.approvals WHERE run_id = :run",
                           run_id)[0]["artifact"] != {"$dropped": True},
        "attempts": bool(_rows(admin, "SELECT 1 FROM onward.step_attempts WHERE run_id = :run",
                               run_id)),
    }


def test_retention__each_kind_of_payload_is_kept_for_its_own_days(
        ops_drv: Driver, admin: Ledger) -> None:
    """A policy per kind: with attempts and states due and evidence and artifacts kept
    forever, apply deletes the attempts and compacts the states only, the run verifies and a
    second plan finds nothing; once evidence becomes due too, the next apply compacts the
    evidence only (its audit row names the kind), the artifacts stay; the corpus then
    refuses the run (its answers are digests)."""
    run_id = record_note(ops_drv, "kinds", approve=True)
    assert all(_kinds_left(admin, run_id).values())

    first = _with_policies(admin, "*/*:attempts=0, */*:states=0")
    plan = first.retention_plan()
    assert (plan.runs, plan.kinds) == (1, {"states": 1, "evidence": 0, "artifacts": 0,
                                           "attempts": 1})
    assert first.retention_apply().runs == 1
    assert _kinds_left(admin, run_id) == {"states": False, "evidence": True,
                                          "artifacts": True, "attempts": False}
    assert admin.verify_run(run_id) == [] and first.retention_plan().runs == 0

    second = _with_policies(admin, "*/*:attempts=0, */*:states=0, */*:evidence=0")
    assert second.retention_apply().runs == 1
    assert _kinds_left(admin, run_id) == {"states": False, "evidence": False,
                                          "artifacts": True, "attempts": False}
    assert admin.verify_run(run_id) == []
    kinds = [a.details.get("kinds") for a in admin.audit(run_id=run_id)
             if a.action == "retention"]
    assert kinds == [["attempts", "states"], ["evidence"]] or \
        kinds == [["evidence"], ["attempts", "states"]]


def test_retention__runs_kept_by_a_more_specific_policy_do_not_hide_later_due_ones(
        drv: Driver, ops_drv: Driver, admin: Ledger) -> None:
    """Paging: with one run per page, runs of a workflow a more specific policy keeps come
    first (older ids) and a due run of another workflow after them; plan and apply still
    reach it (before, a page with no due run ended the scan)."""
    kept = [finished(drv, admin, steps=2) for _ in range(3)]
    due = record_note(ops_drv, "late", approve=True)
    paged = _with_policies(admin, "*/*=0, */test_notes_chain=365")
    with paged.engine.connect() as conn:
        from ledger.retention import plan_txn

        assert plan_txn(conn, parse_policies("*/*=0, */test_notes_chain=365")).run_ids == [due]
    assert paged.retention_apply(batch=1).runs == 1
    assert not any(_kinds_left(admin, due).values())
    assert all("compacted" not in set(reads.checkpoint_kinds(admin.engine, r).values())
               for r in kept)


def _with_policies(admin: Ledger, policies: str) -> Ledger:
    return Ledger(admin.engine, admin.settings.model_copy(
        update={"retention_policies": policies}))


def _wait_for_a_lock_wait(engine: sa.engine.Engine, timeout_s: float = 30.0) -> None:
    """Until a backend of this database waits for a lock (the fork, on the parent's row)."""
    def lock_waits() -> int:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'")).scalar_one())

    wait_for(lock_waits, timeout=timeout_s, what="the fork to wait for the compaction")


def test_retention__a_replay_racing_its_parents_compaction_is_refused(
        drv: Driver, admin: Ledger) -> None:
    """A compaction holds the parent's run row to its commit, and keeps a run with a replay
    or branch going; a fork begun meanwhile must see one or the other: had it read the
    parent before the compaction committed, it would start a replay of a compacted run
    (whose recorded answers, and their artifacts, are gone) that the compaction did not
    see. Refused instead, with nothing launched."""
    run_id = finished(drv, admin)
    launched: list[Any] = []
    with admin.engine.connect() as compacting, compacting.begin():
        compact_run_txn(compacting, admin.keys, run_id)

        def fork() -> None:
            try:
                launched.append(admin.replay(run_id, 1, "evidence", "look again"))
            except (OperationRefused, IntegrityViolation) as exc:
                launched.append(exc)

        thread = threading.Thread(target=fork)
        thread.start()
        _wait_for_a_lock_wait(admin.engine)
    thread.join(30)
    assert len(launched) == 1 and isinstance(launched[0], OperationRefused), launched
    assert [r.id for r in admin.list_runs() if r.parent_run_id == run_id] == []
