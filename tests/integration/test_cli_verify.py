"""``onward verify --json`` against a real PostgreSQL: every check prints parseable JSON, one
object per line (one per problem), ending with a summary, also when nothing is found."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from console.cli import app
from ledger import Ledger
from tests.support.driver import Driver, driver
from workers.settings import WorkerSettings

MODULES = ["tests.workflows_anchor"]


@pytest.fixture()
def drv(settings: WorkerSettings, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    monkeypatch.setenv("ONWARD_ANCHOR_LOCATION", str(tmp_path / "anchors"))
    monkeypatch.setenv("ONWARD_AUTH", "off")  # the CLI acts as the local admin
    monkeypatch.delenv("ONWARD_TOKEN", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    with driver(Ledger.from_env(WorkerSettings()), MODULES) as running:
        yield running


def verify_json(*args: str, code: int = 0) -> list[dict[str, Any]]:
    """``onward verify ARGS --json``: its stdout, each line parsed (all must parse)."""
    result = CliRunner().invoke(app, ["verify", *args, "--json"], env={"COLUMNS": "220"})
    assert result.exit_code == code, (result.exit_code, result.output)
    return [json.loads(line) for line in result.stdout.splitlines()]


def stepped(drv: Driver) -> UUID:
    run_id = drv.ledger.start_run("test_anchor_notes", {})
    drv.step(run_id, 0)
    return run_id


def test_cli_verify__json_says_so_when_all_is_well(drv: Driver) -> None:
    """Given runs whose history verifies, each form of ``verify --json`` (RUN, --all,
    --audit, --anchor) prints exactly one JSON object, its summary, and exits 0; before, it
    printed nothing, which no JSON reader accepts."""
    run_id, _ = stepped(drv), stepped(drv)
    assert verify_json(str(run_id)) == [
        {"kind": "summary", "ok": True, "run_id": str(run_id), "runs_checked": 1,
         "problems": 0, "warnings": 0}]
    assert verify_json("--all") == [
        {"kind": "summary", "ok": True, "run_id": None, "runs_checked": 2, "problems": 0,
         "warnings": 0}]
    [audit] = verify_json("--audit")
    assert (audit["ok"], audit["runs_checked"], audit["problems"]) == (True, 0, 0)
    [sealed] = verify_json("--audit", "--seal")
    assert sealed["ok"] and sealed["sealed"] > 0
    anchored = CliRunner().invoke(app, ["anchor", "--json"])
    assert anchored.exit_code == 0, anchored.output
    assert verify_json("--anchor") == [
        {"kind": "summary", "ok": True, "anchor": json.loads(anchored.stdout)["anchor"],
         "runs_checked": 2, "problems": 0, "warnings": 0}]


def test_cli_verify__json_ends_with_the_summary_after_warnings(drv: Driver) -> None:
    """Given audit rows left unsealed past the grace period (no reaper), ``verify --audit
    --json`` exits 4 and prints one line per row (warning true), then the summary: ok, as
    nothing failed a check, with the warnings counted."""
    verify_json(str(stepped(drv)))  # an audited check: a row for the chain
    with drv.ledger.engine.begin() as conn:
        late = conn.execute(sa.text("UPDATE onward.audit SET at = at - interval '1 hour' "
                                    "WHERE chain_seq IS NULL")).rowcount
    assert late > 0
    *rows, summary = verify_json("--audit", code=4)
    assert [(r["kind"], r["warning"]) for r in rows] == [("unsealed", True)] * late
    assert summary == {"kind": "summary", "ok": True, "run_id": None, "runs_checked": 0,
                       "problems": 0, "warnings": late}


def test_cli_verify__json_reports_a_usage_error_or_refusal_as_one_json_object(
        drv: Driver, tmp_path: Path) -> None:
    """Given options that do not go together, an option verify does not have, a run id
    that names no run, or an anchor that is not there, ``verify --json`` prints one JSON
    object on stdout, ``{"kind": "error", "ok": false, …}`` with the message and the exit
    code, which is unchanged (2); it printed text (the option error on stdout itself)."""
    stepped(drv)
    cases = {("--all", "--audit"): ("refused", "give a RUN, --all, --audit or --anchor"),
             ("--seal",): ("refused", "--seal goes with --all or --audit"),
             ("--everything",): ("usage", "No such option: --everything"),
             ("0123456789ab",): ("refused", "no run"),
             ("--anchor", str(tmp_path / "none.json")): ("refused", "none.json")}
    for args, (error, words) in cases.items():
        [answer] = verify_json(*args, code=2)
        assert (answer["kind"], answer["ok"], answer["error"], answer["exit_code"]) == (
            "error", False, error, 2), (args, answer)
        assert words in answer["message"], (args, answer)


def _verify_rows(ledger: Ledger) -> list[tuple[str, str | None, dict[str, Any]]]:
    """The verify audit rows, oldest first: (outcome, run_id, details)."""
    return [(a.outcome, str(a.run_id) if a.run_id else None, a.details or {})
            for a in reversed(ledger.audit(action="verify", limit=100))]


def test_cli_verify__every_mode_leaves_one_verified_row(drv: Driver, tmp_path: Path) -> None:
    """Given runs, each form of verify (RUN, --all, --audit, --anchor, and --anchor with an
    anchor that does not verify: a problem, exit 3) leaves exactly one audit row, action
    verify, outcome done, saying which check it was (mode; the anchor's name), the runs it
    checked and the problems it found; the anchor that does not verify was audited as a
    refused verify, and no row said which check --all or --audit had been. An unknown run
    and a missing anchor are audited refusals (exit 2); they were not audited at all."""
    run_id, _ = stepped(drv), stepped(drv)
    anchored = CliRunner().invoke(app, ["anchor", "--json"])
    assert anchored.exit_code == 0, anchored.output
    anchor = json.loads(anchored.stdout)
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(Path(anchor["where"]).read_bytes()[:-20])
    verify_json(str(run_id))
    verify_json("--all")
    verify_json("--audit")
    verify_json("--anchor")
    verify_json("--anchor", str(broken), code=3)
    verify_json("0123456789ab", code=2)
    verify_json("--anchor", str(tmp_path / "none"), code=2)
    rows = _verify_rows(drv.ledger)
    assert [(outcome, run, {k: v for k, v in details.items() if k not in ("anchor", "error")})
            for outcome, run, details in rows] == [
        ("done", str(run_id), {"mode": "run", "checked": 1, "problems": 0}),
        ("done", None, {"mode": "all", "checked": 2, "problems": 0}),
        ("done", None, {"mode": "audit", "checked": 0, "problems": 0}),
        ("done", None, {"mode": "anchor", "checked": 2, "problems": 0}),
        ("done", None, {"mode": "anchor", "checked": 0, "problems": 1}),
        ("refused", None, {"type": "UnknownRun"}), ("refused", None, {"type": "InvalidInput"})]
    assert [details.get("anchor") for *_, details in rows[3:5]] == [anchor["anchor"],
                                                                   broken.name]
    assert "not a whole gzip file" in rows[4][2]["error"]
    assert "no run" in rows[5][2]["error"] and "none" in rows[6][2]["error"]


def test_cli_verify__json_names_what_seal_could_not_seal(drv: Driver) -> None:
    """Given a tenant whose audit chain's head was edited (its end does not verify), ``verify
    --audit --seal --json`` seals nothing there and says why in its summary (not_sealed,
    as the text output's "not sealed:" line does), then reports the chain's problem (exit
    3); the JSON summary left it out."""
    verify_json(str(stepped(drv)))
    [summary] = verify_json("--audit", "--seal")
    assert summary["sealed"] > 0 and summary["not_sealed"] == []
    verify_json(str(stepped(drv)))  # a row left to seal
    with drv.ledger.engine.begin() as conn:
        conn.execute(sa.text("UPDATE onward.audit_heads SET chain_seq = chain_seq + 5"))
    *problems, summary = verify_json("--audit", "--seal", code=3)
    assert summary["sealed"] == 0 and problems
    [refused] = summary["not_sealed"]
    assert "tenant 'default': the audit chain's head" in refused, refused
