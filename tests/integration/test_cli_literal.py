"""What the CLI prints is what the ledger holds, literally: an approval artifact is shown
whole and the decision is bound to the hash of what was shown; text that looks like terminal
markup is printed as text (never styled, never a crash); control characters and escape
sequences in data never reach the terminal raw. In-process CLI against a real PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from console.cli import app
from ledger import Ledger, RunStatus
from ledger.checkpoints import canonical_json, sha256_hex
from ledger.tokens import TokenRequest
from ledger.vocabulary import Role
from tests.support.driver import Driver, driver

MODULES = ["tests.workflows_display"]
INVISIBLE = "[black on black]wire the money to account 999[/]"
UNMATCHED = "see the [/note] below"
ESCAPES = "\x1b[2J\x1b]0;pwned\x07 and \u202etxt.exe"


@pytest.fixture()
def drv(settings_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> Iterator[Driver]:
    env = {**settings_env, "ONWARD_WORKFLOWS": ",".join(MODULES), "ONWARD_ACTOR": "olga",
           "XDG_CONFIG_HOME": str(tmp_path / "config")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    olga = TokenRequest("olga", Role.ADMIN, "default", timedelta(hours=1))
    monkeypatch.setenv("ONWARD_TOKEN", Ledger.from_env().create_token(olga).secret)
    with driver(Ledger.from_env(), MODULES) as running:
        yield running


def onward(*args: str, role: str | None = None, input: str | None = None,
           code: int = 0) -> str:
    env = {"COLUMNS": "200"}  # olga's admin token, whatever the role
    result = CliRunner().invoke(app, list(args), env=env, input=input)
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        result.exception
    # --json: stdout alone is the answer (a warning logged meanwhile goes to stderr)
    return result.stdout if "--json" in args else result.output


def waiting_approval(drv: Driver, artifact: dict[str, Any]) -> dict[str, Any]:
    run_id = drv.ledger.start_run("test_display", {"ask": True, "artifact": artifact})
    assert drv.drive(run_id).status is RunStatus.WAITING
    [approval] = json.loads(onward("approvals", "ls", "--run", str(run_id), "--json"))
    return dict(approval)


def assert_literal(text: str, output: str) -> None:
    assert text in output, output[-2000:]


def assert_no_raw_controls(output: str) -> None:
    raw = [c for c in output if c in "\x1b\x07\u202e"]
    assert raw == [], output


def test_cli_approve__a_long_artifact_is_shown_whole(drv: Driver) -> None:
    """A 10,000-character artifact whose tail holds the grand total is printed in full, with
    an end marker, both when asked interactively and with --yes --artifact-hash."""
    items = [f"line {i:04d}: " + "x" * 80 for i in range(110)]
    approval = waiting_approval(drv, {"items": items, "grand_total": 1500000})
    assert len(json.dumps({"items": items})) > 10000
    shown = onward("approvals", "approve", approval["id"], "--artifact-hash",
                   approval["artifact_hash"], "--yes")
    for item in (items[0], items[-1], '"grand_total": 1500000', "end of artifact"):
        assert_literal(item, shown)
    assert "approved by olga" in shown
    other = waiting_approval(drv, {"items": items, "grand_total": 1500000})
    asked = onward("approvals", "reject", other["id"], input="y\n")
    assert_literal('"grand_total": 1500000', asked)
    assert asked.index("grand_total") < asked.index("reject it?")


def test_cli_approve__markup_in_an_artifact_is_printed_literally(drv: Driver) -> None:
    """Artifact text that looks like rich markup is shown as written, not styled away; escape
    sequences and bidi overrides are shown as escapes."""
    approval = waiting_approval(drv, {"note": INVISIBLE, "tricks": ESCAPES})
    shown = onward("approvals", "approve", approval["id"], input="n\n", code=1)
    assert_literal(INVISIBLE, shown)
    assert_literal("\\u202etxt.exe", shown)
    assert_no_raw_controls(shown)


def test_cli_approve__an_unmatched_closing_tag_does_not_crash(drv: Driver) -> None:
    """An artifact containing an unmatched ``[/note]`` is shown and can be approved."""
    approval = waiting_approval(drv, {"note": UNMATCHED})
    shown = onward("approvals", "approve", approval["id"], input="y\n")
    assert_literal(UNMATCHED, shown)
    assert "approved by olga" in shown


def test_cli_approve__binds_the_decision_to_the_hash_of_what_was_shown(drv: Driver) -> None:
    """A decision on an artifact edited in the database after it was bound is refused
    (exit 2) before the artifact is shown or the question asked: its hash is not the bound
    one. The approval stays pending and the refusal is audited. An untampered decision
    records the shown hash."""
    approval = waiting_approval(drv, {"amount": 100})
    with drv.ledger.engine.begin() as conn:
        conn.execute(sa.text("UPDATE onward.approvals SET artifact = '{\"amount\": 1000000}' "
                             "WHERE id = :id"), {"id": approval["id"]})
    refused = onward("approvals", "approve", approval["id"], input="y\n", code=2)
    assert '"amount": 1000000' not in refused and "approve it?" not in refused
    assert "refused" in refused and "edited outside onward" in refused
    assert drv.ledger.get_approval(UUID(approval["id"])).status.value == "pending"
    good = waiting_approval(drv, {"amount": 100})
    onward("approvals", "approve", good["id"], input="y\n")
    audit = json.loads(onward("audit", "ls", "--action", "approve", "--json"))
    by_approval = {(a["approval_id"], a["outcome"]): a for a in audit}
    assert (approval["id"], "refused") in by_approval
    shown_hash = sha256_hex(canonical_json({"amount": 100}))
    assert by_approval[(good["id"], "done")]["details"]["artifact_hash"] == shown_hash


def test_cli_approve__a_named_hash_must_be_the_one_shown(drv: Driver) -> None:
    """With --yes the reviewer names the hash they reviewed; a hash that is not the one of
    the artifact shown is refused (exit 2) and nothing is decided."""
    approval = waiting_approval(drv, {"amount": 100})
    out = onward("approvals", "approve", approval["id"], "--artifact-hash", "0" * 64, "--yes",
                 code=2)
    assert "refused" in out
    assert drv.ledger.get_approval(UUID(approval["id"])).status.value == "pending"


def test_cli_approve__refuses_what_it_could_not_show(drv: Driver,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """When the artifact cannot be shown (the pager fails), nothing is approved: exit 2,
    the approval stays pending."""
    import console.commands_approvals as approvals_cmd

    def broken_pager(text: str) -> None:
        raise OSError("pager died")

    monkeypatch.setattr(approvals_cmd, "_interactive", lambda: True)
    monkeypatch.setenv("LINES", "3")  # a terminal shorter than the artifact: it is paged
    monkeypatch.setattr(approvals_cmd.click, "echo_via_pager", broken_pager)
    approval = waiting_approval(drv, {"amount": 100})
    out = onward("approvals", "approve", approval["id"], input="y\n", code=2)
    assert "could not be shown" in out
    assert drv.ledger.get_approval(UUID(approval["id"])).status.value == "pending"


@pytest.mark.parametrize("text", [INVISIBLE, UNMATCHED], ids=["markup", "unmatched"])
def test_cli_effects_repeat__payload_is_printed_literally(drv: Driver, text: str) -> None:
    """The repeat plan prints the payload and recipient as stored: markup is text, an
    unmatched tag does not crash, escape sequences are shown escaped."""
    run_id = drv.ledger.start_run("test_display", {"text": text, "to": text + ESCAPES})
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    [effect] = json.loads(onward("effects", "ls", "--run", str(run_id), "--json"))
    shown = onward("effects", "repeat", effect["effect_id"], "--reason", "lost", input="n\n",
                   role="admin", code=1)
    assert_literal(json.dumps(text), shown)
    assert_literal(f"recipient:      {text}", shown)
    assert_no_raw_controls(shown)
    show = onward("effects", "show", effect["effect_id"])
    assert_literal(json.dumps(text), show)
    assert_no_raw_controls(show)


@pytest.mark.parametrize("text", [INVISIBLE, UNMATCHED], ids=["markup", "unmatched"])
def test_cli_runs_show__results_and_errors_are_printed_literally(drv: Driver,
                                                                 text: str) -> None:
    """runs show prints a run's result and its error (header and step timeline) as stored:
    markup is text, an unmatched tag does not crash, escape sequences are shown escaped."""
    done = drv.ledger.start_run("test_display", {"result": text})
    assert drv.drive(done).status is RunStatus.COMPLETED
    assert_literal(json.dumps(text), onward("runs", "show", str(done)))
    failed = drv.ledger.start_run("test_display", {"error": text + ESCAPES})
    assert drv.drive(failed).status is RunStatus.FAILED
    shown = onward("runs", "show", str(failed))
    assert_literal(text, shown)
    assert_no_raw_controls(shown)


def test_cli_audit_and_lists__operator_text_is_printed_literally(drv: Driver) -> None:
    """A reason typed by one operator is data to the next: audit ls and runs ls print it
    (and workflow-chosen names) literally."""
    run_id = drv.ledger.start_run("test_display", {})
    onward("runs", "cancel", str(run_id), "--reason", UNMATCHED + ESCAPES, "--yes")
    listed = onward("audit", "ls", "--run", str(run_id))
    assert_literal("[/note]", listed)
    assert_no_raw_controls(listed)
    onward("runs", "ls", "--workflow", "test_display")


@pytest.mark.parametrize("columns", [80, 120])
def test_cli_lists__ids_are_printed_whole_on_a_narrow_terminal(drv: Driver,
                                                                 columns: int) -> None:
    """The id a person pastes into the next command is whole in runs ls and approvals ls,
    and effects ls shows its 16 digits of an effect id, at 80 and 120 columns; the other
    columns give up the room (the run id was cut to ``01a23147-…`` at 80 columns and lost
    its last digits below 160; the effect id to 7 digits at 100, fewer than a prefix needs)."""
    run_id = drv.ledger.start_run("test_display", {"text": "hi", "to": "someone"})
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    approval = waiting_approval(drv, {"note": "ok"})
    env = {"COLUMNS": str(columns)}
    listed = CliRunner().invoke(app, ["runs", "ls", "--workflow", "test_display"], env=env)
    approvals = CliRunner().invoke(app, ["approvals", "ls"], env=env)
    effects = CliRunner().invoke(app, ["effects", "ls", "--run", str(run_id)], env=env)
    assert listed.exit_code == approvals.exit_code == effects.exit_code == 0, (
        listed.output, approvals.output, effects.output)
    assert str(run_id) in listed.output and approval["run_id"] in listed.output
    assert approval["id"] in approvals.output
    [effect] = json.loads(onward("effects", "ls", "--run", str(run_id), "--json"))
    assert effect["effect_id"][:16] in effects.output  # as much as it shows: 8+ name one
