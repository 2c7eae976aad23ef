"""Encryption at rest (issue 15 item 1): a state's sensitive field, the model prompt and
answer, an effect's payload and result are sealed where they are stored and opened only by
the worker; a sealed value moved to another tenant, run, seq or field does not open; MACs
and chains verify without the data keys, after a tenant's keys are erased too; rows written
before encryption was turned on still read. Real PostgreSQL; steps run by the real
executor in-process."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from ledger import Ledger, RunStatus
from ledger.checkpoints import sealed_envelope
from ledger.crypto import Keyring, Place
from ledger.db import libpq_conninfo
from ledger.exceptions import SealedValueUnreadable
from ledger.schema import metadata
from ledger.settings import OnwardSettings
from tests.support.driver import Driver, driver

pytest.importorskip("cryptography")

MASTER = secrets.token_hex(32)


@pytest.fixture()
def settings_env(database: str, server_urls: dict[str, str], tmp_path: Path) -> dict[str, str]:
    from tests.conftest import make_settings_env

    env = make_settings_env(database, server_urls, tmp_path / "faults")
    env["ONWARD_ENCRYPTION_KEYS"] = f"m1={MASTER}"
    return env


@pytest.fixture()
def drv(ledger: Ledger) -> Iterator[Driver]:
    with driver(ledger, ["tests.workflows_crypt"]) as running:
        yield running


def places_holding(url: str, text: str) -> list[str]:
    """Every onward table whose rows (each value as stored) hold ``text``."""
    found = []
    with psycopg.connect(libpq_conninfo(url)) as conn:
        for table in metadata.sorted_tables:
            for row in conn.execute(f"SELECT * FROM onward.{table.name}"):
                blob = b"".join(bytes(v) if isinstance(v, bytes | memoryview)
                                else json.dumps(v, default=str).encode() for v in row)
                if text.encode() in blob:
                    found.append(table.name)
                    break
    return found


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
    # the run's input (checkpoint 0, written by start_run) is the one plain copy
    assert places_holding(url, customer) == ["checkpoints"]
    states = rows(url, "SELECT seq, state, state_delta FROM onward.checkpoints "
                       "WHERE run_id = %s ORDER BY seq", run.id)
    assert customer in json.dumps(states[0][1])
    assert [s for s in states[1:] if customer in json.dumps(s[1:])] == []
    payload, result = rows(url, "SELECT payload, result FROM onward.effects "
                                "WHERE run_id = %s", run.id)[0]
    assert sealed_envelope(payload) is not None and sealed_envelope(result) is not None
    (response,) = rows(url, "SELECT response FROM onward.evidence WHERE run_id = %s",
                       run.id)[0]
    assert sealed_envelope(response) is not None
    assert drv.ledger.verify_run(run.id) == []
    assert run.result == {"matched": True}  # the worker opened what it was answered
    final = drv.ledger.checkpoints(run.id)[-1]
    assert sealed_envelope(final.state["echo"]) is not None


def test_an_unchanged_sensitive_field_keeps_its_envelope(drv: Driver) -> None:
    """Given steps that do not change the sensitive field; expect each checkpoint after the
    first sealed one to keep that envelope (a delta does not carry it again)."""
    run = run_one(drv, "ada@example.com")
    envelopes = {json.dumps(cp.state["customer"], sort_keys=True)
                 for cp in drv.ledger.checkpoints(run.id)[1:]}
    assert len(envelopes) == 1


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
        state = {**drv.ledger.checkpoints(run_id)[-1].state, **change}
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


def _effect_field(drv: Driver, run_id: Any, what: str) -> str:
    from ledger.effects import effect_field

    effect_type, effect_id = rows(drv.ledger.url, "SELECT effect_type, effect_id FROM "
                                  "onward.effects WHERE run_id = %s", run_id)[0]
    return effect_field(effect_type, effect_id, what)
