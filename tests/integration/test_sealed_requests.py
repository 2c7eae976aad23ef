"""A model call's request kept sealed beside its answer (docs/corpus.md#encrypted-runs):
never plain at rest, opened only for a reader allowed to see sealed values who asks for it
(``onward corpus replay --show-sealed``, audited, refused to a viewer), bound to its place,
carried by bundles, re-encrypted by ``keys rotate``, dropped with the answer by retention.
Real PostgreSQL; runs driven in-process (tests/support/driver.py), replays in this process."""

from __future__ import annotations

import io
import json
import secrets
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from console.cli import app
from ledger import Ledger, OnwardSettings, RunStatus
from ledger.bundle import DropPolicy, read_bundle
from ledger.checkpoints import sealed_envelope
from ledger.corpora import Corpora
from ledger.corpus_history import recorded_request_txn
from ledger.exceptions import SealedValueUnreadable
from ledger.retention import Kind as RetentionKind
from ledger.retention import compact_run_txn
from ledger.tokens import TokenRequest
from ledger.vocabulary import Role
from tasks.corpus.compare import Kind
from tasks.corpus.replayer import ReplayOptions
from tasks.corpus.runner import replay_bundle
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
from tests.support.reads import places_holding

pytest.importorskip("cryptography")


@pytest.fixture()
def drv(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    with crypt_driver(ledger, monkeypatch) as running:
        yield running


def finished(drv: Driver, customer: str) -> UUID:
    """A completed ``test_crypt`` run in no corpus (retention may compact it)."""
    run_id = drv.ledger.start_run("test_crypt", {"customer": customer})
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    return run_id


def stored(ledger: Ledger, run_id: UUID) -> dict[str, Any]:
    """The run's one evidence row (its model call), as stored."""
    with ledger.engine.connect() as conn:
        [row] = conn.execute(sa.text("SELECT * FROM onward.evidence WHERE run_id = :r"),
                             {"r": run_id}).mappings().all()
    return dict(row)


def asked(ledger: Ledger, run_id: UUID, command_id: str, *, opened: bool = True) -> Any:
    """What the recorded call asked, opened with ``ledger``'s keys (``opened``)."""
    crypt = ledger.keys.crypt if opened else None
    if crypt is not None:
        crypt.use_engine(ledger.engine)
    with ledger.engine.connect() as conn:
        kept, request = recorded_request_txn(conn, run_id, "llm", command_id, crypt=crypt,
                                             tenant=ledger.actor.tenant_id)
    assert kept
    return request


def prompt(request: Any) -> str:
    return str(request["messages"][0]["content"])


def test_record__the_request_is_sealed_in_its_evidence_row_and_opens_at_its_place(
        drv: Driver) -> None:
    """Invariant: with encryption keys, a model call's request (which quotes a sensitive
    value) is kept sealed in its evidence row, in no table in the clear (no plain artifact
    of it either), and opens at its place to what its request hash names."""
    customer = f"CANARY{secrets.token_hex(6)}"
    run_id = finished(drv, customer)
    row = stored(drv.ledger, run_id)
    assert sealed_envelope(row["request"]) is not None
    assert customer not in json.dumps(row, default=str)
    assert places_holding(drv.ledger.url, customer) == []
    assert sealed_envelope(asked(drv.ledger, run_id, row["command_id"], opened=False))
    assert prompt(asked(drv.ledger, run_id, row["command_id"])) == \
        f"offer for {customer}: 10 EUR"


def test_a_sealed_request_moved_to_another_run_or_seq_does_not_open(drv: Driver) -> None:
    """Invariant: a sealed request is bound to its tenant, run, seq and field: copied into
    another run's evidence row, or its row moved to another seq (with or without the
    envelope's seq hint edited to match), it does not open."""
    first, second = finished(drv, "ada@example.com"), finished(drv, "bob@example.com")
    moved, into = stored(drv.ledger, first), stored(drv.ledger, second)
    assert moved["command_id"] == into["command_id"]  # the same call: only the run differs
    with drv.ledger.engine.begin() as conn:
        conn.execute(sa.text("UPDATE onward.evidence SET request = CAST(:r AS jsonb) "
                             "WHERE run_id = :run"),
                     {"r": json.dumps(moved["request"]), "run": second})
    with pytest.raises(SealedValueUnreadable, match="does not open"):
        asked(drv.ledger, second, into["command_id"])
    assert prompt(asked(drv.ledger, first, moved["command_id"])).startswith("offer for ada")
    envelope = dict(moved["request"]["$sealed"], s=moved["seq"] + 1)
    for request, match in ((moved["request"], "names seq"),
                           ({"$sealed": envelope}, "does not open")):
        with drv.ledger.engine.begin() as conn:
            conn.execute(sa.text("UPDATE onward.evidence SET seq = seq + 1, "
                                 "request = CAST(:r AS jsonb) WHERE run_id = :run"),
                         {"r": json.dumps(request), "run": first})
        with pytest.raises(SealedValueUnreadable, match=match):
            asked(drv.ledger, first, moved["command_id"])
        with drv.ledger.engine.begin() as conn:
            conn.execute(sa.text("UPDATE onward.evidence SET seq = seq - 1 WHERE run_id = :run"),
                         {"run": first})


def test_replay__the_request_diff_is_shown_only_with_show_sealed(
        drv: Driver, settings: OnwardSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: candidate code whose model call asks something else is a request
    divergence; its report gives the two hashes and no prompt, unless the replay is asked
    to show sealed values: then it is the diff of the two prompts, both opened."""
    customer = f"CANARY{secrets.token_hex(6)}"
    record(drv, customer)
    monkeypatch.setenv("ONWARD_TEST_CRYPT_VARIANT", "prompt")
    (hidden,) = replayed(drv, settings)
    finding = hidden.finding or {}
    assert (finding.get("kind"), finding.get("step")) == (Kind.REQUEST.value, "draft"), finding
    assert [line.endswith("(stored sealed: not shown)") for line in finding["diff"]] == [True]
    assert customer not in json.dumps(hidden.as_json())

    bundle = read_bundle(Corpora(drv.ledger).snapshot("c"), drv.ledger.keys)
    options = ReplayOptions(MODULES, label="c", show_sealed=True)
    (shown,) = replay_bundle(settings, bundle, options, jobs=1).outcomes
    diff = (shown.finding or {})["diff"]
    assert f"-offer for {customer}: 10 EUR" in diff, diff
    assert f"+offer for {customer}: 10 EUR, please" in diff, diff


def test_cli__show_sealed_is_refused_to_a_viewer_and_audited(
        drv: Driver, settings_env: dict[str, str],  # noqa: F811 - the fixture imported
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: ``onward corpus replay --show-sealed`` prints the prompts' diff to an
    approver, operator or admin, and is refused to a viewer (exit 2, a clear error, nothing
    replayed); both are audited (``show_sealed``). Without the flag, an admin's report
    shows the hashes only (reports go to files and CI logs)."""
    customer = f"CANARY{secrets.token_hex(6)}"
    record(drv, customer)
    for key, value in {**settings_env, "ONWARD_TEST_CRYPT_VARIANT": "prompt"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("ONWARD_AUTH", raising=False)
    tokens = {role: drv.ledger.create_token(TokenRequest(
        "olga", Role(role), drv.ledger.actor.tenant_id, timedelta(hours=1))).secret
              for role in ("viewer", "admin")}

    def replay(role: str, *flags: str) -> Any:
        return CliRunner().invoke(app, ["corpus", "replay", "c", "--code", ",".join(MODULES),
                                        "--jobs", "1", *flags],
                                  env={"COLUMNS": "220", "ONWARD_TOKEN": tokens[role]})

    refused = replay("viewer", "--show-sealed")
    assert refused.exit_code == 2, refused.output
    assert "show_sealed needs the approver role" in refused.output
    assert customer not in refused.output and "request_differs" not in refused.output
    plain = replay("admin")
    assert plain.exit_code == 1, plain.output
    assert "(stored sealed: not shown)" in plain.output and customer not in plain.output
    assert "--show-sealed shows its diff" in plain.output
    shown = replay("admin", "--show-sealed")
    assert shown.exit_code == 1, shown.output
    assert f"+offer for {customer}: 10 EUR, please" in shown.output
    audit = drv.ledger.audit(action="show_sealed")
    assert [(a.role, a.outcome) for a in audit] == [("admin", "done"), ("viewer", "refused")]
    assert audit[0].details == {"source": "c", "code": list(MODULES)}


def test_the_sealed_request_survives_export_import_and_rotation(
        drv: Driver, settings: OnwardSettings, server_urls: dict[str, str],
        template_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: a bundle carries the sealed request as stored (and ``--drop-field
    requests`` leaves it out); imported into another ledger with the same master key, it
    opens there. ``keys rotate`` re-encrypts it under the new data key (another
    ciphertext, the same digest), and it still opens."""
    customer = f"CANARY{secrets.token_hex(6)}"
    run_id = record(drv, customer)
    row = stored(drv.ledger, run_id)
    out = io.BytesIO()
    Corpora(drv.ledger).export("c", out)
    assert customer.encode() not in out.getvalue()
    bundle = read_bundle(out.getvalue(), drv.ledger.keys)
    [carried] = bundle.rows["evidence"]
    assert carried["request"] == row["request"]
    dropped = io.BytesIO()
    Corpora(drv.ledger).export("c", dropped, DropPolicy(("requests",)))
    assert [r["request"] for r in read_bundle(dropped.getvalue(),
                                              drv.ledger.keys).rows["evidence"]] == [None]
    with empty_database(server_urls, template_database, "onward_sealreq") as url, \
            other_ledger(url, settings) as target:
        Corpora(target).import_bundle(bundle)
        assert stored(target, run_id)["request"] == row["request"]
        assert prompt(asked(target, run_id, row["command_id"])) == f"offer for {customer}: 10 EUR"

    monkeypatch.setenv("ONWARD_ENCRYPTION_KEYS", f"m1={MASTER},m2={secrets.token_hex(32)}")
    monkeypatch.setenv("ONWARD_ENCRYPTION_KEY_ID", "m2")
    rotated = Ledger.from_env(OnwardSettings())
    report = rotated.rotate_keys()
    assert report.resealed["evidence"] == 1 and report.unreadable["evidence"] == 0
    after = stored(rotated, run_id)["request"]["$sealed"]
    before = row["request"]["$sealed"]
    assert (after["k"], after["c"]) != (before["k"], before["c"]) and after["d"] == before["d"]
    assert prompt(asked(rotated, run_id, row["command_id"])) == f"offer for {customer}: 10 EUR"
    assert rotated.verify_run(run_id) == []


def test_retention__compacting_the_evidence_drops_the_sealed_request(drv: Driver) -> None:
    """Invariant: when retention compacts a run's evidence, the sealed request goes with the
    answer (the MAC still signs the request hash): the run verifies, no request is left."""
    run_id = finished(drv, "ada@example.com")
    assert stored(drv.ledger, run_id)["request"] is not None
    with drv.ledger.engine.begin() as conn:
        compact_run_txn(conn, drv.ledger.keys, run_id, frozenset({RetentionKind.EVIDENCE}))
    row = stored(drv.ledger, run_id)
    assert row["request"] is None and list(row["response"]) == ["$compacted"]
    assert drv.ledger.verify_run(run_id) == []
    with drv.ledger.engine.connect() as conn:
        assert recorded_request_txn(conn, run_id, "llm", row["command_id"]) == (False, None)
