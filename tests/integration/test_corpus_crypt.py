"""Offline corpus replay and bundles of encrypted runs (docs/corpus.md#encrypted-runs): a
bundle carries the tenant's wrapped data keys, the replay processes get the master keys,
and the comparison opens sealed values. Real PostgreSQL; the recorded runs are driven
in-process (tests/support/driver.py), the replays as ``onward corpus replay`` runs them."""

from __future__ import annotations

import io
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID, uuid4

import pytest

from ledger import Ledger, OnwardSettings, RunStatus
from ledger.bundle import read_bundle
from ledger.checkpoints import sealed_envelope
from ledger.corpora import Corpora
from ledger.corpus import Selection
from ledger.crypto import Place
from tasks.corpus.compare import Kind
from tasks.corpus.diff import HIDDEN
from tasks.corpus.replayer import ReplayOptions, RunOutcome
from tasks.corpus.runner import replay_bundle
from tests.support.corpus import empty_database, other_ledger
from tests.support.driver import Driver, driver

pytest.importorskip("cryptography")

MASTER = secrets.token_hex(32)
MODULES = ("tests.workflows_crypt",)


@pytest.fixture()
def settings_env(database: str, server_urls: dict[str, str], tmp_path: Path) -> dict[str, str]:
    from tests.conftest import make_settings_env

    env = make_settings_env(database, server_urls, tmp_path / "faults")
    env["ONWARD_ENCRYPTION_KEYS"] = f"m1={MASTER}"
    return env


@pytest.fixture()
def drv(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    monkeypatch.delenv("ONWARD_TEST_CRYPT_VARIANT", raising=False)
    with driver(ledger, list(MODULES)) as running:
        yield running


def record(drv: Driver, customer: str) -> UUID:
    """A completed ``test_crypt`` run (its customer sealed in every checkpoint after the
    first, in its model call and effect), pinned in corpus ``c``."""
    run_id = drv.ledger.start_run("test_crypt", {"customer": customer})
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED and run.result == {"matched": True}, run
    Corpora(drv.ledger).add("c", Selection())
    return run_id


def replayed(drv: Driver, settings: OnwardSettings, jobs: int) -> RunOutcome:
    bundle = read_bundle(Corpora(drv.ledger).snapshot("c"), drv.ledger.keys)
    result = replay_bundle(settings, bundle, ReplayOptions(MODULES, label="c"), jobs=jobs)
    (outcome,) = result.outcomes
    return outcome


@pytest.mark.parametrize("jobs", [1, 2])
def test_replay__an_encrypted_run_replayed_with_its_code_is_identical(
        drv: Driver, settings: OnwardSettings, jobs: int) -> None:
    """Invariant: a corpus of an encrypted run (sensitive state fields, a sealed model
    answer, effect and result) replays in a scratch ledger, in this process and in replay
    processes (which get the master keys), and is reported identical, every checkpoint
    compared: the scratch ledger opens its values with the bundle's wrapped data keys, and
    sealed values compare by what they hold, not by their (always new) ciphertext."""
    run_id = record(drv, f"CANARY{secrets.token_hex(6)}")
    outcome = replayed(drv, settings, jobs)
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
    outcome = replayed(drv, settings, 1)
    finding = outcome.finding or {}
    assert (finding.get("kind"), finding.get("step")) == (Kind.STATE.value, "create"), finding
    assert finding["diff"] == [f"~ /echo: {HIDDEN}"]
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
