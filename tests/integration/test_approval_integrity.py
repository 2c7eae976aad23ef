"""An approval authorises exactly what the approver saw (issue 11, review F2 and F19): the
web page and the API decide on the hash of the artifact they showed, never on the stored
hash, so an artifact edited in the database is refused; an approval's approvers and expiry
are signed with its artifact binding, so a database edit that adds an approver or extends
the expiry is refused by approve, parks the resumed step and is reported by verify. Each
test edits the database directly, as an attacker with write access but no key would."""

from __future__ import annotations

import json
import re
from typing import Any
from uuid import UUID

import pytest
from fastapi.testclient import TestClient

from console.http.pages import COOKIE
from ledger import Ledger, RunStatus
from ledger.checkpoints import canonical_json, sha256_hex
from ledger.exceptions import IntegrityViolation
from ledger.inspection import RunFilter
from ledger.vocabulary import LaunchMode
from ledger.waits import UNVERIFIED_COMMENT
from tests.integration.test_console_http import auth, client, drv, token  # noqa: F401
from tests.support import reads
from tests.support.driver import Driver

EDITED = {"doc": "offer v1: 10000 seats at 1000 EUR"}


def waiting_review(drv: Driver) -> tuple[UUID, dict[str, Any]]:  # noqa: F811
    run_id = drv.ledger.start_run("test_review", {})
    assert drv.drive(run_id).status is RunStatus.WAITING
    [approval] = drv.ledger.approvals(run_id=run_id)
    return run_id, {"id": approval.id, "artifact_hash": approval.artifact_hash}


def sql(ledger: Ledger, text: str, **params: object) -> None:
    assert reads.execute(ledger.engine, text, **params) == 1


def edit_artifact(ledger: Ledger, approval_id: UUID) -> None:
    sql(ledger, "UPDATE onward.approvals SET artifact = CAST(:a AS jsonb) WHERE id = :i",
        a=json.dumps(EDITED), i=approval_id)


def still_pending(drv: Driver, run_id: UUID, approval_id: UUID) -> None:  # noqa: F811
    assert drv.ledger.get_run(run_id).status is RunStatus.WAITING
    assert drv.ledger.get_approval(approval_id).status.value == "pending"


def test_page__decides_on_the_hash_of_what_it_showed(client: TestClient,  # noqa: F811
                                                     drv: Driver) -> None:  # noqa: F811
    """Invariant: the page posts the sha256 of the artifact it rendered; an artifact edited
    in the database is shown as edited, marked, and approving it is refused (the run keeps
    waiting, nothing is decided). Failed before: the page posted the stored hash, so the
    edited artifact was approved."""
    run_id, approval = waiting_review(drv)
    edit_artifact(drv.ledger, approval["id"])
    client.cookies.set(COOKIE, token(drv.ledger, "dana", "approver", "sales_lead"))
    page = client.get("/approvals")
    assert page.status_code == 200 and "10000 seats" in page.text
    assert "was changed after the run asked" in page.text
    form = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', page.text))
    assert form["shown_hash"] == sha256_hex(canonical_json(EDITED))
    answer = client.post(f"/approvals/{approval['id']}/approve",
                         data={**form, "comment": "looks fine"}, follow_redirects=False)
    assert answer.status_code == 409, answer.text
    still_pending(drv, run_id, approval["id"])


