"""Corpora against a real PostgreSQL: pinning recorded runs, the pins retention must keep,
and bundles (export, import into another ledger, and what an import refuses). Runs are
recorded in-process through the real executor (tests/support/driver.py)."""

from __future__ import annotations

import gzip
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from ledger import Ledger, OnwardSettings, RunStatus
from ledger.bundle import DropPolicy, read_bundle
from ledger.checkpoints import CheckpointKeys
from ledger.corpora import Corpora
from ledger.corpus import Selection
from ledger.corpus_bundle import load_txn
from ledger.exceptions import IntegrityViolation, InvalidInput, OperationRefused
from ledger.vocabulary import Role
from ledger.waits import signal_txn
from tests.support.cluster import wait_for
from tests.support.corpus import (
    OPS_MODULES,
    empty_database,
    ops_driver,
    other_ledger,
    record_flow,
    record_note,
    row_counts,
)
from tests.support.driver import Driver


@pytest.fixture()
def drv(ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    with ops_driver(ledger, tmp_path / "tool.log", monkeypatch) as running:
        yield running


@pytest.fixture()
def second_url(server_urls: dict[str, str], template_database: str) -> Iterator[str]:
    with empty_database(server_urls, template_database, "onward_import") as url:
        yield url


def exported(corpora: Corpora, name: str, drop: DropPolicy | None = None) -> bytes:
    out = io.BytesIO()
    corpora.export(name, out, drop)
    return out.getvalue()


def test_corpus_add__pins_stopped_recorded_runs_by_filter_and_refuses_the_rest(
        drv: Driver) -> None:
    """Invariant: a corpus pins runs that stopped and made their own calls. A filter picks
    only those (not a running run, not a replay); naming a running run or a replay by id is
    refused with nothing pinned; pinning again adds nothing twice; each add is audited."""
    done = [record_note(drv, f"t{i}") for i in range(3)]
    running = drv.ledger.start_run("test_ops_notes", {"topic": "later"})
    replay = drv.ledger.replay(done[0], 0, "evidence", "look").run_id
    drv.drive(replay)
    corpora = Corpora(drv.ledger)

    pinned = corpora.add("notes", Selection(workflow="test_ops_notes"), "nightly")
    assert (pinned.added, pinned.already) == (3, 0)
    assert set(pinned.run_ids) == set(done)
    again = corpora.add("notes", Selection(statuses=(RunStatus.COMPLETED,)))
    assert (again.added, again.already) == (0, 3)
    with pytest.raises(OperationRefused, match="is running"):
        corpora.add("notes", Selection(run_ids=(running,)))
    with pytest.raises(OperationRefused, match=f"is an evidence replay of run {done[0]}"):
        corpora.add("notes", Selection(run_ids=(replay,)))
    with pytest.raises(OperationRefused, match="no run matches"):
        corpora.add("none", Selection(workflow="no_such_workflow"))
    assert [c.name for c in corpora.all()] == ["notes"]
    assert [r.run_id for r in corpora.runs("notes")] == sorted(done)
    actions = [(a.action, a.outcome) for a in drv.ledger.audit(action="corpus_add")]
    assert actions.count(("corpus_add", "done")) == 2
    assert actions.count(("corpus_add", "refused")) == 3


def test_corpus__a_pinned_run_cannot_be_deleted_until_unpinned(drv: Driver) -> None:
    """Invariant: retention cannot lose a pinned run by mistake: the ledger refuses to
    delete a run while a corpus pins it (foreign key), and ``pinned`` names it."""
    run_id = record_note(drv, "keep")
    corpora = Corpora(drv.ledger)
    corpora.add("keep", Selection(run_ids=(run_id,)))
    assert corpora.pinned([run_id]) == {run_id}
    with pytest.raises(sa.exc.IntegrityError), drv.ledger.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM onward.runs WHERE id = :id"), {"id": run_id})
    assert corpora.remove("keep", (run_id,), "done with it") == 1
    assert corpora.pinned([run_id]) == set()


def test_corpus_export_import__a_fresh_ledger_gets_the_same_verified_history(
        drv: Driver, second_url: str, settings: OnwardSettings) -> None:
    """Invariant: a bundle carries the runs as stored: imported into another ledger, every
    checkpoint hash, evidence, effect (with attempts), approval and step attempt is the
    same, every run verifies there, and the runs are pinned under the corpus's name.
    Importing it again adds nothing."""
    runs = [record_note(drv, "a"), record_note(drv, "b", approve=True)]
    corpora = Corpora(drv.ledger)
    corpora.add("suite", Selection(run_ids=tuple(runs)))
    data = exported(corpora, "suite")
    bundle = read_bundle(data, drv.ledger.keys)
    assert sorted(bundle.run_ids) == sorted(runs)
    with other_ledger(second_url, settings) as target:
        imported = Corpora(target).import_bundle(bundle)
        assert sorted(imported.added) == sorted(runs) and imported.pinned == 2
        for run_id in runs:
            assert target.verify_run(run_id) == []
            assert [c.identity.hash for c in target.checkpoints(run_id)] == \
                   [c.identity.hash for c in drv.ledger.checkpoints(run_id)]
            assert [(e.effect_id, e.status, e.result) for e in target.effects(run_id)] == \
                   [(e.effect_id, e.status, e.result) for e in drv.ledger.effects(run_id)]
            assert target.model_calls(run_id) == drv.ledger.model_calls(run_id)
        source_counts, target_counts = row_counts(drv.ledger.engine), row_counts(target.engine)
        for table in ("runs", "checkpoints", "evidence", "effects", "effect_attempts",
                      "approvals", "step_attempts"):
            assert target_counts[table] == source_counts[table] > 0, table
        assert [r.run_id for r in Corpora(target).runs("suite")] == sorted(runs)
        again = Corpora(target).import_bundle(bundle)
        assert (again.added, sorted(again.present)) == ([], sorted(runs))
        assert row_counts(target.engine)["checkpoints"] == target_counts["checkpoints"]
        audit = [a.action for a in target.audit(action="corpus_import")]
        assert audit == ["corpus_import", "corpus_import"]
    assert [a.action for a in drv.ledger.audit(action="corpus_export")] == ["corpus_export"]


def _rewrite(data: bytes, edit: str, replacement: str) -> bytes:
    text = gzip.decompress(data).decode() if data[:2] == b"\x1f\x8b" else data.decode()
    assert edit in text
    return text.replace(edit, replacement, 1).encode()


def _resign(data: bytes, keys: CheckpointKeys) -> bytes:
    """The bundle with its trailer recomputed: what someone holding the key could write."""
    import hashlib

    from ledger.bundle import bundle_mac_body
    lines = data.splitlines(keepends=True)
    digest = hashlib.sha256(b"".join(lines[:-1])).hexdigest()
    trailer = json.loads(lines[-1])
    trailer.update(digest=digest, mac=keys.sign(bundle_mac_body(digest)))
    return b"".join(lines[:-1]) + json.dumps(trailer).encode() + b"\n"


def test_corpus_import__a_bundle_written_before_recipients_were_signed_leaves_them_out(
        drv: Driver, second_url: str, settings: OnwardSettings) -> None:
    """Invariant: effects' recipients travel with their MAC (migration 0047), so a bundle
    keeps them; a bundle written before (its effect rows have no recipient_mac) imports
    with the recipients left out, as --drop-field would: nothing vouches for that text, and
    the runs verify."""
    run_id = record_note(drv, "r")
    Corpora(drv.ledger).add("suite", Selection(run_ids=(run_id,)))
    data = exported(Corpora(drv.ledger), "suite")
    kept = [r["recipient"] for r in read_bundle(data, drv.ledger.keys).rows["effects"]]
    assert "news" in kept
    text = gzip.decompress(data).decode() if data[:2] == b"\x1f\x8b" else data.decode()
    lines = text.splitlines(keepends=True)
    for number, line in enumerate(lines[1:-1], start=1):
        entry = json.loads(line)
        if entry.get("t") == "effects":
            entry["r"].pop("recipient_mac")
            lines[number] = json.dumps(entry) + "\n"
    older = _resign("".join(lines).encode(), drv.ledger.keys)
    bundle = read_bundle(older, drv.ledger.keys)
    assert [r["recipient"] for r in bundle.rows["effects"]] == [None] * len(kept)
    with other_ledger(second_url, settings) as target:
        assert Corpora(target).import_bundle(bundle).added == [run_id]
        assert target.verify_run(run_id) == []
        assert {e.recipient for e in target.effects(run_id)} == {None}


def test_corpus_import__refuses_a_bundle_that_does_not_verify_and_writes_nothing(
        drv: Driver, second_url: str, settings: OnwardSettings) -> None:
    """Invariant: an import checks the bundle's digest, then its MAC, then every run: an
    edited byte (digest), an edit with a recomputed digest (MAC), a bundle signed by another
    key, or a re-signed bundle whose checkpoint was edited (the checkpoint's own MAC) is each
    refused, and the target ledger gains no row."""
    run_id = record_note(drv, "tamper")
    corpora = Corpora(drv.ledger)
    corpora.add("t", Selection(run_ids=(run_id,)))
    data = exported(corpora, "t")
    summary = next(c.state["summary"] for c in drv.ledger.checkpoints(run_id)
                   if c.state.get("summary"))
    edited = _rewrite(data, summary, summary.upper())
    with pytest.raises(IntegrityViolation, match="changed after export"):
        read_bundle(edited, drv.ledger.keys)
    lines = edited.splitlines(keepends=True)
    import hashlib
    forged = json.loads(lines[-1])
    forged["digest"] = hashlib.sha256(b"".join(lines[:-1])).hexdigest()
    with pytest.raises(IntegrityViolation, match="does not match its MAC"):
        read_bundle(b"".join(lines[:-1]) + json.dumps(forged).encode() + b"\n",
                    drv.ledger.keys)
    other_keys = CheckpointKeys("k9", {"k9": b"another ledger's key"})
    with pytest.raises(IntegrityViolation, match="not configured here"):
        read_bundle(data, other_keys)
    resigned = read_bundle(_resign(edited, drv.ledger.keys), drv.ledger.keys)
    with other_ledger(second_url, settings) as target:
        before = row_counts(target.engine)
        with pytest.raises(IntegrityViolation, match="does not match its MAC"):
            Corpora(target).import_bundle(resigned)
        assert row_counts(target.engine) == {**before, "audit": before["audit"] + 1}
        assert [(a.action, a.outcome) for a in target.audit()] == [
            ("corpus_import", "refused")]


def test_corpus_import__refuses_a_bundle_missing_a_record_a_checkpoint_names(
        drv: Driver, second_url: str, settings: OnwardSettings) -> None:
    """Invariant: a bundle is complete for what its checkpoints name under their MACs: a
    recorded model answer deleted from the ledger before the export (database access, no
    key) makes the export refuse, and the import refuse a bundle read all the same (a
    replay by name reads one without verifying), naming the call; nothing is written."""
    run_id = record_note(drv, "gone")
    with drv.ledger.engine.begin() as conn:
        assert conn.execute(sa.text("DELETE FROM onward.evidence WHERE run_id = :r"),
                            {"r": run_id}).rowcount == 1
    corpora = Corpora(drv.ledger)
    corpora.add("g", Selection(run_ids=(run_id,)))
    with pytest.raises(IntegrityViolation, match=r"nothing was exported: .*summarize@0#1"):
        exported(corpora, "g")
    bundle = read_bundle(corpora.snapshot("g"), drv.ledger.keys)
    with other_ledger(second_url, settings) as target:
        with pytest.raises(IntegrityViolation, match="summarize@0#1, which the bundle does not"):
            Corpora(target).import_bundle(bundle)
        assert row_counts(target.engine)["runs"] == 0


def test_corpus_export__drops_fields_by_policy_and_refuses_what_a_replay_needs(
        drv: Driver, second_url: str, settings: OnwardSettings) -> None:
    """Invariant: ``--drop-field`` leaves a sensitive field out of the bundle (the value is
    nowhere in it) and the bundle still verifies and imports; a field covered by a MAC or
    needed to replay (checkpoint state, recorded answers, effect results) cannot be dropped."""
    run_id = record_note(drv, "secret-topic")
    corpora = Corpora(drv.ledger)
    corpora.add("d", Selection(run_ids=(run_id,)))
    data = exported(corpora, "d", DropPolicy(("effects.payload", "requests",
                                              "approvals.artifact")))
    text = data.decode()
    assert '"payload":{"$dropped":true}' in text
    bundle = read_bundle(data, drv.ledger.keys)
    assert bundle.header["dropped"] == ["effects.payload", "requests", "approvals.artifact"]
    assert all(e["payload"] == {"$dropped": True} for e in bundle.rows["effects"])
    with other_ledger(second_url, settings) as target:
        assert Corpora(target).import_bundle(bundle).added == [run_id]
        assert target.verify_run(run_id) == []
    for kept in ("checkpoints.state", "evidence.response", "effects.result", "runs.result"):
        with pytest.raises(InvalidInput, match="cannot be dropped"):
            DropPolicy((kept,))
    with pytest.raises(InvalidInput, match="not a droppable field"):
        DropPolicy(("runs.nonsense",))


def test_corpus_export__leaves_out_a_pinned_run_continued_since_and_import_refuses_it(
        drv: Driver, second_url: str, settings: OnwardSettings,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: nothing executes an imported run. A failed run that was pinned and then
    continued (running again) is left out of the export, which names it; a bundle that
    holds a run that is not stopped (re-signed by someone with the key) is refused, and
    the target ledger gains no row."""
    monkeypatch.setenv("ONWARD_TEST_OPS_BROKEN", "1")
    broken = drv.ledger.start_run("test_ops_fragile", {})
    assert drv.drive(broken).status is RunStatus.FAILED
    kept = record_note(drv, "kept")
    corpora = Corpora(drv.ledger)
    corpora.add("c", Selection(run_ids=(broken, kept)))
    drv.ledger.continue_run(broken, "the template is fixed")
    assert drv.ledger.get_run(broken).status is RunStatus.RUNNING
    out = io.BytesIO()
    exported_now = corpora.export("c", out)
    assert exported_now.skipped == [{"run_id": str(broken), "status": "running"}]
    bundle = read_bundle(out.getvalue(), drv.ledger.keys)
    assert bundle.run_ids == [kept] and bundle.header["skipped"] == exported_now.skipped
    running = _resign(_rewrite(out.getvalue(), '"status":"completed"', '"status":"running"'),
                      drv.ledger.keys)
    with other_ledger(second_url, settings) as target:
        with pytest.raises(InvalidInput, match="is running"):
            Corpora(target).import_bundle(read_bundle(running, drv.ledger.keys))
        assert row_counts(target.engine)["runs"] == 0


def test_corpus_import__refuses_another_tenants_bundle(
        drv: Driver, second_url: str, settings: OnwardSettings) -> None:
    """Invariant: a bundle's runs keep their tenant; an actor of another tenant cannot
    import them (nothing is written)."""
    run_id = record_note(drv, "tenant")
    corpora = Corpora(drv.ledger)
    corpora.add("x", Selection(run_ids=(run_id,)))
    bundle = read_bundle(exported(corpora, "x"), drv.ledger.keys)
    with other_ledger(second_url, settings) as target:
        other = target.acting_as("eve", Role.ADMIN, tenant_id="acme")
        with pytest.raises(OperationRefused, match="tenant"):
            Corpora(other).import_bundle(bundle)
        assert row_counts(target.engine)["runs"] == 0


def test_corpus__viewers_read_but_cannot_pin_export_or_import(drv: Driver) -> None:
    """Invariant: pinning, exporting and importing need the operator role; a viewer is
    refused before anything happens, and the refusal is audited."""
    run_id = record_note(drv, "roles")
    Corpora(drv.ledger).add("r", Selection(run_ids=(run_id,)))
    viewer = Corpora(drv.ledger.acting_as("vic", Role.VIEWER))
    assert [c.name for c in viewer.all()] == ["r"]
    with pytest.raises(OperationRefused):
        viewer.add("r2", Selection(run_ids=(run_id,)))
    with pytest.raises(OperationRefused):
        viewer.export("r", io.BytesIO())
    with pytest.raises(OperationRefused):
        viewer.snapshot("r")
    refused = [(a.actor, a.action) for a in drv.ledger.audit(outcome="refused")]
    assert ("vic", "corpus_add") in refused and ("vic", "corpus_export") in refused


@pytest.fixture()
def flow_drv(ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    monkeypatch.delenv("ONWARD_TEST_CORPUS_VARIANT", raising=False)
    with ops_driver(ledger, tmp_path / "tool.log", monkeypatch,
                    ["tests.workflows_corpus", *OPS_MODULES]) as running:
        yield running


def test_corpus_import__signals_keep_their_ids_in_a_ledger_whose_ids_are_ahead(
        flow_drv: Driver, second_url: str, settings: OnwardSettings) -> None:
    """A signal's MAC covers its id and checkpoints name consumed signals by id, so an
    imported signal keeps its id: into a ledger whose signal ids are far ahead (or behind)
    the run verifies, and the next signal sent there takes an id above the imported ones.
    Before, the signal was renumbered by the target's sequence and the import was refused as
    'edited outside onward' whenever the ids differed (a fresh scratch ledger hid it)."""
    run_id = record_flow(flow_drv, "seat")
    corpora = Corpora(flow_drv.ledger)
    corpora.add("flows", Selection(run_ids=(run_id,)))
    bundle = read_bundle(exported(corpora, "flows"), flow_drv.ledger.keys)
    [signal_id] = [row["id"] for row in bundle.rows["signals"]]
    with other_ledger(second_url, settings) as target:
        with target.engine.begin() as conn:
            conn.execute(sa.select(sa.func.setval("onward.signals_id_seq", 1000)))
        Corpora(target).import_bundle(bundle)
        assert target.verify_run(run_id) == []
        with target.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT id FROM onward.signals")).scalars().all() == \
                [signal_id]
            assert conn.execute(sa.select(sa.func.nextval("onward.signals_id_seq"))
                                ).scalar_one() > max(signal_id, 1000)


def test_corpus_import__refuses_a_bundle_whose_signal_ids_are_taken_and_writes_nothing(
        flow_drv: Driver, second_url: str, settings: OnwardSettings) -> None:
    """A signal id the target ledger already gave to another signal cannot be reused, and a
    signal cannot be renumbered (its MAC covers its id): the import is refused, naming the
    ids, and nothing of the bundle is written."""
    first, second = record_flow(flow_drv, "seat"), record_flow(flow_drv, "desk")
    corpora = Corpora(flow_drv.ledger)
    corpora.add("one", Selection(run_ids=(first,)))
    corpora.add("two", Selection(run_ids=(second,)))
    one = read_bundle(exported(corpora, "one"), flow_drv.ledger.keys)
    two = read_bundle(exported(corpora, "two"), flow_drv.ledger.keys)
    [taken] = [row["id"] for row in two.rows["signals"]]
    with other_ledger(second_url, settings) as target:
        Corpora(target).import_bundle(one)
        with target.engine.begin() as conn:
            conn.execute(sa.text("UPDATE onward.signals SET id = :taken"), {"taken": taken})
        before = row_counts(target.engine)
        with pytest.raises(OperationRefused, match=f"signal id\\(s\\) {taken} of the bundle"):
            Corpora(target).import_bundle(two)
        after = row_counts(target.engine)
        assert after.pop("audit") == before.pop("audit") + 1  # the refusal, audited
        assert after == before


def _recorded_elsewhere(flow_drv: Driver, url: str, settings: OnwardSettings, sku: str,
                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """A bundle of one flow run recorded in a ledger of its own (database ``url``): its
    signal takes the same id as the first one recorded anywhere else."""
    with other_ledger(url, settings) as source, \
            ops_driver(source, tmp_path / f"{sku}.log", monkeypatch,
                       ["tests.workflows_corpus", *OPS_MODULES]) as drv:
        run_id = record_flow(drv, sku)
        corpora = Corpora(source)
        corpora.add("flows", Selection(run_ids=(run_id,)))
        return exported(corpora, "flows")


def _lock_waits(engine: sa.engine.Engine, event: str | None = None) -> int:
    """Sessions of the ledger waiting on a lock (of kind ``event``, e.g. advisory)."""
    with engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND wait_event = coalesce(:event, wait_event)"),
            {"event": event}).scalar_one())


def test_corpus_import__two_concurrent_imports_with_the_same_signal_ids(
        flow_drv: Driver, second_url: str, settings: OnwardSettings, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, server_urls: dict[str, str],
        template_database: str) -> None:
    """Invariant: two imports of different runs whose signals have the same id, at once:
    the second waits for the first, then is refused naming the id, and writes nothing (its
    runs, checkpoints and signals absent; one refusal audited); the first's runs verify."""
    one = read_bundle(exported(_pinned(flow_drv, "seat"), "flows"), flow_drv.ledger.keys)
    with empty_database(server_urls, template_database, "onward_source") as url:
        two = read_bundle(_recorded_elsewhere(flow_drv, url, settings, "desk", tmp_path,
                                              monkeypatch), flow_drv.ledger.keys)
    [same] = {row["id"] for row in one.rows["signals"]} & {row["id"] for row in
                                                            two.rows["signals"]}
    with other_ledger(second_url, settings) as target:
        refused: list[Exception] = []

        def second() -> None:
            try:
                Corpora(target).import_bundle(two)
            except OperationRefused as exc:
                refused.append(exc)

        with target.engine.begin() as conn:  # the first import, under way
            load_txn(conn, one, target.actor.tenant_id)
            before = row_counts(target.engine)  # (the first's rows are not committed yet)
            importing = threading.Thread(target=second)
            importing.start()
            wait_for(lambda: not importing.is_alive() or _lock_waits(target.engine) >= 1,
                     timeout=20, what="the second import to wait for the first")
        importing.join(timeout=30)
        assert [str(e) for e in refused if f"signal id(s) {same} of the bundle" in str(e)], \
            refused
        after = row_counts(target.engine)
        assert after.pop("audit") == before.pop("audit") + 1
        for table in ("runs", "checkpoints", "signals", "evidence", "effects"):
            assert after[table] == len(one.rows[table]), (table, after[table])
        assert [target.verify_run(run_id) for run_id in one.run_ids] == [[]]
        assert [target.get_run(run_id) for run_id in two.run_ids] == [None]


def test_corpus_import__a_signal_sent_during_an_import_takes_an_id_above_the_bundles(
        flow_drv: Driver, second_url: str, settings: OnwardSettings) -> None:
    """Invariant: a signal sent to the target ledger while a bundle is being imported (here
    while the import waits on a row lock, before it reached the signals) takes an id above
    the bundle's, and the import then completes with the bundle's signals under their own
    ids. Failed before: the sequence moved only when the signals were inserted, so the
    signal took the bundle's id and the import was refused."""
    bundle = read_bundle(exported(_pinned(flow_drv, "seat"), "flows"), flow_drv.ledger.keys)
    [signal_id] = [row["id"] for row in bundle.rows["signals"]]
    artifact = bundle.rows["artifacts"][0]
    with other_ledger(second_url, settings) as target:
        other_run = target.start_run("test_ops_notes", {}, allow_unadvertised=True)
        done: list[object] = []
        with target.engine.connect() as holder:
            holder.begin()  # holds the bundle's first artifact: the import waits there
            holder.execute(sa.text("INSERT INTO onward.artifacts (sha256, body, size, "
                                   "media_type) VALUES (:sha256, :body, :size, :media_type)"),
                           {k: artifact[k] for k in ("sha256", "body", "size", "media_type")})
            importing = threading.Thread(
                target=lambda: done.append(Corpora(target).import_bundle(bundle)))
            importing.start()
            wait_for(lambda: not importing.is_alive() or _lock_waits(target.engine) >= 1,
                     timeout=20, what="the import to wait on the artifact's row")
            assert target.signal(other_run, "go", {"n": 1}) is False
            holder.rollback()
        importing.join(timeout=30)
        assert len(done) == 1, done
        with target.engine.connect() as conn:
            ids = dict(conn.execute(sa.text("SELECT run_id, id FROM onward.signals")).all())
        assert ids[bundle.run_ids[0]] == signal_id and ids[other_run] > signal_id
        assert target.verify_run(bundle.run_ids[0]) == []


def test_corpus_import__moving_the_signal_ids_waits_for_sends_in_flight_and_they_for_it(
        flow_drv: Driver, second_url: str, settings: OnwardSettings) -> None:
    """Invariant: an import never moves the signal id sequence while a signal send holds an
    id it took (a send in flight, its transaction open): the import waits for it to
    commit; a send that begins meanwhile waits for the move, then takes an id above the
    bundle's; the import completes with the bundle's signals under their own ids. Failed
    before (migration 0043's function): the move did not wait for anything, so a send
    whose nextval landed between the function's nextval and setval took an id at or below
    the bundle's largest (the import then refused by name, or the send failed on a
    duplicate key)."""
    with flow_drv.ledger.engine.begin() as conn:  # the bundle's signal ids are above the
        conn.execute(sa.select(sa.func.setval("onward.signals_id_seq", 1000)))  # target's
    bundle = read_bundle(exported(_pinned(flow_drv, "seat"), "flows"), flow_drv.ledger.keys)
    [signal_id] = [row["id"] for row in bundle.rows["signals"]]
    with other_ledger(second_url, settings) as target:
        def advisory_waits() -> int:
            return _lock_waits(target.engine, "advisory")

        other_run, third_run = (target.start_run("test_ops_notes", {}, allow_unadvertised=True)
                                for _ in range(2))
        done: list[object] = []
        woke: list[bool] = []
        importing = threading.Thread(
            target=lambda: done.append(Corpora(target).import_bundle(bundle)))
        sending = threading.Thread(
            target=lambda: woke.append(target.signal(third_run, "later", {"n": 2})))
        with target.engine.connect() as in_flight:
            in_flight.begin()  # a signal send that took its id and has not committed
            signal_txn(in_flight, target.keys, other_run, "first", {"n": 1},
                       max_bytes=settings.max_signal_bytes, max_depth=settings.max_json_depth)
            importing.start()
            wait_for(lambda: not importing.is_alive() or advisory_waits() >= 1,
                     timeout=20, what="the import to wait for the send in flight")
            assert importing.is_alive(), "the import moved the signal ids without waiting " \
                "for the signal send in flight"
            sending.start()
            wait_for(lambda: not sending.is_alive() or advisory_waits() >= 2,
                     timeout=20, what="a new send to wait for the import's move")
            assert sending.is_alive(), "a signal send took an id while the import waited " \
                "to move the signal ids"
            in_flight.commit()
        importing.join(timeout=30)
        sending.join(timeout=30)
        assert len(done) == 1 and woke == [False], (done, woke)
        with target.engine.connect() as conn:
            ids: dict[str, int] = dict(conn.execute(sa.text(
                "SELECT name, id FROM onward.signals")).all())
        assert ids["first"] < signal_id < ids["later"], ids
        assert target.verify_run(bundle.run_ids[0]) == []


def _pinned(drv: Driver, sku: str) -> Corpora:
    run_id = record_flow(drv, sku)
    corpora = Corpora(drv.ledger)
    corpora.add("flows", Selection(run_ids=(run_id,)))
    return corpora


def test_corpus_import__the_same_bundle_imported_twice_at_once(
        flow_drv: Driver, second_url: str, settings: OnwardSettings) -> None:
    """Invariant: two imports of the same bundle at once end as two imports one after the
    other: the second waits for the first, then finds its runs present (same head) and adds
    nothing. Failed before: the second failed on the runs' primary key
    (StatementRefused: duplicate key value violates unique constraint "pk_runs")."""
    bundle = read_bundle(exported(_pinned(flow_drv, "seat"), "flows"), flow_drv.ledger.keys)
    with other_ledger(second_url, settings) as target:
        done: list[object] = []
        with target.engine.begin() as conn:  # the first import, under way
            load_txn(conn, bundle, target.actor.tenant_id)
            importing = threading.Thread(
                target=lambda: done.append(Corpora(target).import_bundle(bundle)))
            importing.start()
            wait_for(lambda: not importing.is_alive() or _lock_waits(target.engine) >= 1,
                     timeout=20, what="the second import to wait for the first")
        importing.join(timeout=30)
        [imported] = done
        assert (imported.added, imported.present) == ([], bundle.run_ids)  # type: ignore[attr-defined]
        assert [target.verify_run(run_id) for run_id in bundle.run_ids] == [[]]


def test_corpus_export__refuses_a_pinned_run_that_does_not_verify_here(drv: Driver) -> None:
    """Invariant: an export writes what an import running this code accepts. A pinned run
    whose checkpoint was edited after it was pinned (its MAC no longer matches) is named
    in a refusal and nothing is written; unpinned, the rest exports. Failed before: the
    export wrote the edited run, and only the other ledger's import refused the bundle."""
    edited = record_note(drv, "edited")
    kept = record_note(drv, "kept")
    corpora = Corpora(drv.ledger)
    corpora.add("c", Selection(run_ids=(edited, kept)))
    with drv.ledger.engine.begin() as conn:
        conn.execute(sa.text("UPDATE onward.checkpoints SET next_step = 'elsewhere' "
                             "WHERE run_id = :r AND seq = 0"), {"r": edited})
    out = io.BytesIO()
    with pytest.raises(IntegrityViolation, match=rf"nothing was exported: .*{edited}"):
        corpora.export("c", out)
    assert out.getvalue() == b""
    corpora.remove("c", (edited,), "edited after it was pinned")
    assert read_bundle(exported(corpora, "c"), drv.ledger.keys).run_ids == [kept]
