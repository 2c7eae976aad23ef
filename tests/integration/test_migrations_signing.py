"""Migrations that add a MAC sign the rows that already exist, with the key every onward
process uses, and only rows that verify: an upgrade never launders a tampered row."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID, uuid4

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from ledger import signed
from ledger.checkpoints import CheckpointBody, CheckpointKeys
from ledger.migrate import upgrade

KEY = "migration-test-key"


@pytest.fixture()
def old_engine(empty_database: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    monkeypatch.setenv("ONWARD_CHECKPOINT_KEY", KEY)
    monkeypatch.setenv("ONWARD_CHECKPOINT_KEY_ID", "k1")
    engine = sa.create_engine(empty_database)
    yield engine
    engine.dispose()


def _insert_run(conn: sa.Connection, keys: CheckpointKeys, *, tampered: bool) -> UUID:
    run_id = uuid4()
    body = CheckpointBody(run_id, 0, None, None, None, "start", {"n": 1}, None,
                          workflow="wf", envelope_version=2)  # as the row says
    digest = keys.mac(body.as_dict())
    conn.execute(sa.text(
        "INSERT INTO onward.runs (id, tenant_id, workflow, status, max_attempts, head_hash) "
        "VALUES (:id, 'default', 'wf', 'running', 3, :h)"), {"id": run_id, "h": digest})
    conn.execute(sa.text(
        "INSERT INTO onward.checkpoints (run_id, seq, hash, key_id, envelope_version, outcome, "
        "state, lease_epoch, workflow) VALUES (:id, 0, :h, 'k1', 2, 'start', :state, 0, 'wf')"),
        {"id": run_id, "h": digest, "state": '{"n": 2}' if tampered else '{"n": 1}'})
    return run_id


def test_migration_0013__signs_existing_heads_that_verify(old_engine: Engine) -> None:
    """Invariant: upgrading a database with runs signs each run's head when its head
    checkpoint verifies under the configured key, and leaves a tampered one unsigned (the
    next claim refuses it, verify reports it)."""
    keys = CheckpointKeys(current="k1", keys={"k1": KEY.encode()})
    upgrade(old_engine, "0012")
    with old_engine.begin() as conn:
        good = _insert_run(conn, keys, tampered=False)
        bad = _insert_run(conn, keys, tampered=True)
    upgrade(old_engine)
    with old_engine.connect() as conn:
        rows = {r.id: r for r in conn.execute(sa.text(
            "SELECT id, seq, head_hash, head_mac FROM onward.runs"))}
    keys.check(signed.head(good, 0, rows[good].head_hash), rows[good].head_mac, "head")
    assert rows[bad].head_mac is None


def test_migration_0016__signs_existing_evidence_and_results(old_engine: Engine) -> None:
    """Invariant: upgrading signs existing evidence (inline, and artifacts that match their
    sha256) and results; an artifact that does not match its sha256 stays unsigned, so
    verify reports it after the upgrade."""
    from ledger.evidence import checked_response
    from ledger.verify import result_problem

    keys = CheckpointKeys(current="k1", keys={"k1": KEY.encode()})
    upgrade(old_engine, "0015")
    with old_engine.begin() as conn:
        run_id = _insert_run(conn, keys, tampered=False)
        conn.execute(sa.text("UPDATE onward.runs SET result = '{\"ok\": 1}' WHERE id = :id"),
                     {"id": run_id})
        conn.execute(sa.text(
            "INSERT INTO onward.artifacts (sha256, size, media_type, body) VALUES "
            "(:good, 2, 'application/json', '\\x7b7d'), "
            "(:bad, 2, 'application/json', '\\x5b5d')"),
            {"good": "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
             "bad": "0" * 64})
        for command, response, sha in (("inline", '{"text": "hi"}', None),
                                       ("good", None, "44136fa355b3678a1146ad16f7e8649e9"
                                                      "4fb4fc21fe77e8310c060f61caaff8a"),
                                       ("bad", None, "0" * 64)):
            conn.execute(sa.text(
                "INSERT INTO onward.evidence (run_id, command_id, kind, seq, step, source, "
                "request_hash, response, artifact_sha256, lease_epoch, cost_usd) VALUES "
                "(:run, :c, 'llm', 0, 's', 'm', 'r', :resp, :sha, 1, 0.001)"),
                {"run": run_id, "c": command, "resp": response, "sha": sha})
    upgrade(old_engine)
    with old_engine.connect() as conn:
        rows = {r["command_id"]: r for r in conn.execute(sa.text(
            "SELECT e.*, a.body AS artifact_body FROM onward.evidence e LEFT JOIN "
            "onward.artifacts a ON a.sha256 = e.artifact_sha256")).mappings()}
        run = conn.execute(sa.text("SELECT * FROM onward.runs WHERE id = :id"),
                           {"id": run_id}).mappings().one()
    assert checked_response(keys, rows["inline"]) == {"text": "hi"}
    assert checked_response(keys, rows["good"]) == {}
    assert rows["bad"]["mac"] is None
    assert result_problem(keys, run) is None


def test_migration_0025__signs_existing_effects_and_attempts(old_engine: Engine) -> None:
    """Invariant: upgrading signs existing effects (request, and the outcome of completed
    ones) and the attempts that ended, so their runs verify after the upgrade."""
    from ledger.effects import Effect, check_effect

    keys = CheckpointKeys(current="k1", keys={"k1": KEY.encode()})
    upgrade(old_engine, "0024")
    with old_engine.begin() as conn:
        run_id = _insert_run(conn, keys, tampered=False)
        conn.execute(sa.text(
            "INSERT INTO onward.effects (effect_id, effect_type, run_id, tenant_id, seq, step, "
            "command_id, tool_class, request_hash, status, provider_ref, result, attempts) "
            "VALUES ('e1', 'crm', :run, 'default', 0, 's', 's@0#1', 'irreversible', 'h', "
            "'completed', 'obj_1', '{\"id\": 1}', 1)"), {"run": run_id})
        conn.execute(sa.text(
            "INSERT INTO onward.effect_attempts (effect_type, effect_id, attempt, kind, worker, "
            "idempotency_key, ended_at, outcome, provider_ref) VALUES ('crm', 'e1', 1, 'call', "
            "'w', 'e1', now(), 'completed', 'obj_1')"))
    upgrade(old_engine)
    with old_engine.connect() as conn:
        effect = Effect.from_row(dict(conn.execute(sa.text(
            "SELECT * FROM onward.effects")).mappings().one()))
        attempt = conn.execute(sa.text("SELECT * FROM onward.effect_attempts")).mappings().one()
    check_effect(keys, effect)
    keys.check(signed.effect_attempt("crm", "e1", 1, "call", "e1", "completed", "obj_1"),
               attempt["mac"], "attempt")


def test_migration_0029__signs_existing_approval_terms(old_engine: Engine) -> None:
    """Invariant: upgrading signs each existing approval's terms (approvers, times, artifact
    binding) as they stand, so approve and verify accept them after the upgrade."""
    from ledger.waits import check_terms

    keys = CheckpointKeys(current="k1", keys={"k1": KEY.encode()})
    upgrade(old_engine, "0028")
    with old_engine.begin() as conn:
        run_id = _insert_run(conn, keys, tampered=False)
        conn.execute(sa.text(
            "INSERT INTO onward.approvals (id, run_id, tenant_id, seq, workflow_version, step, "
            "action, artifact_hash, artifact, approvers, expires_at, status) VALUES "
            "(:id, :run, 'default', 0, 1, 's', 'send', 'h', '{}', '[\"alice\"]', "
            "now() + interval '1 day', 'pending')"), {"id": uuid4(), "run": run_id})
    upgrade(old_engine)
    with old_engine.connect() as conn:
        row = conn.execute(sa.text("SELECT * FROM onward.approvals")).mappings().one()
    check_terms(keys, row)


def test_migration_0037__signs_existing_signals_with_their_id(old_engine: Engine) -> None:
    """Invariant: upgrading signs each signal whose 0035 MAC verifies again with its row id,
    so it is read after the upgrade; one whose payload was edited keeps its failing MAC."""
    from ledger.exceptions import IntegrityViolation
    from ledger.waits import check_signal

    keys = CheckpointKeys(current="k1", keys={"k1": KEY.encode()})
    upgrade(old_engine, "0036")
    with old_engine.begin() as conn:
        run_id = _insert_run(conn, keys, tampered=False)
        for payload, signed_payload in (('{"n": 1}', {"n": 1}), ('{"n": 2}', {"n": 1})):
            old = {"mac": "signal", "run_id": str(run_id), "name": "go",
                   "payload": signed_payload}
            conn.execute(sa.text("INSERT INTO onward.signals (run_id, name, payload, mac) "
                                 "VALUES (:run, 'go', :payload, :mac)"),
                         {"run": run_id, "payload": payload, "mac": keys.sign(old)})
    upgrade(old_engine)
    with old_engine.connect() as conn:
        good, edited = conn.execute(sa.text(
            "SELECT * FROM onward.signals ORDER BY id")).mappings().all()
    check_signal(keys, good)
    with pytest.raises(IntegrityViolation):
        check_signal(keys, edited)


def test_migrations_0034_0035__sign_existing_launches_and_signals(old_engine: Engine) -> None:
    """Invariant: upgrading signs how each existing run was launched (0034), so claims and
    verify accept it, and each existing signal as it was sent (0035, the body 0037 then
    re-signs with the row id), every row in one pass of batches."""
    keys = CheckpointKeys(current="k1", keys={"k1": KEY.encode()})
    upgrade(old_engine, "0033")
    with old_engine.begin() as conn:
        runs = [_insert_run(conn, keys, tampered=False) for _ in range(3)]
    upgrade(old_engine, "0034")
    with old_engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO onward.signals (run_id, name, payload) VALUES (:run, 'go', :payload)"),
            [{"run": run_id, "payload": f'{{"n": {n}}}'} for n, run_id in enumerate(runs)])
    upgrade(old_engine, "0035")
    with old_engine.connect() as conn:
        launched = conn.execute(sa.text("SELECT * FROM onward.runs")).mappings().all()
        sent = conn.execute(sa.text("SELECT * FROM onward.signals")).mappings().all()
    assert sorted(row["id"] for row in launched) == sorted(runs)
    for row in launched:
        keys.check(signed.launch(row["id"], row), row["launch_mac"], "launch")
    assert len(sent) == 3
    for row in sent:
        signed_then = {"mac": "signal", "run_id": str(row["run_id"]), "name": row["name"],
                       "payload": row["payload"]}  # 0035's body (0037 adds the row id)
        keys.check(signed_then, row["mac"], "signal")


def test_migration_0041__signs_existing_decisions_with_their_comment(old_engine: Engine) -> None:
    """Invariant: upgrading signs each decision whose 0022 MAC verifies again with its
    comment, so it is acted on and shown after the upgrade; one whose decision was edited
    (decided_by) keeps its failing MAC."""
    from ledger.signed import micros

    keys = CheckpointKeys(current="k1", keys={"k1": KEY.encode()})
    upgrade(old_engine, "0040")
    with old_engine.begin() as conn:
        run_id = _insert_run(conn, keys, tampered=False)
        for who, signed_by in (("alice", "alice"), ("mallory", "alice")):
            approval_id = uuid4()
            decided_at = conn.execute(sa.text("SELECT now()")).scalar_one()
            old = {"mac": "approval_decision", "id": str(approval_id), "run_id": str(run_id),
                   "seq": 0, "action": "send", "artifact_hash": "h", "status": "approved",
                   "decided_by": signed_by, "decided_at_us": micros(decided_at)}
            conn.execute(sa.text(
                "INSERT INTO onward.approvals (id, run_id, tenant_id, seq, workflow_version, "
                "step, action, artifact_hash, artifact, approvers, expires_at, status, "
                "decided_by, decided_at, comment, decision_mac) VALUES (:id, :run, 'default', "
                "0, 1, 's', 'send', 'h', '{}', '[]', now() + interval '1 day', 'approved', "
                ":who, :at, 'fine', :mac)"),
                {"id": approval_id, "run": run_id, "who": who, "at": decided_at,
                 "mac": keys.sign(old)})
    upgrade(old_engine)
    with old_engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT * FROM onward.approvals")).mappings().all()
    good = next(r for r in rows if r["decided_by"] == "alice")
    edited = next(r for r in rows if r["decided_by"] == "mallory")
    keys.check(signed.approval_decision(good), good["decision_mac"], "decision")
    from ledger.exceptions import IntegrityViolation
    with pytest.raises(IntegrityViolation):
        keys.check(signed.approval_decision(edited), edited["decision_mac"], "decision")


def test_migration_0042__signs_existing_refusals(old_engine: Engine) -> None:
    """Invariant: upgrading signs each existing refused answer as it stands, so a retried
    step still finds it (and does not call again) after the upgrade."""
    keys = CheckpointKeys(current="k1", keys={"k1": KEY.encode()})
    upgrade(old_engine, "0041")
    with old_engine.begin() as conn:
        run_id = _insert_run(conn, keys, tampered=False)
        conn.execute(sa.text(
            "INSERT INTO onward.refused_answers (run_id, seq, command_id, kind, source, "
            "request_hash, answer_sha256, answer_bytes, reason, input_tokens, output_tokens, "
            "cost_usd, lease_epoch) VALUES (:run, 0, 'ask@0#1', 'llm', 'm', 'rh', 'ah', 12, "
            "'NUL at $.text', 50, 10, 0.6, 1)"), {"run": run_id})
    upgrade(old_engine)
    with old_engine.connect() as conn:
        row = conn.execute(sa.text("SELECT * FROM onward.refused_answers")).mappings().one()
    keys.check(signed.refused_answer(run_id, row), row["mac"], "refusal")


def test_migration_0047__signs_existing_effect_recipients(old_engine: Engine) -> None:
    """Invariant: upgrading signs each existing effect's recipient as it stands (nothing
    signed it before: no edit is laundered), so its run verifies after the upgrade and a
    later edit of the recipient does not; an effect with no recipient gets no MAC."""
    from ledger.effects import Effect, check_recipient
    from ledger.exceptions import IntegrityViolation

    keys = CheckpointKeys(current="k1", keys={"k1": KEY.encode()})
    upgrade(old_engine, "0046")
    with old_engine.begin() as conn:
        run_id = _insert_run(conn, keys, tampered=False)
        for effect_id, recipient in (("e1", "news"), ("e2", None)):
            conn.execute(sa.text(
                "INSERT INTO onward.effects (effect_id, effect_type, run_id, tenant_id, seq, "
                "step, command_id, tool_class, request_hash, recipient, status) VALUES "
                "(:id, 'crm', :run, 'default', 0, 's', :id, 'irreversible', 'h', :to, "
                "'pending')"), {"id": effect_id, "run": run_id, "to": recipient})
    upgrade(old_engine)
    with old_engine.connect() as conn:
        effects = {r["effect_id"]: Effect.from_row(dict(r)) for r in conn.execute(sa.text(
            "SELECT * FROM onward.effects")).mappings()}
    check_recipient(keys, effects["e1"])
    assert effects["e2"].recipient_mac is None
    check_recipient(keys, effects["e2"])  # nothing to check
    edited = Effect.from_row({**vars(effects["e1"]), "recipient": "attacker",
                              "status": effects["e1"].status.value})
    with pytest.raises(IntegrityViolation, match="recipient does not match its MAC"):
        check_recipient(keys, edited)