def test_page__an_intact_artifact_is_approved(client: TestClient,  # noqa: F811
                                              drv: Driver) -> None:  # noqa: F811
    """Invariant: the hash the page posts for an intact artifact is the bound hash: the
    approval goes through and the run completes."""
    run_id, approval = waiting_review(drv)
    client.cookies.set(COOKIE, token(drv.ledger, "dana", "approver", "sales_lead"))
    page = client.get("/approvals")
    form = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', page.text))
    assert form["shown_hash"] == approval["artifact_hash"]
    answer = client.post(f"/approvals/{approval['id']}/approve",
                         data={**form, "comment": "ok"}, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    assert drv.drive(run_id).status is RunStatus.COMPLETED


def test_api__decides_on_the_shown_hash(client: TestClient, drv: Driver) -> None:  # noqa: F811
    """Invariant: the API takes the hash of what the client showed (``shown_hash``); the
    hash of an artifact edited in the database is refused (409), and so is the stored hash
    copied back (the stored artifact no longer hashes to it). Failed before: the API knew
    no shown hash, and the copied stored hash approved the edited artifact."""
    run_id, approval = waiting_review(drv)
    edit_artifact(drv.ledger, approval["id"])
    lead = auth(token(drv.ledger, "dana", "approver", "sales_lead"))
    shown = client.get(f"/api/v1/approvals/{approval['id']}", headers=lead).json()["artifact"]
    assert shown == EDITED
    for body in ({"shown_hash": sha256_hex(canonical_json(shown)), "comment": "ok"},
                 {"artifact_hash": approval["artifact_hash"], "comment": "ok"}):
        answer = client.post(f"/api/v1/approvals/{approval['id']}/approve", json=body,
                             headers=lead)
        assert answer.status_code == 409, answer.text
        assert "edited outside onward" in answer.json()["detail"]
    still_pending(drv, run_id, approval["id"])
    refused = [a.outcome for a in drv.ledger.audit(action="approve")
               if a.approval_id == approval["id"]]
    assert refused == ["refused", "refused"]


def approval_problems(ledger: Ledger, run_id: UUID) -> list[str]:
    return [p.detail for p in ledger.verify_run(run_id) if p.kind == "approval"]


def test_approvers_added_in_the_database_are_refused(drv: Driver) -> None:  # noqa: F811
    """Invariant: an approver added to the approval's list in the database cannot decide
    (IntegrityViolation, the run keeps waiting) and verify names the approval. Failed
    before: mallory, added by SQL, approved and the run went on."""
    run_id, approval = waiting_review(drv)
    sql(drv.ledger, "UPDATE onward.approvals SET approvers = approvers || '[\"mallory\"]' "
                    "WHERE id = :i", i=approval["id"])
    with pytest.raises(IntegrityViolation, match="terms"):
        drv.ledger.acting_as("mallory", "approver").approve(
            approval["id"], artifact_hash=approval["artifact_hash"], comment="mine now")
    still_pending(drv, run_id, approval["id"])
    assert any("terms" in p for p in approval_problems(drv.ledger, run_id))


def test_an_expiry_extended_in_the_database_is_refused(drv: Driver) -> None:  # noqa: F811
    """Invariant: an expiry extended in the database refuses the decision and is reported
    by verify (an approval can be kept alive past the time its step set only with the
    key). Failed before: the extended approval was approved."""
    run_id, approval = waiting_review(drv)
    sql(drv.ledger, "UPDATE onward.approvals SET expires_at = expires_at + interval '30 days' "
                    "WHERE id = :i", i=approval["id"])
    with pytest.raises(IntegrityViolation, match="terms"):
        drv.ledger.acting_as("alice", "approver").approve(
            approval["id"], artifact_hash=approval["artifact_hash"], comment="ok")
    still_pending(drv, run_id, approval["id"])
    assert any("terms" in p for p in approval_problems(drv.ledger, run_id))


def test_terms_edited_after_the_decision_park_the_approved_step(drv: Driver) -> None:  # noqa: F811
    """Invariant: the step an approval resumes checks its signed terms before it runs: an
    expiry extended after a decision (say, to let a late step through) parks the run
    integrity and the approved step does not run. Failed before: the step ran."""
    run_id, approval = waiting_review(drv)
    drv.ledger.acting_as("alice", "approver").approve(
        approval["id"], artifact_hash=approval["artifact_hash"], comment="ok")
    sql(drv.ledger, "UPDATE onward.approvals SET expires_at = expires_at + interval '1 day' "
                    "WHERE id = :i", i=approval["id"])
    run = drv.drive(run_id)
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity")
    assert "terms" in reads.run_row(drv.ledger.engine, run_id)["last_error"]["message"]


def test_a_replay_does_not_copy_edited_terms(drv: Driver) -> None:  # noqa: F811
    """Invariant: a replay or branch from an approval wait asks again with the parent's
    approvers and lifetime only if they verify: approvers added in the database are not
    copied into a freshly signed approval (IntegrityViolation, nothing created). Failed
    before: the new run's approval named mallory, validly signed."""
    run_id, approval = waiting_review(drv)
    sql(drv.ledger, "UPDATE onward.approvals SET approvers = '[\"mallory\"]' WHERE id = :i",
        i=approval["id"])
    seq = drv.ledger.get_run(run_id).seq
    with pytest.raises(IntegrityViolation, match="terms"):
        drv.ledger.acting_as("olga", "operator").replay(
            run_id, seq, LaunchMode.LIVE, "try again")
    assert [r.id for r in drv.ledger.find_runs(RunFilter(workflow="test_review"))] == [run_id]


def test_a_replayed_approval_is_signed_and_decidable(drv: Driver) -> None:  # noqa: F811
    """Invariant: the approval a live replay asks again is signed anew (its own id and
    lifetime from now): it verifies and its approver can decide it."""
    run_id, _ = waiting_review(drv)
    launched = drv.ledger.acting_as("olga", "operator").replay(
        run_id, drv.ledger.get_run(run_id).seq, LaunchMode.LIVE, "ask again")
    [asked] = drv.ledger.approvals(run_id=launched.run_id)
    assert drv.ledger.verify_run(launched.run_id) == []
    drv.ledger.acting_as("alice", "approver").approve(
        asked.id, artifact_hash=asked.artifact_hash, comment="ok")
    assert drv.drive(launched.run_id).status is RunStatus.COMPLETED


def test_a_comment_edited_in_the_database_is_not_shown_as_the_approvers(
        drv: Driver) -> None:  # noqa: F811
    """Invariant: the approver's comment is signed with the decision: edited in
    onward.approvals, it is shown marked as not verified (get_approval and the approvals
    list), verify names the approval, and the step the decision resumes parks integrity
    instead of running on it. Failed before: the edited comment was shown as alice's,
    verify found nothing and the run completed."""
    run_id, approval = waiting_review(drv)
    drv.ledger.acting_as("alice", "approver").approve(
        approval["id"], artifact_hash=approval["artifact_hash"], comment="ok, 10 seats")
    assert drv.ledger.get_approval(approval["id"]).comment == "ok, 10 seats"
    sql(drv.ledger, "UPDATE onward.approvals SET comment = 'ok, 10000 seats' WHERE id = :i",
        i=approval["id"])
    shown = drv.ledger.get_approval(approval["id"]).comment
    assert shown == f"{UNVERIFIED_COMMENT} ok, 10000 seats"
    [listed] = drv.ledger.approvals(run_id=run_id, status=None)
    assert listed.comment == shown
    assert any("decision" in p for p in approval_problems(drv.ledger, run_id))
    run = drv.drive(run_id)
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity")


def test_a_bundle_without_comments_keeps_their_digest() -> None:
    """Invariant: a bundle that leaves approvers' comments out (and retention, which drops
    them the same way) keeps each one's sha256 in its place, which the decision's MAC
    covers, so the decision still verifies."""
    from ledger import signed
    from ledger.bundle import DropPolicy

    row = DropPolicy(("approvals.comment",)).apply("approvals", {"comment": "ok, 10 seats"})
    assert row["comment"].startswith(signed.DROPPED_COMMENT)
    assert signed.comment_digest(row["comment"]) == signed.comment_digest("ok, 10 seats")
    assert signed.dropped_comment(row["comment"]) == row["comment"]  # retention: same form
