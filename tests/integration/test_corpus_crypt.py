"""Offline corpus replay and bundles of encrypted runs (docs/corpus.md#encrypted-runs): a
bundle carries the tenant's wrapped data keys, the replay processes get the master keys,
and the comparison opens sealed values. Real PostgreSQL; the recorded runs are driven
in-process (tests/support/driver.py), the replays as ``onward corpus replay`` runs them, in
this process (the replay processes: tests/acceptance/test_corpus_crypt.py)."""

from __future__ import annotations

import io
import json
import secrets
import threading
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import pytest
import sqlalchemy as sa

from ledger import Ledger, OnwardSettings
from ledger.bundle import read_bundle
from ledger.checkpoints import sealed_envelope
from ledger.corpora import Corpora
from ledger.corpus_bundle import load_txn
from ledger.crypto import Place
from ledger.exceptions import OperationRefused
from tasks.corpus.compare import Kind
from tasks.corpus.diff import HIDDEN
from tests.support.cluster import wait_for
from tests.support.corpus import empty_database, other_ledger
from tests.support.crypt import (  # noqa: F401 - settings_env: a fixture
    MASTER,
    MODULES,
    crypt_driver,
    record,
    replayed,
    settings_env,
)
from tests.support.driver import Driver

pytest.importorskip("cryptography")


