"""What replays and audits rely on is signed (docs/design.md section 10): recorded model
answers and reads (inline and as artifacts), a finished run's result, effects and their
attempts, and the audit log carry keyed MACs. An edit made in SQL, without the key, is
reported by `onward verify`, refused by an evidence replay, and marked by `runs show`.
Steps run in the test process against a real PostgreSQL (tests/support/driver.py)."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from pathlib import Path
from uuid import UUID

import pytest
from typer.testing import CliRunner

from ledger import Ledger, RunStatus
from ledger.recovery import RecoveryStore
from ledger.tokens import TokenRequest
from ledger.vocabulary import Role
from tests.integration.test_operations import drv, ledger_ops, logs, ops, outside  # noqa: F401 - fixtures
from tests.support import reads
from tests.support.driver import Driver


def finished_note(drv: Driver, ops: Ledger) -> UUID:  # noqa: F811
    run_id = ops.start_run("test_ops_notes", {"topic": "pricing"})
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    return run_id


EDIT_INLINE_ANSWER = """
UPDATE onward.evidence SET response = jsonb_set(response, '{text}', '"send it all to mallory"')
 WHERE run_id = :r AND kind = 'llm'
"""

# Without the key an attacker can still keep an artifact consistent with its own sha256:
# write a new artifact and point the evidence at it.
SWAP_ARTIFACT = """
WITH edited AS (
    SELECT convert_to(replace(convert_from(a.body, 'UTF8'), '"text":"', '"text":"MALLORY '),
                      'UTF8') AS body
      FROM onward.evidence e JOIN onward.artifacts a ON a.sha256 = e.artifact_sha256
     WHERE e.run_id = :r AND e.kind = 'llm'
), stored AS (
    INSERT INTO onward.artifacts (sha256, size, media_type, body)
    SELECT encode(sha256(body), 'hex'), length(body), 'application/json', body FROM edited
    RETURNING sha256
)
UPDATE onward.evidence SET artifact_sha256 = (SELECT sha256 FROM stored)
 WHERE run_id = :r AND kind = 'llm'
