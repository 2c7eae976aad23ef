"""Anchors (``onward anchor``, ``onward verify --anchor``): a restore of an older copy of the
whole database is reported run by run, against a real PostgreSQL. The older copy is made the
way a backup is: ``CREATE DATABASE … TEMPLATE`` of the test's database at one moment, which
the ledger is pointed at later (what restoring that backup brings back)."""

from __future__ import annotations

import gzip
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import pytest
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from console.cli import app
from harness.databases import create_database, drop_database
from ledger import Ledger
from ledger.anchor import decode, encode
from ledger.anchor_store import DirectoryStore, open_store
from ledger.anchoring import Anchors, check_against, publish
from ledger.checkpoints import CheckpointKeys
from ledger.exceptions import AnchorRefused, InvalidInput, RollbackFound
from tests.support.cluster import wait_for
from tests.support.driver import Driver, driver
from workers.reaper import Reaper
from workers.settings import WorkerSettings

MODULES = ["tests.workflows_anchor"]


@pytest.fixture()
def anchors(tmp_path: Path, settings_env: dict[str, str],
            monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "anchors"
    monkeypatch.setenv("ONWARD_ANCHOR_LOCATION", str(where))
    monkeypatch.setenv("ONWARD_AUTH", "off")  # the CLI acts as the local admin
    monkeypatch.delenv("ONWARD_TOKEN", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return where


@pytest.fixture()
def drv(settings: WorkerSettings, anchors: Path) -> Iterator[Driver]:
    with driver(Ledger.from_env(WorkerSettings()), MODULES) as running:
        yield running


@pytest.fixture()
def copies(server_urls: dict[str, str]) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for name in made:
        drop_database(server_urls["database"], name)


def onward(*args: str, code: int = 0) -> str:
    """The CLI's stdout (and its stderr too, when it is expected to fail)."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "220"})
    assert result.exit_code == code, (result.exit_code, result.output)
    return result.stdout if code == 0 else result.output


def steps(drv: Driver, run_id: UUID, count: int) -> int:
    """Run ``count`` steps of ``run_id``; return the seq it is at."""
    for _ in range(count):
        run = drv.ledger.get_run(run_id)
        assert run is not None
        drv.step(run_id, run.seq)
    run = drv.ledger.get_run(run_id)
    assert run is not None
    return run.seq


def backup(drv: Driver, server_urls: dict[str, str], copies: list[str]) -> str:
    """A copy of the test's database as it is now; returns its URL. Every connection to
    the database is closed first (a template must have none); they reopen on next use."""
    drv.store.close()
    drv.ledger.engine.dispose()
    name, url = create_database(server_urls["database"], "onward_copy",
                                template=make_url(drv.ledger.url).database)
    copies.append(name)
    return url


def problems_by_run(output: str) -> dict[str, str]:
    """``verify --anchor --json``'s problems by run; its last line is the summary."""
    *found, summary = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert summary["kind"] == "summary" and summary["problems"] == len(found), summary
    return {p["run_id"]: p["kind"] for p in found}


def test_verify_anchor__reports_exactly_the_runs_an_older_copy_moved_back(
        drv: Driver, anchors: Path, server_urls: dict[str, str], copies: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: against an anchor, a restored older copy of the database reports exactly
    the runs whose history it moved back: a run at a lower seq (rolled_back), a run whose
    checkpoint at the anchored seq is another one (diverged: the copy ran on and wrote a
    different history), a run started after the copy was made (vanished). Runs the copy
    holds as anchored, and runs started or advanced after the anchor, are not reported; the
    ledger the anchor was taken of verifies clean."""
    start = {name: drv.ledger.start_run("test_anchor_notes", {}) for name in "ABCDE"}
    for name, count in {"A": 2, "B": 2, "C": 2, "D": 1}.items():
        steps(drv, start[name], count)
    old_copy = backup(drv, server_urls, copies)
    assert steps(drv, start["A"], 3) == 5
    assert steps(drv, start["B"], 2) == 4
    started_later = drv.ledger.start_run("test_anchor_notes", {})  # F: after the backup
    steps(drv, started_later, 1)

    written = json.loads(onward("anchor", "--json"))
    assert written["runs"] == 6 and written["previous"] is None
    steps(drv, start["C"], 2)  # after the anchor: moving forward is fine
    after_anchor = drv.ledger.start_run("test_anchor_notes", {})
    output = onward("verify", "--anchor")
    assert "compared 6 run(s)" in output and "0 problem(s)" in output

    monkeypatch.setenv("ONWARD_DATABASE_URL", old_copy)  # restore the backup
    with driver(Ledger.from_env(WorkerSettings()), MODULES) as restored:
        assert steps(restored, start["B"], 2) == 4  # the copy runs on: same seq, new notes
        output = onward("verify", "--anchor", "--json", code=3)
        assert problems_by_run(output) == {str(start["A"]): "rolled_back",
                                           str(start["B"]): "diverged",
                                           str(started_later): "vanished"}
        assert str(after_anchor) not in output
        refused = onward("anchor", code=2)
        assert "does not match the latest anchor" in refused
        assert len(DirectoryStore(anchors).names()) == 1  # nothing written


def test_anchor__a_rollback_is_accepted_only_with_a_reason_and_stays_visible(
        drv: Driver, anchors: Path, server_urls: dict[str, str], copies: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: once runs moved back since the latest anchor, no anchor is written (so the
    rollback cannot be hidden by the next one) until an admin accepts it with a reason
    (audited); the new anchor says what it accepted, and the older anchor still reports the
    rollback when asked by name."""
    run_id = drv.ledger.start_run("test_anchor_notes", {})
    steps(drv, run_id, 1)
    old_copy = backup(drv, server_urls, copies)
    steps(drv, run_id, 3)
    first = json.loads(onward("anchor", "--json"))
    monkeypatch.setenv("ONWARD_DATABASE_URL", old_copy)
    assert "needs --reason" in onward("anchor", "--accept-rollback", code=2)
    accepted = json.loads(onward("anchor", "--accept-rollback", "--reason",
                                 "restored after losing the disk", "--json"))
    assert accepted["accepted"] == 1 and accepted["previous"] == first["anchor"]
    assert "0 problem(s)" in onward("verify", "--anchor")  # the latest: the accepted state
    output = onward("verify", "--anchor", first["where"], "--json", code=3)
    assert problems_by_run(output) == {str(run_id): "rolled_back"}
    audit = Ledger.from_env(WorkerSettings()).audit(action="anchor")
    assert [(a.outcome, a.reason) for a in audit] == [
        ("done", "restored after losing the disk"), ("refused", None)]


def test_verify_anchor__an_edited_anchor_is_refused(drv: Driver, anchors: Path) -> None:
    """Invariant: an anchor whose runs, header or bytes were changed, or that was signed
    with another key, does not verify, and nothing is compared against it: the command
    reports it (kind anchor) and exits 3."""
    for _ in range(3):
        steps(drv, drv.ledger.start_run("test_anchor_notes", {}), 1)
    path = Path(json.loads(onward("anchor", "--json"))["where"])
    header, *lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    row = json.loads(lines[1])
    row[2] += 1  # the run was "further along"
    edits = {
        "a run's seq": [header, lines[0], json.dumps(row, separators=(",", ":")), lines[2]],
        "a run removed": [header, lines[0], lines[2]],
        "the header's count": [header.replace('"runs":3', '"runs":2'), *lines[:2]],
        "the header's time": [header.replace('"taken_at":"', '"taken_at":"1'), *lines],
    }
    for what, edited in edits.items():
        target = path.parent / f"edited-{what.replace(' ', '-')}.jsonl.gz"
        target.write_bytes(gzip.compress(("\n".join(edited) + "\n").encode()))
        output = onward("verify", "--anchor", str(target), "--json", code=3)
        kinds = [json.loads(line)["kind"] for line in output.splitlines()
                 if line.startswith("{")]
        assert kinds == ["anchor", "summary"], (what, output)
    truncated = path.parent / "truncated.jsonl.gz"
    truncated.write_bytes(path.read_bytes()[:-20])
    assert "not a whole gzip file" in onward("verify", "--anchor", str(truncated), code=3)
    other_key = CheckpointKeys(current="k1", keys={"k1": b"another key"})
    keys = drv.ledger.keys
    anchor = decode(keys, path.name, path.read_bytes())
    _, forged = encode(other_key, anchor.taken_at, anchor.heads)
    with pytest.raises(AnchorRefused, match="does not match its MAC"):
        decode(keys, path.name, forged)
    assert "0 problem(s)" in onward("verify", "--anchor", str(path))


def test_anchor__heads_that_do_not_verify_are_left_out_and_named(
        drv: Driver, anchors: Path) -> None:
    """Invariant: an anchor vouches only for heads whose MAC verifies: a run whose head was
    edited in the database is left out of it, and named."""
    good = drv.ledger.start_run("test_anchor_notes", {})
    bad = drv.ledger.start_run("test_anchor_notes", {})
    with drv.ledger.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE onward.runs SET seq = 7 WHERE id = %(id)s", {"id": bad})
    written = json.loads(onward("anchor", "--json"))
    assert written["runs"] == 1 and written["not_anchored"] == [str(bad)]
    anchor = decode(drv.ledger.keys, written["anchor"], Path(written["where"]).read_bytes())
    assert [h.run_id for h in anchor.heads] == [good]


def test_reaper__writes_anchors_every_interval(settings: WorkerSettings, anchors: Path,
                                               drv: Driver) -> None:
    """Invariant: with an anchor location, the reaper's sweeps write an anchor once per
    ONWARD_ANCHOR_INTERVAL_S (by the database's clock, counted from the latest anchor in the
    location, so a restarted reaper does not write one at once), each covering every run."""
    for _ in range(2):
        drv.ledger.start_run("test_anchor_notes", {})
    reaper = Reaper(settings.model_copy(update={"anchor_location": str(anchors),
                                                "anchor_interval_s": 1.0}))
    store = open_store(str(anchors))
    reaper.sweep_once()
    assert len(store.names()) == 1
    reaper.sweep_once()
    assert len(store.names()) == 1  # not due yet
    restarted = Reaper(settings.model_copy(update={"anchor_location": str(anchors),
                                                   "anchor_interval_s": 1.0}))
    restarted.sweep_once()
    assert len(store.names()) == 1  # counted from the latest anchor, not the restart
    wait_for(lambda: restarted.sweep_once() is not None and len(store.names()) >= 3,
             timeout=30, what="two more anchors")
    names = store.names()
    for name in names:
        found = check_against(drv.ledger.engine, drv.ledger.keys, name, store.read(name))
        assert found.compared == 2 and found.problems == []
    taken = [decode(drv.ledger.keys, n, store.read(n)).taken_at for n in names]
    assert all((b - a).total_seconds() >= 1.0 for a, b in itertools.pairwise(taken))


def test_anchor__100_runs_round_trip_and_refusals(drv: Driver, anchors: Path) -> None:
    """Invariant: the anchor of N runs holds N heads sorted by run id and verifies; an
    anchor location that is not a directory is refused with what to do; an existing anchor
    is never overwritten."""
    for _ in range(100):
        drv.ledger.start_run("test_anchor_notes", {})
    store = open_store(f"file://{anchors}")
    done = publish(drv.ledger.engine, drv.ledger.keys, store)
    anchor = decode(drv.ledger.keys, done.name, store.read(done.name))
    assert len(anchor.heads) == 100
    assert [h.run_id for h in anchor.heads] == sorted(h.run_id for h in anchor.heads)
    with pytest.raises(Exception, match="never overwritten"):
        store.create(done.name, b"something else")
    assert decode(drv.ledger.keys, done.name, store.read(done.name)).root == done.root
    with pytest.raises(InvalidInput, match="only a directory"):
        open_store("s3://bucket/anchors")
    with pytest.raises(RollbackFound):
        with drv.ledger.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM onward.outbox")
            conn.exec_driver_sql("DELETE FROM onward.checkpoints WHERE run_id = %(id)s",
                                 {"id": anchor.heads[0].run_id})
            conn.exec_driver_sql("DELETE FROM onward.runs WHERE id = %(id)s",
                                 {"id": anchor.heads[0].run_id})
        Anchors(drv.ledger).publish(store)