@pytest.fixture()
def drv(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    with crypt_driver(ledger, monkeypatch) as running:
        yield running


def test_replay__an_encrypted_run_replayed_with_its_code_is_identical(
        drv: Driver, settings: OnwardSettings) -> None:
    """Invariant: a corpus of an encrypted run (sensitive state fields, a sealed model
    answer, effect and result) replays in a scratch ledger, in this process, and is
    reported identical, every checkpoint compared: the scratch ledger opens its values with
    the bundle's wrapped data keys, and sealed values compare by what they hold, not by
    their (always new) ciphertext. (In replay processes: tests/acceptance.)"""
    run_id = record(drv, f"CANARY{secrets.token_hex(6)}")
    (outcome,) = replayed(drv, settings)
    assert outcome.run_id == str(run_id)
    assert outcome.identical, outcome.finding
    assert outcome.replay_status == "completed"
    assert outcome.steps_replayed == outcome.steps_recorded == 8
    assert outcome.same_effect_keys


def test_replay__a_changed_sensitive_value_is_a_divergence_that_does_not_show_it(
        drv: Driver, settings: OnwardSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: candidate code that keeps another value in a sensitive field is reported
    as a state divergence at that step, naming the field, with neither value in the
    report (reports go to CI logs)."""
    customer = f"CANARY{secrets.token_hex(6)}"
    record(drv, customer)
    monkeypatch.setenv("ONWARD_TEST_CRYPT_VARIANT", "echo")
    (outcome,) = replayed(drv, settings)
    finding = outcome.finding or {}
    assert (finding.get("kind"), finding.get("step")) == (Kind.STATE.value, "create"), finding
    assert finding["diff"] == [f"~ /echo: {HIDDEN}"]
    assert customer not in json.dumps(outcome.as_json())


def test_replay__a_request_that_differs_is_reported_without_showing_it(
        drv: Driver, settings: OnwardSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: candidate code whose effect asks another payload (which quotes the
    sensitive customer) is a request divergence at that step whose report gives the two
    request hashes, neither payload (the recorded one is sealed, the replay's report seals
    the replay's)."""
    customer = f"CANARY{secrets.token_hex(6)}"
    record(drv, customer)
    monkeypatch.setenv("ONWARD_TEST_CRYPT_VARIANT", "amount")
    (outcome,) = replayed(drv, settings)
    finding = outcome.finding or {}
    assert (finding.get("kind"), finding.get("step")) == (Kind.REQUEST.value, "create"), finding
    assert [line.endswith("(stored sealed: not shown)") for line in finding["diff"]] == [True]
    assert customer not in json.dumps(outcome.as_json())


def test_bundle__carries_the_wrapped_keys_and_opens_in_another_ledger(
        drv: Driver, settings: OnwardSettings, server_urls: dict[str, str],
        template_database: str) -> None:
    """Invariant: an exported bundle carries the tenant's data keys wrapped (never the
    master key), so a second ledger with the same master keys opens the imported run's
    values, although its tenant already has an active data key of its own (imported keys
    arrive retired: they open, never seal). A bundle without keys (written before they were
    carried) still loads, its values unreadable there until the keys arrive."""
    run_id = record(drv, "ada@example.com")
    out = io.BytesIO()
    Corpora(drv.ledger).export("c", out)
    data = out.getvalue()
    assert MASTER.encode() not in data
    bundle = read_bundle(data, drv.ledger.keys)
    assert [k["state"] for k in bundle.rows.get("tenant_keys", [])] == ["active"]
    assert sealed_envelope(bundle.rows["runs"][0]["result"]) is not None
    with empty_database(server_urls, template_database, "onward_crypt") as url, \
            other_ledger(url, settings) as target:
        crypt = target.keys.crypt
        assert crypt is not None
        crypt.use_engine(target.engine)
        crypt.seal("own", Place(target.actor.tenant_id, uuid4(), 1, "f"))  # its own key
        Corpora(target).import_bundle(read_bundle(without_keys(data, drv), drv.ledger.keys))
        assert target.verify_run(run_id) == []  # a bundle without keys loads as before
        assert target.get_run(run_id).result == "*** (unreadable)"
        assert Corpora(target).import_bundle(bundle).added == []  # the run: already there
        assert target.get_run(run_id).result == {"matched": True}  # its keys: added
        assert target.checkpoints(run_id)[-1].state["echo"] == "ada@example.com"
        assert Corpora(target).import_bundle(bundle).added == []


def without_keys(data: bytes, drv: Driver) -> bytes:
    """The bundle as one written before bundles carried keys (trailer signed again)."""
    import hashlib

    from ledger.bundle import bundle_mac_body

    lines = [line for line in data.splitlines(keepends=True)
             if b'"t":"tenant_keys"' not in line]
    digest = hashlib.sha256(b"".join(lines[:-1])).hexdigest()
    trailer = json.loads(lines[-1])
    trailer.update(digest=digest, mac=drv.ledger.keys.sign(bundle_mac_body(digest)))
    trailer["counts"].pop("tenant_keys", None)
    return b"".join(lines[:-1]) + json.dumps(trailer).encode() + b"\n"


def live_keys(ledger: Ledger) -> list[str]:
    """The data keys of the ledger's tenant that were not destroyed."""
    with ledger.engine.connect() as conn:
        return list(conn.execute(sa.text(
            "SELECT key_id FROM onward.tenant_keys WHERE tenant_id = :t "
            "AND state <> 'destroyed' ORDER BY key_id"), {"t": ledger.actor.tenant_id})
            .scalars())


def erased_target(target: Ledger) -> None:
    """The target's tenant had a data key of its own, and erased it."""
    crypt = target.keys.crypt
    assert crypt is not None
    crypt.use_engine(target.engine)
    crypt.seal("own", Place(target.actor.tenant_id, uuid4(), 1, "f"))
    assert target.erase_tenant_keys("erasure request") == 1
    assert live_keys(target) == []


def test_bundle__keys_of_an_erased_tenant_are_refused(
        drv: Driver, settings: OnwardSettings, server_urls: dict[str, str],
        template_database: str) -> None:
    """Invariant: erasure wins over an import. A bundle carrying data keys of a tenant
    whose keys were erased in the target ledger is refused (OperationRefused naming the
    erasure), with nothing written: no run, no key, no corpus. Imported without its keys
    (``without_keys``, `--without-keys`), the runs load and verify, their sealed values
    unreadable; the keys arriving later (the same bundle imported again with them) are
    refused too. Failed before: the import re-inserted the keys and the erased tenant's
    imported values read again ({"matched": True})."""
    run_id = record(drv, "ada@example.com")
    out = io.BytesIO()
    Corpora(drv.ledger).export("c", out)
    bundle = read_bundle(out.getvalue(), drv.ledger.keys)
    with empty_database(server_urls, template_database, "onward_erased") as url, \
            other_ledger(url, settings) as target:
        erased_target(target)
        with pytest.raises(OperationRefused, match="erased in this ledger"):
            Corpora(target).import_bundle(bundle)
        assert target.get_run(run_id) is None
        assert live_keys(target) == [] and Corpora(target).all() == []
        imported = Corpora(target).import_bundle(bundle, without_keys=True)
        assert (imported.added, imported.keys_dropped) == ([run_id], 1)
        assert target.verify_run(run_id) == []
        assert target.get_run(run_id).result == "*** (unreadable)"
        with pytest.raises(OperationRefused, match="erased in this ledger"):
            Corpora(target).import_bundle(bundle)
        assert live_keys(target) == []
        assert target.get_run(run_id).result == "*** (unreadable)"
        refused = [a.outcome for a in target.audit(action="corpus_import")]
        assert sorted(refused) == ["done", "refused", "refused"]


def test_bundle__an_erasure_during_an_import_destroys_the_imported_keys(
        drv: Driver, settings: OnwardSettings, server_urls: dict[str, str],
        template_database: str) -> None:
    """Invariant: an erasure that begins while an import of the tenant's keys is under way
    waits for it and then destroys those keys too (both take the tenant's key lock), so
    no key of an erased tenant outlives the erasure. Failed before: the erasure did not
    see the import's uncommitted keys and they stayed live after it."""
    record(drv, "ada@example.com")
    out = io.BytesIO()
    Corpora(drv.ledger).export("c", out)
    bundle = read_bundle(out.getvalue(), drv.ledger.keys)
    with empty_database(server_urls, template_database, "onward_erasing") as url, \
            other_ledger(url, settings) as target:
        target.keys.crypt.use_engine(target.engine)  # type: ignore[union-attr]
        erased: list[int] = []
        with target.engine.begin() as conn:
            assert load_txn(conn, bundle, target.actor.tenant_id).counts["tenant_keys"] == 1
            erasing = threading.Thread(
                target=lambda: erased.append(target.erase_tenant_keys("erasure request")))
            erasing.start()
            wait_for(lambda: not erasing.is_alive() or advisory_waits(url) == 1,
                     timeout=20, what="the erasure to wait for the import")
        erasing.join(timeout=20)
        assert erased == [1] and live_keys(target) == []


def advisory_waits(url: str) -> int:
    """Backends of that database waiting for an advisory lock."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND wait_event = 'advisory'")).scalar_one())
    finally:
        engine.dispose()


def key_rows(ledger: Ledger) -> list[tuple[object, ...]]:
    with ledger.engine.connect() as conn:
        return [tuple(row) for row in conn.execute(sa.text(
            "SELECT key_id, state, master_key_id, wrapped FROM onward.tenant_keys "
            "ORDER BY key_id"))]


def sealed_rows(ledger: Ledger) -> list[tuple[object, ...]]:
    """Every column rotation rewrites, as stored."""
    with ledger.engine.connect() as conn:
        return [tuple(row) for table, cols in (
            ("effects", "payload, result"), ("evidence", "response"),
            ("checkpoints", "state, state_delta"), ("runs", "result, last_error"),
            ("signals", "payload")) for row in conn.execute(sa.text(
                f"SELECT {cols} FROM onward.{table} ORDER BY 1::text"))]


def test_rotate__refuses_an_imported_key_whose_master_key_is_missing_then_resumes(
        drv: Driver, settings: OnwardSettings, server_urls: dict[str, str],
        template_database: str) -> None:
    """Invariant: `onward keys rotate` in a ledger that lacks the master key wrapping an
    imported (retired) data key is refused before it changes anything (no key rewrapped,
    retired or made, no value re-encrypted; the refusal audited), with an error naming the
    missing master key and what to do; once that key is configured beside the active one,
    the rotation runs through, and afterwards the imported run opens with the active master
    key alone."""
    from pydantic import SecretStr

    run_id = record(drv, "ada@example.com")
    out = io.BytesIO()
    Corpora(drv.ledger).export("c", out)
    bundle = read_bundle(out.getvalue(), drv.ledger.keys)
    own = secrets.token_hex(32)
    only_m2 = settings.model_copy(update={"encryption_keys": SecretStr(f"m2={own}"),
                                          "encryption_key_id": "m2"})
    both = settings.model_copy(update={"encryption_keys": SecretStr(f"m1={MASTER},m2={own}"),
                                       "encryption_key_id": "m2"})
    with empty_database(server_urls, template_database, "onward_rotate") as url:
        with other_ledger(url, only_m2) as target:
            keyring_of_ledger(target).seal("own", Place(target.actor.tenant_id, uuid4(), 1, "f"))
            Corpora(target).import_bundle(bundle)
            assert target.get_run(run_id).result == "*** (unreadable)"  # m1 is not here
            keys, values = key_rows(target), sealed_rows(target)
            with pytest.raises(OperationRefused, match=r"master key.*m1") as refused:
                target.rotate_keys()
            assert "Nothing was changed" in str(refused.value)
            assert "ONWARD_ENCRYPTION_KEYS" in str(refused.value)
            assert (key_rows(target), sealed_rows(target)) == (keys, values)
            assert [a.outcome for a in target.audit(action="keys")] == ["refused"]
        with other_ledger(url, both) as supplied:
            report = supplied.rotate_keys()
            assert report.masters_in_use == ["m2"] and report.rewrapped == 1
            assert sum(report.unreadable.values()) == 0
        with other_ledger(url, only_m2) as after:
            assert after.get_run(run_id).result == {"matched": True}
            assert after.verify_run(run_id) == []


def keyring_of_ledger(ledger: Ledger) -> Any:
    crypt = ledger.keys.crypt
    assert crypt is not None
    crypt.use_engine(ledger.engine)
    return crypt


def test_replay__open_branches_from_an_encrypted_scratch_ledger(
        drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: ``onward corpus replay c --open-branches`` of an encrypted run whose
    candidate code diverges opens the replay under its recorded run: it verifies (with and
    without the keys), an admin reads its states opened (the sealed values the scratch
    ledger wrote open here), a viewer masked, and the customer is in no table in the
    clear."""
    from typer.testing import CliRunner

    from console.cli import app

    customer = f"CANARY{secrets.token_hex(6)}"
    run_id = record(drv, customer)
    monkeypatch.setenv("ONWARD_TEST_CRYPT_VARIANT", "echo")
    monkeypatch.setenv("ONWARD_AUTH", "off")
    result = CliRunner().invoke(app, [
        "corpus", "replay", "c", "--code", "tests.workflows_crypt", "--jobs", "1",
        "--open-branches", "--reason", "look at the echo"], env={"COLUMNS": "220"})
    assert result.exit_code == 1, result.output
    assert customer not in result.output
    [child] = drv.ledger.children(run_id)
    assert drv.ledger.verify_run(child.id) == []
    assert Ledger.from_env(OnwardSettings(encryption_keys=None)).verify_run(child.id) == []
    states = [c.state for c in drv.ledger.checkpoints(child.id)]
    assert states[-1]["customer"] == customer and states[-1]["echo"] == customer + "!"  # type: ignore[index]
    viewer = drv.ledger.acting_as("vic", "viewer").checkpoints(child.id)
    assert viewer[-1].state["customer"] == "***"  # type: ignore[index]
    from tests.support.reads import places_holding

    assert places_holding(drv.ledger.url, customer) == []