"""


@pytest.mark.parametrize("stored", ["inline", "artifact"])
def test_evidence__edited_model_answer_is_reported_and_never_replayed(
        drv: Driver, ops: Ledger, logs: dict[str, Path], stored: str,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: a recorded model answer edited in SQL (inline, or by swapping in another
    artifact whose sha256 matches its own body) is reported by `verify`, and an evidence
    replay that would answer with it parks `integrity` instead: the edited text reaches no
    state, and nothing external is called."""
    if stored == "artifact":
        monkeypatch.setattr("ledger.evidence.INLINE_LIMIT", 0)  # every answer an artifact
    parent = finished_note(drv, ops)
    assert ops.verify_run(parent) == []
    edit = EDIT_INLINE_ANSWER if stored == "inline" else SWAP_ARTIFACT
    assert reads.execute(ops.engine, edit, r=parent) == 1
    seen = outside(logs)

    assert [(p.seq, p.kind) for p in ops.verify_run(parent)] == [(0, "evidence")]
    replay = drv.drive(ops.replay(parent, 0, "evidence", "audit the run").run_id)

    assert (replay.status, replay.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity")
    assert replay.last_error is not None and "evidence" in replay.last_error["message"]
    assert outside(logs) == seen
    assert [c.identity.seq for c in ops.checkpoints(replay.id)] == [0]


def test_result__edited_result_is_reported_and_marked_by_runs_show(
        drv: Driver, ops: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Invariant: a finished run's result is signed with the run's id and seq: an edit is
    reported by `verify`, and `runs show` (text and --json) and the run's web page mark
    the result as not verifying; an untouched result shows as verified."""
    run_id = finished_note(drv, ops)
    untouched = finished_note(drv, ops)
    assert reads.execute(ops.engine, "UPDATE onward.runs SET result = "
                         "jsonb_set(result, '{post_id}', '\"forged\"') WHERE id = :r",
                         r=run_id) == 1

    assert [(p.seq, p.kind) for p in ops.verify_run(run_id)] == [(3, "result")]
    admin = ops.acting_as("root", Role.ADMIN)
    secret = admin.create_token(TokenRequest("vic", Role.VIEWER, "default",
                                             timedelta(hours=1))).secret
    monkeypatch.setenv("ONWARD_WORKFLOWS", "tests.workflows_ops")
    shown = _cli("runs", "show", str(run_id), "--json", secret=secret)
    assert json.loads(shown)["run"]["result_verified"] is False
    assert "does not verify" in _cli("runs", "show", str(run_id), secret=secret)
    assert json.loads(_cli("runs", "show", str(untouched), "--json",
                           secret=secret))["run"]["result_verified"] is True
    from fastapi.testclient import TestClient

    from console.http.app import create_app
    from console.http.pages import COOKIE

    with TestClient(create_app(ops)) as web:
        web.cookies.set(COOKIE, secret)
        assert "result does not verify" in web.get(f"/runs/{run_id}").text
        assert "result does not verify" not in web.get(f"/runs/{untouched}").text


def _cli(*args: str, secret: str) -> str:
    result = CliRunner().invoke(__import__("console.cli", fromlist=["app"]).app, list(args),
                                env={"COLUMNS": "220", "ONWARD_TOKEN": secret})
    assert result.exit_code == 0, result.output
    # --json: stdout alone is the answer (a warning logged meanwhile goes to stderr)
    return result.stdout if "--json" in args else result.output


# -- the audit log: each row signed by its writer, sealed into a chain by the reaper ---------
def _seal(ledger: Ledger) -> int:
    sealed = RecoveryStore(ledger.engine, ledger.keys).seal_audit()
    assert sealed.refused == []
    return sealed.rows


AUDIT_EDITS = {
    # name: (SQL, what verify says)
    "edited_reason": ("UPDATE onward.audit SET reason = 'nothing to see here' "
                      "WHERE id = (SELECT min(id) FROM onward.audit)",
                      "does not match its MAC"),
    "deleted_from_the_middle": ("DELETE FROM onward.audit WHERE id = (SELECT id FROM "
                                "onward.audit ORDER BY id OFFSET 1 LIMIT 1)",
                                "are missing (deleted)"),
    "deleted_from_the_end": ("DELETE FROM onward.audit "
                             "WHERE id = (SELECT max(id) FROM onward.audit)",
                             "rows deleted from its end"),
    "backdated": ("UPDATE onward.audit SET at = at - interval '1 day' "
                  "WHERE id = (SELECT min(id) FROM onward.audit)",
                  "link in the chain"),
    "unsigned": ("UPDATE onward.audit SET mac = NULL "
                 "WHERE id = (SELECT min(id) FROM onward.audit)", "is not signed"),
}


@pytest.mark.parametrize("case", sorted(AUDIT_EDITS))
def test_audit__edited_or_deleted_rows_are_reported(drv: Driver, ops: Ledger,  # noqa: F811
                                                   case: str) -> None:
    """Invariant: once the reaper has sealed the audit log, editing a row (its content, its
    time, its MAC) or deleting one (in the middle or at the end) is reported by `verify`
    (the tenant's audit log), although no row is left unparseable; the untouched log
    verifies clean."""
    run_id = finished_note(drv, ops)
    for _ in range(3):
        ops.inspected(run_id=run_id)
    assert _seal(ops) == 3
    assert ops.verify_audit() == []
    sql, said = AUDIT_EDITS[case]
    assert reads.execute(ops.engine, sql) == 1

    problems = ops.verify_audit()

    assert problems, f"{case} went unnoticed"
    assert {p.kind for p in problems} == {"audit"}
    assert any(said in p.detail for p in problems), problems
    if case == "deleted_from_the_end":  # the sealer does not sign over the deletion
        ops.inspected(run_id=run_id)
        refused = RecoveryStore(ops.engine, ops.keys).seal_audit()
        assert refused.rows == 0 and "rows deleted" in refused.refused[0]


def test_audit__park_rows_written_in_sql_are_signed(drv: Driver, ops: Ledger) -> None:  # noqa: F811
    """Invariant: the audit row the worker's park statement writes (inside its one SQL
    statement) carries a MAC computed in Python, and verifies like any other row."""
    run_id = ops.start_run("test_ops_notes", {"topic": "pricing"})
    assert reads.execute(ops.engine, "UPDATE onward.checkpoints SET state = '{}' "
                         "WHERE run_id = :r", r=run_id) == 1
    assert drv.drive(run_id).status is RunStatus.NEEDS_REVIEW
    [park] = [a for a in ops.audit(run_id=run_id) if a.action == "park"]
    assert park.actor == "onward-worker"
    assert _seal(ops) >= 1
    assert ops.verify_audit() == []


def test_audit__rows_left_unsealed_are_reported(ops: Ledger) -> None:  # noqa: F811
    """Invariant: a row can only be deleted without trace before it is sealed; verify
    reports rows left unsealed longer than ONWARD_AUDIT_SEAL_GRACE_S (no reaper)."""
    ops.inspected(run_id=None)
    assert ops.verify_audit() == []  # fresh: within the grace period
    assert reads.execute(ops.engine, "UPDATE onward.audit SET at = at - interval '1 hour'") == 1
    [late] = ops.verify_audit()
    assert "is not sealed after 300s" in late.detail
    assert late.kind == "unsealed"  # a warning of its own, not the kind tampering has
    assert _seal(ops) == 1
    assert ops.verify_audit() == []


def _verify_cli(*args: str, secret: str) -> tuple[int, str]:
    result = CliRunner().invoke(__import__("console.cli", fromlist=["app"]).app,
                                ["verify", *args], env={"COLUMNS": "220", "ONWARD_TOKEN": secret})
    return result.exit_code, result.output


SEALED_ROW_TAMPERING = {
    "edited": "UPDATE onward.audit SET reason = 'nothing to see here' "
              "WHERE id = (SELECT min(id) FROM onward.audit WHERE chain_seq IS NOT NULL)",
    "deleted_from_the_end": "DELETE FROM onward.audit WHERE id = "
                            "(SELECT max(id) FROM onward.audit WHERE chain_seq IS NOT NULL)",
}


@pytest.mark.parametrize("tampering", sorted(SEALED_ROW_TAMPERING))
def test_verify_cli__unsealed_rows_warn_with_exit_4_seal_clears_them_tampering_exits_3(
        drv: Driver, ops: Ledger, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        tampering: str) -> None:
    """Invariant: with no reaper running (the embedded demo after it ends), rows left
    unsealed past the grace period are a warning, exit 4, not tampering (exit 3);
    `verify --all --seal` (an admin; a viewer is refused) seals them and verifies clean;
    an edited or deleted sealed row still fails `verify --all` (exit 3), --seal or not."""
    run_id = finished_note(drv, ops)
    ops.inspected(run_id=run_id)  # what `runs show` writes after the demo's reaper stopped
    reads.execute(ops.engine, "UPDATE onward.audit SET at = at - interval '1 hour'")
    admin = ops.acting_as("root", Role.ADMIN)
    secrets = {role: admin.create_token(TokenRequest(role.value, role, "default",
                                                     timedelta(hours=1))).secret
               for role in (Role.ADMIN, Role.VIEWER)}
    reads.execute(ops.engine, "UPDATE onward.audit SET at = at - interval '1 hour' "
                  "WHERE action = 'token_create'")
    monkeypatch.setenv("ONWARD_WORKFLOWS", "tests.workflows_ops")

    code, said = _verify_cli("--all", secret=secrets[Role.VIEWER])
    assert code == 4, said
    assert "0 problem(s), the audit log: 0" in said and "is not sealed after 300s" in said
    assert "--seal" in said
    assert _verify_cli("--all", "--seal", secret=secrets[Role.VIEWER])[0] == 2
    code, said = _verify_cli("--all", "--seal", secret=secrets[Role.ADMIN])
    assert code == 0, said
    assert "pending audit row(s) into the chain" in said and "sealed 0 " not in said

    assert reads.execute(ops.engine, SEALED_ROW_TAMPERING[tampering]) == 1
    code, said = _verify_cli("--all", secret=secrets[Role.ADMIN])
    assert code == 3, said
    code, said = _verify_cli("--all", "--seal", secret=secrets[Role.ADMIN])
    assert code == 3, said


def test_audit__concurrent_writers_and_sealers_make_one_chain(ops: Ledger) -> None:  # noqa: F811
    """Invariant: rows written by many transactions at once, while two sealers run, end up
    in one gapless chain per tenant: every row sealed exactly once, verify clean."""
    stop = threading.Event()
    sealed: list[int] = []

    def write(n: int) -> None:
        for _ in range(n):
            ops.inspected(run_id=None)

    def sealer() -> None:
        store = RecoveryStore(ops.engine, ops.keys)
        while not stop.is_set():
            sealed.append(store.seal_audit(limit=7).rows)

    sealers = [threading.Thread(target=sealer) for _ in range(2)]
    writers = [threading.Thread(target=write, args=(20,)) for _ in range(4)]
    for thread in sealers + writers:
        thread.start()
    for thread in writers:
        thread.join()
    stop.set()
    for thread in sealers:
        thread.join()
    while (more := _seal(ops)) > 0:
        sealed.append(more)

    assert sum(sealed) == 80
    with ops.engine.connect() as conn:
        places = [r[0] for r in conn.exec_driver_sql(
            "SELECT chain_seq FROM onward.audit ORDER BY chain_seq")]
    assert places == list(range(1, 81))
    assert ops.verify_audit() == []


# -- effects and their attempts ----------------------------------------------------------------
EFFECT_EDITS = {
    # name: (SQL on the parent's completed test.publish effect, what verify says)
    "result": ("UPDATE onward.effects SET result = '{\"id\": \"forged\"}' "
               "WHERE run_id = :r AND effect_type = 'test.publish'", "outcome (completed)"),
    "request_hash": ("UPDATE onward.effects SET request_hash = repeat('0', 64) "
                     "WHERE run_id = :r AND effect_type = 'test.publish'", "request"),
    "payload": ("UPDATE onward.effects SET payload = jsonb_set(payload, '{channel}', "
                "'\"mallory\"') WHERE run_id = :r AND effect_type = 'test.publish'",
                "payload is not what its signed request hash names"),
    "status_and_mac": ("UPDATE onward.effects SET status = 'unsent', outcome_mac = NULL "
                       "WHERE run_id = :r AND effect_type = 'test.publish'",
                       "an attempt saw it completed"),
    "attempt": ("UPDATE onward.effect_attempts a SET provider_ref = 'elsewhere' FROM "
                "onward.effects e WHERE e.run_id = :r AND e.effect_type = 'test.publish' "
                "AND a.effect_type = e.effect_type AND a.effect_id = e.effect_id",
                "attempt 1"),
    "attempt_deleted": ("DELETE FROM onward.effect_attempts a USING onward.effects e "
                        "WHERE e.run_id = :r AND e.effect_type = 'test.publish' "
                        "AND a.effect_type = e.effect_type AND a.effect_id = e.effect_id",
                        "attempt rows"),
}


@pytest.mark.parametrize("case", sorted(EFFECT_EDITS))
def test_effects__edits_are_reported_and_an_evidence_replay_refuses_them(
        drv: Driver, ops: Ledger, logs: dict[str, Path], case: str) -> None:  # noqa: F811
    """Invariant: an effect's request, its outcome (result, status) and each attempt are
    signed: an edit in SQL is reported by `verify` (kind `effect`); an evidence replay that
    would be answered with an edited effect parks `integrity` instead, calling nothing."""
    parent = finished_note(drv, ops)
    sql, said = EFFECT_EDITS[case]
    assert reads.execute(ops.engine, sql, r=parent) >= 1
    seen = outside(logs)

    problems = ops.verify_run(parent)

    assert problems and {p.kind for p in problems} <= {"effect"}, problems
    assert any(said in p.detail for p in problems), problems
    if case == "result":
        replay = drv.drive(ops.replay(parent, 2, "evidence", "what was sent?").run_id)
        assert (replay.status, replay.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity")
        assert outside(logs) == seen


def test_effects__a_retried_step_is_not_answered_with_an_edited_result(
        drv: Driver, ops: Ledger, logs: dict[str, Path],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: a step retried after its effect completed (the step failed before its
    commit) gets the recorded result only if it verifies: a result edited in between parks
    the run `integrity`; the step does not finish with the forged value, nothing is sent
    again."""
    from tasks import faults

    monkeypatch.setenv("ONWARD_FAULTS", "after_effect_recorded@post:raise:once")
    faults.arm_from_env()
    try:
        run_id = ops.start_run("test_ops_notes", {"topic": "pricing"})
        for seq in range(3):  # summarize, review, post (raises after its effect completed)
            drv.step(run_id, seq)
    finally:
        monkeypatch.delenv("ONWARD_FAULTS")
        faults.arm_from_env()
    assert ops.get_run(run_id).seq == 2
    assert reads.execute(ops.engine, "UPDATE onward.effects SET result = '{\"id\": \"forged\"}'"
                         " WHERE run_id = :r AND effect_type = 'test.publish'", r=run_id) == 1
    sent = outside(logs)

    run = drv.drive(run_id)

    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "integrity")
    assert run.result is None
    assert outside(logs) == sent
