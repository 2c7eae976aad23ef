"""Encryption at rest (issue 15 item 1): a state's sensitive field, the model prompt and
answer, an effect's payload and result are sealed where they are stored and opened only by
the worker; a sealed value moved to another tenant, run, seq or field does not open; MACs
and chains verify without the data keys, after a tenant's keys are erased too; rows written
before encryption was turned on still read. Real PostgreSQL; steps run by the real
executor in-process."""

from __future__ import annotations

import json
import secrets
from datetime import timedelta
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from ledger import Ledger, RunStatus
from ledger.checkpoints import sealed_envelope
from ledger.crypto import Keyring, Place
from ledger.db import libpq_conninfo
from ledger.exceptions import SealedValueUnreadable
from ledger.settings import OnwardSettings
from tests.support import clock
from tests.support.crypt import MASTER, assert_error_sealed, settings_env  # noqa: F401 - a fixture
from tests.support.driver import Driver, driver, driver_fixture
from tests.support.reads import places_holding

pytest.importorskip("cryptography")


drv = driver_fixture(["tests.workflows_crypt"])


def rows(url: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(libpq_conninfo(url)) as conn:
        return conn.execute(query, args).fetchall()


def run_one(drv: Driver, customer: str) -> Any:
    run_id = drv.ledger.start_run("test_crypt", {"customer": customer})
    return drv.drive(run_id)


def test_sensitive_values_are_sealed_at_rest_and_opened_by_the_worker(drv: Driver) -> None:
    """Given a run whose sensitive customer field reaches the state of every checkpoint, a
    model prompt and answer, an effect's payload and result; expect the run to complete with
    the worker seeing the plain value (the effect's result echoes it back into the state),
    the value in no table in the clear after the first checkpoint, and ``verify`` clean."""
    customer = f"CANARY{secrets.token_hex(6)}"
    run = run_one(drv, customer)
    assert run.status is RunStatus.COMPLETED
    url = drv.ledger.url
    # the run's input (checkpoint 0, started before any worker advertised the workflow) is
    # sealed whole (test_crypt_plain.py); the rest by the worker
    assert places_holding(url, customer) == []
    states = rows(url, "SELECT seq, state, state_delta FROM onward.checkpoints "
                       "WHERE run_id = %s ORDER BY seq", run.id)
    assert [s for s in states if customer in json.dumps(s[1:])] == []
    payload, result = rows(url, "SELECT payload, result FROM onward.effects "
                                "WHERE run_id = %s", run.id)[0]
    assert sealed_envelope(payload) is not None and sealed_envelope(result) is not None
    (response,) = rows(url, "SELECT response FROM onward.evidence WHERE run_id = %s",
                       run.id)[0]
    assert sealed_envelope(response) is not None
    assert drv.ledger.verify_run(run.id) == []
    assert run.result == {"matched": True}  # the worker opened what it was answered
    assert sealed_envelope(stored_states(drv, run.id)[-1]["echo"]) is not None


def test_an_unchanged_sensitive_field_keeps_its_envelope(drv: Driver) -> None:
    """Given steps that do not change the sensitive field; expect each checkpoint after the
    first sealed one to keep that envelope, and its delta not to carry it again."""
    run = run_one(drv, "ada@example.com")
    envelopes = {json.dumps(state["customer"], sort_keys=True)
                 for state in stored_states(drv, run.id)[1:]}
    assert len(envelopes) == 1
    deltas = rows(drv.ledger.url, "SELECT state_delta FROM onward.checkpoints WHERE run_id = "
                                  "%s AND seq > 1 AND state_delta IS NOT NULL", run.id)
    assert deltas and all("/customer" not in json.dumps(d) for (d,) in deltas)


def stored_states(drv: Driver, run_id: Any) -> list[dict[str, Any]]:
    """The run's states as stored (sealed fields sealed), oldest first."""
    from ledger.states import checkpoint_rows_txn

    with drv.ledger.engine.connect() as conn:
        return [row["state"] for row in checkpoint_rows_txn(conn, run_id)]


def keyring_of(ledger: Ledger) -> Keyring:
    crypt = ledger.keys.crypt
    assert crypt is not None
    return crypt


def test_a_sealed_value_moved_elsewhere_does_not_open(ledger: Ledger) -> None:
    """Given a value sealed for (tenant, run, seq, field); expect it to open there and
    nowhere else: another run, tenant, seq or field is refused, with a clear error."""
    crypt = keyring_of(ledger)
    run_id = uuid4()
    sealed = crypt.seal({"name": "Ada"}, Place("t1", run_id, 3, "state.customer"))
    assert crypt.open(sealed, tenant="t1", run_id=run_id, field="state.customer",
                      seq=3) == {"name": "Ada"}
    assert crypt.open(sealed, tenant="t1", run_id=run_id, field="state.customer",
                      seq_at_most=7) == {"name": "Ada"}
    elsewhere: list[dict[str, Any]] = [
        {"tenant": "t1", "run_id": uuid4(), "field": "state.customer", "seq": 3},
        {"tenant": "t2", "run_id": run_id, "field": "state.customer", "seq": 3},
        {"tenant": "t1", "run_id": run_id, "field": "state.address", "seq": 3},
        {"tenant": "t1", "run_id": run_id, "field": "state.customer", "seq": 4},
        {"tenant": "t1", "run_id": run_id, "field": "state.customer", "seq_at_most": 2},
    ]
    for place in elsewhere:
        with pytest.raises(SealedValueUnreadable):
            crypt.open(sealed, **place)
    forged = json.loads(json.dumps(sealed))
    forged["$sealed"]["s"] = 4  # the seq hint edited: the associated data no longer matches
    with pytest.raises(SealedValueUnreadable, match="does not open"):
        crypt.open(forged, tenant="t1", run_id=run_id, field="state.customer", seq=4)


def test_a_run_whose_sealed_field_does_not_open_is_parked(drv: Driver) -> None:
    """Given a run whose head checkpoint holds a sealed field another run's (the checkpoint
    MAC is re-made, as by someone holding the checkpoint key but no data key); expect the
    worker to park the run for review (integrity), not to run the step on a guess."""
    first = run_one(drv, "ada@example.com")
    crypt = keyring_of(drv.ledger)
    run_id = drv.ledger.start_run("test_crypt", {"customer": "bob@example.com"})
    drv.step(run_id, 0)  # checkpoint 1 seals bob
    stolen = crypt.seal("ada@example.com", Place("default", first.id, 1, "state.customer"))
    _resign_head_state(drv, run_id, {"customer": stolen})
    run = drv.drive(run_id)
    assert run.status is RunStatus.NEEDS_REVIEW
    assert "SealedValueUnreadable" in json.dumps(run.last_error)


def _resign_head_state(drv: Driver, run_id: Any, change: dict[str, Any]) -> None:
    """Rewrite the run's head checkpoint as a full snapshot holding ``change``, with its MAC
    and the head's MAC made with the checkpoint key (what a holder of that key could do)."""
    from ledger import signed
    from ledger.checkpoints import CheckpointBody

    url, keys = drv.ledger.url, drv.ledger.keys
    with psycopg.connect(libpq_conninfo(url)) as conn:
        conn.execute("SET session_replication_role = replica")  # past the append-only guard
        row = conn.execute("SELECT * FROM onward.checkpoints WHERE run_id = %s ORDER BY seq "
                           "DESC LIMIT 1", (run_id,)).fetchone()
        names = [d.name for d in conn.execute(
            "SELECT * FROM onward.checkpoints LIMIT 0").description or []]
        cp = dict(zip(names, row, strict=True))
        state = {**stored_states(drv, run_id)[-1], **change}
        cp["state"] = state
        body = CheckpointBody.from_row(cp)
        digest = keys.mac(body.as_dict(), cp["key_id"])
        conn.execute("UPDATE onward.checkpoints SET state = %s, state_delta = NULL, "
                     "snapshot_seq = NULL, hash = %s WHERE run_id = %s AND seq = %s",
                     (json.dumps(state), digest, run_id, cp["seq"]))
        conn.execute("UPDATE onward.runs SET head_hash = %s, head_mac = %s WHERE id = %s",
                     (digest, keys.sign(signed.head(run_id, cp["seq"], digest)), run_id))


def test_erasing_a_tenant_key_makes_its_values_unreadable_and_verify_still_passes(
        drv: Driver) -> None:
    """Given a completed run with sealed values; when its tenant's data keys are erased,
    expect its sealed values not to open any more, and every MAC and chain to verify."""
    run = run_one(drv, "ada@example.com")
    crypt = keyring_of(drv.ledger)
    assert crypt.erase_tenant("default") == 1
    fresh = OnwardSettings()
    from ledger.checkpoints import CheckpointKeys

    reader = CheckpointKeys.from_settings(fresh).crypt
    assert reader is not None
    payload = rows(drv.ledger.url, "SELECT payload, seq FROM onward.effects WHERE run_id = %s",
                   run.id)[0]
    with pytest.raises(SealedValueUnreadable, match="erased"):
        reader.open(payload[0], tenant="default", run_id=run.id, seq=payload[1],
                    field=_effect_field(drv, run.id, "payload"))
    assert drv.ledger.verify_run(run.id) == []
    keyless = Ledger.from_env(OnwardSettings(encryption_keys=None))
    assert keyless.keys.crypt is None and keyless.verify_run(run.id) == []


def _effect_field(drv: Driver, run_id: Any, what: str) -> str:
    from ledger.effects import effect_field

    effect_type, effect_id = rows(drv.ledger.url, "SELECT effect_type, effect_id FROM "
                                  "onward.effects WHERE run_id = %s", run_id)[0]
    return effect_field(effect_type, effect_id, what)


def test_a_viewer_sees_sealed_values_masked_in_the_cli_and_the_http_api(
        drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a completed run with a sealed effect payload; expect a viewer's token to show it
    masked (``***``) through ``onward effects show`` and ``GET /effects/{id}``, and an
    operator's to show it opened."""
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from console.cli import app
    from console.http.app import create_app
    from ledger.tokens import TokenRequest
    from ledger.vocabulary import Role

    for key in ("ONWARD_TOKEN", "ONWARD_AUTH", "ONWARD_TOKEN_FILE"):
        monkeypatch.delenv(key, raising=False)
    run = run_one(drv, "ada@example.com")
    effect_id = rows(drv.ledger.url, "SELECT effect_id FROM onward.effects WHERE run_id = %s",
                     run.id)[0][0]
    admin = drv.ledger.acting_as("root", "admin")
    secrets_by_role = {role: admin.create_token(TokenRequest(
        f"{role}-1", Role(role), "default", timedelta(hours=1), ())).secret
        for role in ("viewer", "operator")}
    shown: dict[str, Any] = {}
    for role, secret in secrets_by_role.items():
        result = CliRunner().invoke(app, ["effects", "show", effect_id, "--json"],
                                    env={"ONWARD_TOKEN": secret, "COLUMNS": "220"})
        assert result.exit_code == 0, result.output
        shown[role] = json.loads(result.stdout)["effect"]["payload"]
    assert shown["viewer"] == "***"
    assert shown["operator"] == {"customer": "ada@example.com", "amount": 10}
    with TestClient(create_app(Ledger.from_env())) as http:
        for role, secret in secrets_by_role.items():
            answer = http.get(f"/api/v1/effects/{effect_id}",
                              headers={"Authorization": f"Bearer {secret}"})
            assert answer.status_code == 200, answer.text
            shown[role] = answer.json()["effect"]["payload"]
    assert shown["viewer"] == "***"
    assert shown["operator"]["customer"] == "ada@example.com"


def test_an_approval_artifact_is_sealed_and_approved_as_it_was_shown(drv: Driver) -> None:
    """Given a run asking for approval of an artifact naming the customer; expect the
    artifact sealed at rest, shown opened to the approver and masked to a viewer, the
    decision bound to the hash of what the approver was shown, and ``verify`` clean."""
    from tasks.waiting import artifact_hash

    run_id = drv.ledger.start_run("test_crypt_review", {"customer": "ada@example.com"},
                                  sensitive=("customer",))
    assert drv.drive(run_id).status is RunStatus.WAITING
    assert places_holding(drv.ledger.url, "ada@example.com") == []
    approver = drv.ledger.acting_as("lena", "approver")
    [asked] = approver.approvals(run_id=run_id)
    assert asked.artifact == {"customer": "ada@example.com", "amount": 10}
    assert drv.ledger.acting_as("vic", "viewer").approvals(run_id=run_id)[0].artifact == "***"
    approver.approve(asked.id, artifact_hash=artifact_hash(asked.artifact), comment="fine")
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    assert drv.ledger.verify_run(run_id) == []


def test_a_run_input_named_sensitive_is_sealed_from_checkpoint_0(drv: Driver) -> None:
    """Given start_run naming the input's sensitive field; expect checkpoint 0 to hold it
    sealed (the value is in no table), the run to complete, and the same idempotency key to
    return the same run (its input compared through the sealed field's digest)."""
    customer = f"CANARY{secrets.token_hex(6)}"
    start = {"workflow": "test_crypt", "input": {"customer": customer},
             "idempotency_key": "order-1", "sensitive": ("customer",)}
    run_id = drv.ledger.start_run(**start)  # type: ignore[arg-type]
    assert drv.ledger.start_run(**start) == run_id  # type: ignore[arg-type]
    assert drv.drive(run_id).result == {"matched": True}
    assert places_holding(drv.ledger.url, customer) == []
    assert drv.ledger.verify_run(run_id) == []


def test_rows_written_before_encryption_was_on_still_read(drv: Driver) -> None:
    """Given a run whose first steps were committed by a worker without encryption keys
    (plain rows); expect a worker with keys to continue it, seal what it writes from then
    on, and ``verify`` to pass over both."""
    plain = Ledger.from_env(OnwardSettings(encryption_keys=None))
    assert plain.keys.crypt is None
    with driver(plain, ["tests.workflows_crypt"]) as before:
        run_id = before.ledger.start_run("test_crypt", {"customer": "ada@example.com"})
        for _ in range(3):
            run = before.ledger.get_run(run_id)
            assert run is not None
            before.step(run_id, run.seq)
    assert "checkpoints" in places_holding(drv.ledger.url, "ada@example.com")  # plain rows
    assert drv.drive(run_id).result == {"matched": True}
    assert sealed_envelope(stored_states(drv, run_id)[-1]["customer"]) is not None
    assert drv.ledger.verify_run(run_id) == []


def test_rotation_re_encrypts_everything_and_the_old_master_key_can_go(
        drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a completed run sealed under master key m1; when `onward keys rotate` runs with
    a new active master key m2 (m1 still listed); expect every sealed value re-encrypted
    under a new data key, no data key wrapped by m1 any more, and then, with m1 removed, the
    run's values still open and ``verify`` clean (MACs and chains unchanged)."""
    from typer.testing import CliRunner

    from console.cli import app
    from ledger.checkpoints import CheckpointKeys

    run = run_one(drv, "ada@example.com")
    url = drv.ledger.url
    before = {row[0]: row[1] for row in rows(
        url, "SELECT effect_id, payload FROM onward.effects WHERE run_id = %s", run.id)}
    new_master = secrets.token_hex(32)
    monkeypatch.setenv("ONWARD_ENCRYPTION_KEYS", f"m1={MASTER},m2={new_master}")
    monkeypatch.setenv("ONWARD_ENCRYPTION_KEY_ID", "m2")
    monkeypatch.setenv("ONWARD_AUTH", "off")
    result = CliRunner().invoke(app, ["keys", "rotate", "--batch", "2", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["masters_in_use"] == ["m2"]
    assert report["resealed"]["effects"] == 1 and report["resealed"]["checkpoints"] >= 1
    after = {row[0]: row[1] for row in rows(
        url, "SELECT effect_id, payload FROM onward.effects WHERE run_id = %s", run.id)}
    assert after.keys() == before.keys()
    assert all(after[k]["$sealed"]["k"] != before[k]["$sealed"]["k"] for k in after)
    again = CliRunner().invoke(app, ["keys", "rotate", "--resume", "--json"])
    assert json.loads(again.stdout)["resealed"]["effects"] == 0  # resumable: nothing redone
    monkeypatch.setenv("ONWARD_ENCRYPTION_KEYS", f"m2={new_master}")  # m1 removed
    only_new = Ledger.from_env(OnwardSettings())
    assert only_new.verify_run(run.id) == []
    payload = only_new.effects(run.id)[0].payload
    assert payload == {"customer": "ada@example.com", "amount": 10}
    assert CheckpointKeys.from_settings(OnwardSettings()).crypt is not None


@pytest.mark.parametrize("mode", ["evidence", "live"])
def test_a_replay_of_an_encrypted_run_opens_its_parents_sealed_values(
        drv: Driver, mode: str) -> None:
    """Given a completed run with sealed state fields, answers and effects; expect a replay
    from a checkpoint that holds them (sealed for the parent run) to run to the same end:
    the worker opens the parent's values and seals its own for the new run."""
    run = run_one(drv, "ada@example.com")
    launched = drv.ledger.replay(run.id, 2, mode, "check")
    child = drv.drive(launched.run_id)
    assert child.status is RunStatus.COMPLETED, child.last_error
    assert child.result == {"matched": True}
    assert drv.ledger.verify_run(launched.run_id) == []
    assert places_holding(drv.ledger.url, "ada@example.com") == []


def test_a_replay_shows_the_state_it_copied_opened(drv: Driver) -> None:
    """Invariant: an admin is shown the state a replay or branch starts from opened, as the
    worker opens it: that checkpoint keeps its source's envelopes, sealed for the source's
    place (found by the model-based test: it read ``*** (unreadable)``)."""
    run = run_one(drv, "ada@example.com")
    launched = drv.ledger.replay(run.id, 2, "live", "check")
    first = drv.ledger.checkpoints(launched.run_id)[0]
    assert first.state["text"] == drv.ledger.checkpoints(run.id)[2].state["text"]
    assert "ada@example.com" in first.state["text"]
    view = drv.ledger.checkpoint(launched.run_id, first.identity.seq)
    assert view is not None and view.state == first.state
    child = drv.drive(launched.run_id)
    assert child.status is RunStatus.COMPLETED, child.last_error
    assert "ada@example.com" in drv.ledger.checkpoints(launched.run_id)[-1].state["text"]


@pytest.mark.parametrize("mode", ["live", "branch"])
def test_a_copy_of_a_copy_from_its_fork_checkpoint_opens_its_sealed_fields(
        drv: Driver, mode: str) -> None:
    """Invariant: a replay (or branch) of a replay, from that replay's fork checkpoint, runs:
    the fields sealed for the first run are sealed again for the new one when it is made
    (found by the model-based test: its worker opened only its own fields and its source's,
    so it parked ``SealedValueUnreadable``, and an admin was shown ``*** (unreadable)``)."""
    run = run_one(drv, "ada@example.com")
    first = drv.ledger.replay(run.id, 2, "live", "check")
    if mode == "branch":
        second = drv.ledger.branch(first.run_id, 2, [{"op": "replace", "path": "/amount",
                                                     "value": 10}], "again")
    else:
        second = drv.ledger.replay(first.run_id, 2, "live", "again")
    fork = drv.ledger.checkpoints(second.run_id)[0]
    assert "ada@example.com" in fork.state["text"]
    child = drv.drive(second.run_id)
    assert child.status is RunStatus.COMPLETED, child.last_error
    assert child.result == {"matched": True}
    assert drv.ledger.verify_run(second.run_id) == []


def test_a_repeated_sealed_effect_leaves_no_plain_payload_in_the_audit_log(
        drv: Driver) -> None:
    """Invariant: an admin's repeat of an effect whose payload is sealed records the plan it
    confirmed in the audit log with the payload as stored, sealed (found by the model-based
    test: the plan, shown to the admin opened, went into the audit row in plain text)."""
    from tasks.operator import plan_repeat, repeat_effect

    customer = f"CANARY{secrets.token_hex(6)}"
    run = run_one(drv, customer)
    admin = Ledger(drv.ledger.engine, drv.ledger.settings.model_copy(
        update={"workflows": ["tests.workflows_crypt"]}))
    (effect,) = admin.effects(run.id)
    assert effect.payload["customer"] == customer  # shown opened to the admin
    repeat_effect(admin, plan_repeat(admin, effect), "check: the provider lost it")
    assert "audit" not in places_holding(admin.url, customer)
    (row,) = [a for a in admin.audit(run_id=run.id) if a.action == "repeat_effect"]
    assert sealed_envelope(row.details["payload"]) is not None


def test_a_repeat_of_an_effect_whose_keys_were_erased_is_refused_before_anything(
        drv: Driver) -> None:
    """Invariant: once the tenant's keys are erased, an admin's repeat of a sealed effect is
    refused (audited) before any attempt is recorded (found by the model-based test: the
    plan showed the payload ``*** (unreadable)``, the attempt was committed, then the repeat
    crashed turning that text into a payload, leaving the attempt without an outcome)."""
    from ledger.exceptions import OperationRefused
    from tasks.operator import plan_repeat, repeat_effect

    run = run_one(drv, "ada@example.com")
    admin = Ledger(drv.ledger.engine, drv.ledger.settings.model_copy(
        update={"workflows": ["tests.workflows_crypt"]}))
    (effect,) = admin.effects(run.id)
    admin.erase_tenant_keys("gdpr request")
    plan = plan_repeat(admin, admin.effects(run.id)[0])
    with pytest.raises(OperationRefused, match="nothing was repeated"):
        repeat_effect(admin, plan, "check: the provider lost it")
    assert [a.kind for a in admin.effect_attempts(effect)] == ["call"]
    assert [a.outcome for a in admin.audit(run_id=run.id) if a.action == "repeat_effect"] \
        == ["refused"]


def test_a_dry_run_of_erasing_a_tenants_keys_erases_nothing(drv: Driver) -> None:
    """Invariant: ``erase_tenant_keys(dry_run=True)``, what ``onward keys erase-tenant``
    asks before its question, destroys no key (the keyring erases on a connection of its
    own, which no rollback would undo) and writes no audit row; the erase itself then
    destroys them."""
    run = run_one(drv, "ada@example.com")
    (effect,) = drv.ledger.effects(run.id)
    assert drv.ledger.erase_tenant_keys("check first", dry_run=True) == 0
    assert drv.ledger.effects(run.id)[0].payload == effect.payload  # still opens
    assert "ada@example.com" in json.dumps(effect.payload)
    assert drv.ledger.audit(action="keys") == []
    assert drv.ledger.erase_tenant_keys("gdpr request") >= 1
    assert "ada@example.com" not in json.dumps(drv.ledger.effects(run.id)[0].payload)


def test_a_replay_from_a_wait_asks_again_about_the_artifact_opened(drv: Driver) -> None:
    """Given a run waiting for approval of a sealed artifact; expect a live replay from that
    wait to ask its own approval about the same artifact, sealed for the new run: the
    approver sees it opened, approves it, and the replay completes and verifies."""
    from tasks.waiting import artifact_hash

    run_id = drv.ledger.start_run("test_crypt_review", {"customer": "ada@example.com"},
                                  sensitive=("customer",))
    assert drv.drive(run_id).status is RunStatus.WAITING
    launched = drv.ledger.replay(run_id, 1, "live", "ask again")
    approver = drv.ledger.acting_as("lena", "approver")
    [asked] = approver.approvals(run_id=launched.run_id)
    assert asked.artifact == {"customer": "ada@example.com", "amount": 10}
    approver.approve(asked.id, artifact_hash=artifact_hash(asked.artifact))
    assert drv.drive(launched.run_id).status is RunStatus.COMPLETED
    assert drv.ledger.verify_run(launched.run_id) == []
    assert places_holding(drv.ledger.url, "ada@example.com") == []


def test_the_async_ledger_seals_a_run_input_too(drv: Driver) -> None:
    """Given AsyncLedger.start naming the input's sensitive field; expect checkpoint 0 to
    hold it sealed, the same idempotency key to return the same run, and the run to
    complete."""
    import asyncio

    from ledger.client import AsyncLedger

    customer = f"CANARY{secrets.token_hex(6)}"

    async def start() -> Any:
        async with AsyncLedger(drv.ledger.settings) as client:
            first = await client.start("test_crypt", {"customer": customer},
                                       idempotency_key="a-1", sensitive=("customer",))
            again = await client.start("test_crypt", {"customer": customer},
                                       idempotency_key="a-1", sensitive=("customer",))
            return first, again

    run_id, again = asyncio.run(start())
    assert again == run_id
    assert places_holding(drv.ledger.url, customer) == []
    assert drv.drive(run_id).result == {"matched": True}


def signalled_run(drv: Driver) -> tuple[Any, str, str]:
    """A run of ``test_crypt_signal`` (its customer named sensitive at the start) that
    waited for a signal carrying a street, and finished with a result quoting both."""
    customer, street = f"CANARY{secrets.token_hex(6)}", f"STREET{secrets.token_hex(6)}"
    run_id = drv.ledger.start_run("test_crypt_signal", {"customer": customer},
                                  sensitive=("customer",))
    assert drv.drive(run_id).status is RunStatus.WAITING
    drv.ledger.signal(run_id, "address", {"street": street})
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED, run.last_error
    return run_id, customer, street


def test_a_result_and_a_signal_payload_are_sealed_at_rest_and_opened_for_the_app(
        drv: Driver) -> None:
    """Given a run whose signal payload and finish result hold sensitive values; expect both
    sealed in their rows (neither value anywhere in plain text), the worker to have read the
    signal opened, the application (``get_run``, ``wait``, ``events``, ``AsyncLedger``) to
    get the result opened, a viewer to see both masked and an operator opened, and
    ``verify`` clean with and without the keys."""
    import asyncio

    from ledger.client import AsyncLedger

    run_id, customer, street = signalled_run(drv)
    url = drv.ledger.url
    assert places_holding(url, customer) == [] and places_holding(url, street) == []
    [(payload,)] = rows(url, "SELECT payload FROM onward.signals WHERE run_id = %s", run_id)
    [(result,)] = rows(url, "SELECT result FROM onward.runs WHERE id = %s", run_id)
    assert sealed_envelope(payload) is not None and sealed_envelope(result) is not None
    opened = {"customer": customer, "street": street}
    assert drv.ledger.get_run(run_id).result == opened  # type: ignore[union-attr]
    assert drv.ledger.wait(run_id, timeout=10).result == opened
    finished = [e for e in drv.ledger.events(run_id, timeout=10) if e.status.terminal]
    assert finished[-1].detail["result"] == opened
    assert [r.result for r in drv.ledger.list_runs(limit=5) if r.id == run_id] == [opened]

    async def read() -> tuple[Any, Any]:
        async with AsyncLedger(drv.ledger.settings) as client:
            got = await client.get(run_id)
            return (got.result if got else None), (await client.wait(run_id, 10)).result

    assert asyncio.run(read()) == (opened, opened)
    viewer = drv.ledger.acting_as("vic", "viewer")
    assert viewer.get_run(run_id).result == "***"  # type: ignore[union-attr]
    assert viewer.wait(run_id, timeout=10).result == "***"
    assert [s["payload"] for s in viewer.signals(run_id)] == ["***"]
    operator = drv.ledger.acting_as("olga", "operator")
    assert [s["payload"] for s in operator.signals(run_id)] == [{"street": street}]
    assert drv.ledger.verify_run(run_id) == []
    keyless = Ledger.from_env(OnwardSettings(encryption_keys=None))
    assert keyless.verify_run(run_id) == []
    assert keyless.get_run(run_id).result == "***"  # type: ignore[union-attr]


def test_rotation_re_encrypts_a_result_and_a_signal_payload(
        drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a finished run with a sealed result and signal payload; when `onward keys
    rotate` runs with a new master key; expect both re-encrypted under the new data key,
    opened with the old master key removed, and their MACs unchanged (``verify`` clean)."""
    from typer.testing import CliRunner

    from console.cli import app

    run_id, customer, street = signalled_run(drv)
    url = drv.ledger.url
    query = ("SELECT r.result, r.result_mac, s.payload, s.mac FROM onward.runs r "
             "JOIN onward.signals s ON s.run_id = r.id WHERE r.id = %s")
    [before] = rows(url, query, run_id)
    new_master = secrets.token_hex(32)
    monkeypatch.setenv("ONWARD_ENCRYPTION_KEYS", f"m1={MASTER},m2={new_master}")
    monkeypatch.setenv("ONWARD_ENCRYPTION_KEY_ID", "m2")
    monkeypatch.setenv("ONWARD_AUTH", "off")
    result = CliRunner().invoke(app, ["keys", "rotate", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["resealed"]["runs"] == 1 and report["resealed"]["signals"] == 1
    [after] = rows(url, query, run_id)
    for sealed in (0, 2):
        assert after[sealed]["$sealed"]["k"] != before[sealed]["$sealed"]["k"]
        assert after[sealed]["$sealed"]["d"] == before[sealed]["$sealed"]["d"]
    assert (after[1], after[3]) == (before[1], before[3])  # the MACs are untouched
    monkeypatch.setenv("ONWARD_ENCRYPTION_KEYS", f"m2={new_master}")  # m1 removed
    only_new = Ledger.from_env(OnwardSettings())
    assert only_new.verify_run(run_id) == []
    assert only_new.get_run(run_id).result == {  # type: ignore[union-attr]
        "customer": customer, "street": street}
    assert [s["payload"] for s in only_new.signals(run_id)] == [{"street": street}]


def test_erasing_a_tenant_makes_its_result_and_signals_unreadable_and_verify_passes(
        drv: Driver) -> None:
    """Given a finished run with a sealed result and signal payload; when the tenant's keys
    are erased; expect neither to open any more (shown as unreadable, refused to a worker),
    and every MAC and chain to verify, with and without the keys."""
    from ledger.checkpoints import CheckpointKeys
    from ledger.waits import opened_signal

    run_id, _, _ = signalled_run(drv)
    assert keyring_of(drv.ledger).erase_tenant("default") == 1
    fresh = Ledger.from_env(OnwardSettings())
    assert fresh.get_run(run_id).result == "*** (unreadable)"  # type: ignore[union-attr]
    assert [s["payload"] for s in fresh.signals(run_id)] == ["*** (unreadable)"]
    [row] = rows(drv.ledger.url, "SELECT id, run_id, payload FROM onward.signals "
                                 "WHERE run_id = %s", run_id)
    with pytest.raises(SealedValueUnreadable, match="erased"):
        opened_signal(CheckpointKeys.from_settings(OnwardSettings()),
                      {"id": row[0], "run_id": row[1], "payload": row[2]}, "default")
    assert fresh.verify_run(run_id) == []
    assert Ledger.from_env(OnwardSettings(encryption_keys=None)).verify_run(run_id) == []


def test_a_step_error_quoting_a_sensitive_value_is_sealed(
        drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a workflow with sensitive fields whose step fails with an error quoting the
    customer; expect the run's last error to keep its type plain and its message sealed,
    the attempt's message ``***``, the value in no table, the message opened for the app
    and an operator, masked for a viewer, re-encrypted by a rotation, and unreadable once
    the tenant's keys are erased (``verify`` clean throughout)."""
    from typer.testing import CliRunner

    from console.cli import app

    customer = f"CANARY{secrets.token_hex(6)}"
    run_id = drv.ledger.start_run("test_crypt_error", {"customer": customer},
                                  sensitive=("customer",))
    assert drv.drive(run_id).status is RunStatus.FAILED
    url, said = drv.ledger.url, f"no account for {customer}"
    error = assert_error_sealed(drv, run_id, customer, said)
    assert drv.ledger.wait(run_id, timeout=10).error["message"] == said  # type: ignore[index]
    monkeypatch.setenv("ONWARD_ENCRYPTION_KEYS", f"m1={MASTER},m2={secrets.token_hex(32)}")
    monkeypatch.setenv("ONWARD_ENCRYPTION_KEY_ID", "m2")
    monkeypatch.setenv("ONWARD_AUTH", "off")
    rotated = CliRunner().invoke(app, ["keys", "rotate", "--json"])
    assert rotated.exit_code == 0, rotated.output
    assert json.loads(rotated.stdout)["resealed"]["runs"] == 1
    [(after,)] = rows(url, "SELECT last_error FROM onward.runs WHERE id = %s", run_id)
    assert after["message"]["$sealed"]["k"] != error["message"]["$sealed"]["k"]
    fresh = Ledger.from_env(OnwardSettings())
    assert fresh.get_run(run_id).last_error["message"] == said  # type: ignore[union-attr,index]
    assert keyring_of(fresh).erase_tenant("default") >= 1
    erased = Ledger.from_env(OnwardSettings()).get_run(run_id)
    assert erased.last_error["message"] == "*** (unreadable)"  # type: ignore[union-attr,index]
    assert drv.ledger.verify_run(run_id) == []
    from tasks.sensitive import seal_error

    # nothing more can be sealed for the erased tenant: a new step error keeps no text
    assert seal_error(keyring_of(fresh), {"type": "StepError", "message": said},
                      tenant="default", run_id=run_id, seq=0
                      ) == {"type": "StepError", "message": "***"}


def test_a_compacted_encrypted_run_verifies_and_rotation_and_erasure_pass_over_it(
        drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a finished run with sealed state fields, answers, an effect, a signal and a
    result; when retention compacts every kind of it; expect no plain value and no sealed
    envelope of it left where a payload was (digests only), ``verify`` clean with and
    without the keys, then after ``keys rotate`` and after the tenant's erasure as well."""
    from ledger.retention import compact_run_txn

    run_id, customer, street = signalled_run(drv)
    with drv.ledger.engine.begin() as conn:
        assert compact_run_txn(conn, drv.ledger.keys, run_id) > 0
    url = drv.ledger.url
    [(payload,)] = rows(url, "SELECT payload FROM onward.signals WHERE run_id = %s", run_id)
    [(result,)] = rows(url, "SELECT result FROM onward.runs WHERE id = %s", run_id)
    assert list(payload) == ["$compacted"] and list(result) == ["$compacted"]
    assert places_holding(url, customer) == [] and places_holding(url, street) == []
    assert drv.ledger.verify_run(run_id) == []
    assert Ledger.from_env(OnwardSettings(encryption_keys=None)).verify_run(run_id) == []

    new_master = secrets.token_hex(32)
    monkeypatch.setenv("ONWARD_ENCRYPTION_KEYS", f"m1={MASTER},m2={new_master}")
    monkeypatch.setenv("ONWARD_ENCRYPTION_KEY_ID", "m2")
    rotated = Ledger.from_env(OnwardSettings())
    rotated.rotate_keys()
    assert rotated.verify_run(run_id) == []
    assert rotated.erase_tenant_keys("erasure request") >= 1
    assert Ledger.from_env(OnwardSettings()).verify_run(run_id) == []


def test_a_refusal_quoting_a_sensitive_value_is_sealed(drv: Driver) -> None:
    """Given a workflow with sensitive fields whose run's input does not validate at its
    restore (pydantic's error quotes the value: handed back for a version that accepts it,
    then parked once none did); expect the hand-backs and the park onward writes to keep
    their type plain and their message sealed in the run's row, ``***`` in the attempts',
    the value in no table, the message opened for the app, masked for a viewer, ``verify``
    clean."""
    customer = f"CANARY{secrets.token_hex(6)}"
    run_id = drv.ledger.start_run("test_crypt_invalid", {"customer": customer},
                                  sensitive=("customer",))
    for delivery in range(1, 11):  # ONWARD_HANDBACK_LIMIT, each past the last one's backoff
        clock.set_on_store(drv.store, timedelta(minutes=delivery))
        drv.step(run_id, 0)
    run = drv.ledger.get_run(run_id)
    assert run is not None
    assert (run.status, run.parked_reason) == (RunStatus.NEEDS_REVIEW, "no_worker_for_version")
    url = drv.ledger.url
    assert places_holding(url, customer) == []
    [(error,)] = rows(url, "SELECT last_error FROM onward.runs WHERE id = %s", run_id)
    assert error["type"] == "NoWorkerForVersion" and sealed_envelope(error["message"]) is not None
    assert rows(url, "SELECT error_message FROM onward.step_attempts WHERE run_id = %s",
                run_id) == [("***",)] * 10
    assert customer in run.last_error["message"]  # type: ignore[index]
    [parked] = drv.ledger.audit(run_id=run_id, action="park")
    assert customer in parked.details["message"]  # type: ignore[index]
    viewer = drv.ledger.acting_as("vic", "viewer")
    assert viewer.get_run(run_id).last_error["message"] == "***"  # type: ignore[union-attr,index]
    assert viewer.audit(run_id=run_id, action="park")[0].details["message"] == "***"  # type: ignore[index]
    assert drv.ledger.verify_run(run_id) == [] and drv.ledger.verify_audit() == []


def test_provider_errors_quoting_a_sensitive_value_are_sealed(
        drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a step whose providers answer a failure, refuse, and refuse for now (counted by
    the retry policy), each quoting the customer; expect the effects' and their attempts'
    errors and the counted failure to keep type and status code plain and the provider's
    text sealed, the value in no table, the errors opened for an operator (and for the
    step: its error quotes the refusal) and masked for a viewer, re-encrypted by a
    rotation, unreadable after the tenant's erasure, and ``verify`` clean throughout."""
    customer = f"CANARY{secrets.token_hex(6)}"
    run_id = drv.ledger.start_run("test_crypt_provider_error", {"customer": customer},
                                  sensitive=("customer",))
    assert drv.drive(run_id).status is RunStatus.FAILED
    url = drv.ledger.url
    assert places_holding(url, customer) == []
    stored = rows(url, "SELECT e.effect_type, e.error, a.error FROM onward.effects e "
                       "JOIN onward.effect_attempts a USING (effect_type, effect_id) "
                       "WHERE e.run_id = %s ORDER BY e.effect_type, a.attempt", run_id)
    assert {kind for kind, _, _ in stored} == {
        "test.crypt_busy_crm", "test.crypt_failing_crm", "test.crypt_refusing_crm"}
    for _, *errors in stored:
        for error in errors:
            text = error.get("message", error.get("provider"))
            assert sealed_envelope(text) is not None, error
    refused = next(e for kind, e, _ in stored if kind == "test.crypt_refusing_crm")
    assert refused["type"] == "ToolError" and refused["status_code"] == 404
    [(counted,)] = rows(url, "SELECT last_error FROM onward.call_retries WHERE run_id = %s",
                        run_id)
    assert counted["status_code"] == 503 and sealed_envelope(counted["message"]) is not None

    def shown(ledger: Ledger) -> list[Any]:
        effects = ledger.effects(run_id)
        return [e.error for e in effects] + [
            a.error for e in effects for a in ledger.effect_attempts(e)]

    assert all(customer in json.dumps(error) for error in shown(drv.ledger))
    assert f"no CRM account for {customer}" in \
        drv.ledger.get_run(run_id).last_error["message"]  # type: ignore[union-attr,index]
    viewer = drv.ledger.acting_as("vic", "viewer")
    assert all(customer not in json.dumps(error) and "***" in json.dumps(error)
               for error in shown(viewer))
    monkeypatch.setenv("ONWARD_ENCRYPTION_KEYS", f"m1={MASTER},m2={secrets.token_hex(32)}")
    monkeypatch.setenv("ONWARD_ENCRYPTION_KEY_ID", "m2")
    report = Ledger.from_env(OnwardSettings()).rotate_keys()
    assert report.resealed["effects"] == 3 and report.resealed["effect_attempts"] >= 3
    assert report.resealed["call_retries"] == 1
    fresh = Ledger.from_env(OnwardSettings())
    assert all(customer in json.dumps(error) for error in shown(fresh))
    assert keyring_of(fresh).erase_tenant("default") >= 1
    erased = Ledger.from_env(OnwardSettings())
    assert all("*** (unreadable)" in json.dumps(error) for error in shown(erased))
    assert drv.ledger.verify_run(run_id) == []
    assert Ledger.from_env(OnwardSettings(encryption_keys=None)).verify_run(run_id) == []


def test_a_diverged_replays_report_seals_the_request_it_quotes(
        drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given an encrypted run replayed (evidence) by code whose effect asks another payload,
    which quotes the customer; expect the replay diverged, its report's request sealed in
    the run's row (the value in no table), shown opened to an operator and ``***`` to a
    viewer, and the run verified."""
    customer = f"CANARY{secrets.token_hex(6)}"
    run_id = drv.ledger.start_run("test_crypt", {"customer": customer}, sensitive=("customer",))
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    monkeypatch.setenv("ONWARD_TEST_CRYPT_VARIANT", "amount")
    launched = drv.ledger.replay(run_id, 5, "evidence", "another amount")  # before create
    replay = drv.drive(launched.run_id)
    assert replay.status is RunStatus.DIVERGED, replay.last_error
    assert replay.last_error["why"] == "request_differs"  # type: ignore[index]
    assert replay.last_error["request"]["customer"] == customer  # type: ignore[index]
    url = drv.ledger.url
    assert places_holding(url, customer) == []
    [(report,)] = rows(url, "SELECT last_error FROM onward.runs WHERE id = %s", launched.run_id)
    assert sealed_envelope(report["request"]) is not None
    viewer = drv.ledger.acting_as("vic", "viewer").get_run(launched.run_id)
    assert viewer.last_error["request"] == "***"  # type: ignore[union-attr,index]
    assert drv.ledger.verify_run(launched.run_id) == []
