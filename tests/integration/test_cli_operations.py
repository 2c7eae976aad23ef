"""The operator CLI (``onward runs|effects|approvals|audit``) in-process, against a real
PostgreSQL: what it shows before a change, confirmation, --json reads, and exit codes
(2 refused, 1 failed or declined)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from uuid import UUID

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from console.cli import app
from ledger import Ledger, RunStatus
from ledger.db import database_url
from ledger.fleet import FleetStore
from ledger.tokens import TokenRequest
from ledger.vocabulary import Role
from tests.support.driver import Driver, driver
from tests.support.not_plain import NOT_PLAIN

MODULES = ["tests.workflows_ops"]


TOKENS: dict[str, str] = {}  # role -> a token naming olga in that role


@pytest.fixture()
def cli_env(settings_env: dict[str, str], tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {**settings_env, "ONWARD_WORKFLOWS": ",".join(MODULES),
           "ONWARD_TEST_OPS_CALLS": str(tmp_path / "tool.log"),
           "ONWARD_FAKE_LLM_LOG": str(tmp_path / "llm.log"),
           "XDG_CONFIG_HOME": str(tmp_path / "config")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("ONWARD_TOKEN", raising=False)
    monkeypatch.delenv("ONWARD_AUTH", raising=False)
    ledger = Ledger.from_env()
    for role in ("viewer", "approver", "operator", "admin"):
        TOKENS[role] = ledger.create_token(
            TokenRequest("olga", Role(role), "default", timedelta(hours=1))).secret
    return env


@pytest.fixture()
def drv(cli_env: dict[str, str]) -> Iterator[Driver]:
    with driver(Ledger.from_env(), MODULES) as running:
        yield running


def onward(*args: str, role: str | None = "operator", input: str | None = None,
           code: int = 0) -> str:
    """Run the CLI with olga's token for ``role`` (None: no token at all)."""
    env = {"COLUMNS": "220", **({"ONWARD_TOKEN": TOKENS[role]} if role else {})}
    result = CliRunner().invoke(app, list(args), env=env, input=input)
    assert result.exit_code == code, (result.exit_code, result.output)
    # --json: stdout alone is the answer (a warning logged meanwhile goes to stderr)
    return result.stdout if "--json" in args else result.output


def finished(drv: Driver, **state: object) -> UUID:
    run_id = drv.ledger.start_run("test_ops_notes", {"topic": "cli", **state})
    assert drv.drive(run_id).status is RunStatus.COMPLETED
    return run_id


def test_cli_runs__ls_filters_pages_and_show(drv: Driver) -> None:
    """Reads: filters, --limit/--offset and the --before cursor page through runs; show
    prints lineage, steps, checkpoints and effects."""
    keyed = drv.ledger.start_run("test_ops_notes", {"topic": "cli"}, idempotency_key="k-cli-1")
    other = finished(drv)
    rows = json.loads(onward("runs", "ls", "--idempotency-key", "k-cli-1", "--json"))
    assert [r["id"] for r in rows] == [str(keyed)]
    first = json.loads(onward("runs", "ls", "--workflow", "test_ops_notes", "--limit", "1",
                              "--json"))
    assert first[0]["id"] == str(other)
    second = json.loads(onward("runs", "ls", "--workflow", "test_ops_notes", "--limit", "1",
                               "--offset", "1", "--json"))
    cursor = json.loads(onward("runs", "ls", "--workflow", "test_ops_notes", "--limit", "1",
                               "--before", str(other), "--json"))
    assert second == cursor and second[0]["id"] == str(keyed)
    assert "more: --before" in onward("runs", "ls", "--workflow", "test_ops_notes",
                                      "--limit", "1", "--since", "1h")
    text = onward("runs", "show", str(other))
    for part in ("steps", "checkpoints", "effects", "test.publish", "summarize"):
        assert part in text
    detail = json.loads(onward("runs", "show", str(other), "--json"))
    assert [c["seq"] for c in detail["checkpoints"]] == [0, 1, 2, 3]
    assert detail["run"]["status"] == "completed"


def test_cli_replay_and_continue__exit_codes_and_lineage(drv: Driver) -> None:
    """A replay asks before it starts, is linked both ways, and every command leaves one
    audit row; refusals exit 2 and say why; declining exits 1 and does nothing."""
    parent = finished(drv)
    onward("runs", "replay", str(parent), "--reason", "look", input="n\n", code=1)
    assert drv.ledger.children(parent) == []
    out = onward("runs", "replay", str(parent), "--mode", "evidence", "--reason", "audit",
                 "--yes")
    assert "started evidence run" in out
    [child] = drv.ledger.children(parent)
    assert drv.drive(child.id).status is RunStatus.COMPLETED
    detail = json.loads(onward("runs", "show", str(parent), "--json"))
    assert [c["id"] for c in detail["children"]] == [str(child.id)]
    shown = onward("runs", "show", str(child.id))
    assert f"evidence of {parent}" in shown
    refused = onward("runs", "continue", str(parent), "--reason", "again", "--yes", code=2)
    assert "refused" in refused and "completed" in refused
    onward("runs", "continue", str(child.id), "--reason", "again", "--yes", code=2)
    onward("runs", "replay", str(parent), "--reason", "x", "--yes", role="viewer", code=2)
    audit = json.loads(onward("audit", "ls", "--run", str(parent), "--json"))
    assert [(a["action"], a["outcome"], a["actor"], a["role"]) for a in reversed(audit)] == [
        ("replay", "done", "olga", "operator"), ("inspect", "done", "olga", "operator"),
        ("continue", "refused", "olga", "operator"), ("replay", "refused", "olga", "viewer")]


def test_cli_replay_and_start__note_when_no_live_worker_serves_the_workflow(
        drv: Driver) -> None:
    """A replay (or start, branch, continue) of a workflow no live worker serves is done,
    with a note on stderr saying why the run will not move; once a worker advertises the
    workflow, no note. (After make demo, whose workers stop with it, a replay said only
    'running, next step draft'.)"""
    parent = finished(drv)
    env = {"COLUMNS": "220", "ONWARD_TOKEN": TOKENS["operator"]}
    replay = ["runs", "replay", str(parent), "--reason", "look", "--yes"]
    unserved = CliRunner().invoke(app, replay, env=env)
    assert unserved.exit_code == 0, unserved.output
    assert "started evidence run" in unserved.stdout
    assert "note: test_ops_notes" in unserved.stderr
    assert "no live worker has this workflow" in unserved.stderr
    started = CliRunner().invoke(app, ["start", "test_ops_notes", "--input", '{"topic": "x"}'],
                                 env=env)
    assert UUID(started.stdout.strip()) and "note: test_ops_notes" in started.stderr
    FleetStore(database_url(drv.ledger.settings)).advertise(
        None, [("onward.steps.test_ops_notes.v1", "test_ops_notes", 1, None)])
    served = CliRunner().invoke(app, replay, env=env)
    assert served.exit_code == 0 and "note:" not in served.stderr, served.output


def test_cli_continue__shows_the_error_a_parking_error_wraps(drv: Driver) -> None:
    """Before asking, continue shows why the run stopped, down to the error the parking
    error wraps: it showed '… in 3 attempts: *** (sealed: see previous)' and not the
    previous one (runs show has it)."""
    run_id = drv.ledger.start_run("test_ops_notes", {"topic": "parked"})
    error = {"type": "NoWorkerCanRun", "message": "no worker could run step summarize at seq "
             "0 in 3 attempts: *** (sealed: see previous)",
             "previous": {"type": "UnknownWorkflow", "message": "no workflow 'test_ops_notes'"
                          " is registered in this worker; check ONWARD_WORKFLOWS"}}
    with drv.ledger.engine.begin() as conn:
        conn.execute(sa.text("UPDATE onward.runs SET status = 'needs_review', parked_reason = "
                             "'attempts_exhausted', last_error = CAST(:error AS jsonb) "
                             "WHERE id = :id"), {"error": json.dumps(error), "id": run_id})
    shown = onward("runs", "continue", str(run_id), "--reason", "look", input="n\n", code=1)
    assert ("see previous) ← UnknownWorkflow: no workflow 'test_ops_notes' is registered "
            "in this worker; check ONWARD_WORKFLOWS") in shown


def test_cli_retention_plan__says_which_policies_it_applies(
        drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """retention plan names the policies it planned with, and says when there are none (it
    printed '0 run(s) … would be compacted' either way, with no hint that nothing ever
    would be)."""
    monkeypatch.delenv("ONWARD_RETENTION_POLICIES", raising=False)
    unset = onward("retention", "plan", role="admin")
    assert "ONWARD_RETENTION_POLICIES is unset" in unset and "forever" in unset
    monkeypatch.setenv("ONWARD_RETENTION_POLICIES", "*/*=90")
    assert "policies: */*=90" in onward("retention", "plan", role="admin")
    assert json.loads(onward("retention", "plan", "--json", role="admin"))["policies"] == \
        "*/*=90"


def test_cli_retention_hold__takes_a_prefix_of_the_run_id(drv: Driver) -> None:
    """retention hold names its run as every runs command does, by id or unique prefix (it
    took only a whole UUID: 'invalid group count')."""
    run_id = finished(drv)
    held = onward("retention", "hold", str(run_id)[:-4], "--reason", "case 17", role="admin")
    assert f"{run_id} held" in held
    onward("retention", "hold", str(run_id)[:-4], "--release", "--reason", "closed",
           role="admin")
    audit = json.loads(onward("audit", "ls", "--run", str(run_id), "--json", role="admin"))
    assert [a["action"] for a in audit if a["action"] == "hold"] == ["hold", "hold"]


def test_cli_approvals_ls__an_empty_inbox_says_where_the_decided_ones_are(
        drv: Driver) -> None:
    """approvals ls lists pending approvals by default; with none it says how to list the
    decided ones (after make demo, whose approvals are all decided, it printed an empty
    table and nothing else)."""
    shown = onward("approvals", "ls")
    assert "no approval is pending; decided ones: --status approved" in shown


def test_cli_branch__shows_diff_needs_reason(drv: Driver) -> None:
    """A branch shows the diff before asking, refuses without a reason (exit 2, before it
    shows or asks anything), and stores its patch on the new run."""
    parent = finished(drv)
    out = onward("runs", "branch", str(parent), "--from", "2", "--set", "/channel=sports",
                 "--yes", code=2)
    assert "needs a reason" in out and '"sports"' not in out
    out = onward("runs", "branch", str(parent), "--from", "2", "--set", "/channel=sports",
                 "--reason", "look", input="n\n", code=1)
    assert '"news"' in out and '"sports"' in out and "start the branch?" in out
    onward("runs", "branch", str(parent), "--from", "2", "--set", "/topic=5", "--reason",
           "bad", "--yes", code=2)
    out = onward("runs", "branch", str(parent), "--from", "2", "--patch",
                 '[{"op": "replace", "path": "/channel", "value": "sports"}]',
                 "--reason", "wrong channel", "--allow-irreversible", "--yes")
    assert "started branch run" in out
    [branch] = drv.ledger.children(parent)
    assert branch.branch_patch == [{"op": "replace", "path": "/channel", "value": "sports"}]
    assert drv.drive(branch.id).status is RunStatus.COMPLETED


def test_cli_branch_and_repeat__a_workflow_module_that_cannot_be_imported_is_one_paragraph(
        drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """runs branch (its state check) and effects repeat (its tool lookup) import
    ONWARD_WORKFLOWS: a module there that does not exist ends the command with exit 2 and
    the paragraph onward worker gives (which module, why, where it was looked for), no
    traceback, and nothing started or sent."""
    parent = finished(drv)
    publish = next(e for e in drv.ledger.effects(parent) if e.effect_type == "test.publish")
    # first: the tool lookup stops at the first module holding the tool
    monkeypatch.setenv("ONWARD_WORKFLOWS", ",".join(["tests.no_such_workflows", *MODULES]))
    said = ("cannot import workflow module 'tests.no_such_workflows' (named in "
            "ONWARD_WORKFLOWS or --workflows): ModuleNotFoundError: No module named "
            "'tests.no_such_workflows'. ONWARD_WORKFLOWS names modules as package.module")
    out = onward("runs", "branch", str(parent), "--from", "2", "--set", "/channel=sports",
                 "--reason", "look", "--yes", code=2)
    assert said in " ".join(out.split()) and "Traceback" not in out, out
    assert drv.ledger.children(parent) == []
    out = onward("effects", "repeat", publish.effect_id, "--reason", "lost", "--yes",
                 role="admin", code=2)
    assert said in " ".join(out.split()) and "Traceback" not in out, out
    assert drv.ledger.find_effect(publish.effect_id, "test.publish").attempts == \
        publish.attempts


def test_cli_cancel_approve_effects(drv: Driver) -> None:
    """cancel, approvals approve and effects show/repeat through the CLI, with the role each
    needs."""
    waiting = drv.ledger.start_run("test_ops_notes", {"topic": "cli", "approve": True})
    assert drv.drive(waiting).status is RunStatus.WAITING
    pending = json.loads(onward("approvals", "ls", "--run", str(waiting), "--json"))
    [approval] = pending
    onward("approvals", "approve", approval["id"], "--yes", code=2)  # names no hash
    out = onward("approvals", "approve", approval["id"], "-m", "ok", input="y\n")
    assert "approved by olga" in out
    decisions = json.loads(onward("audit", "ls", "--run", str(waiting), "--json"))
    assert [(a["action"], a["outcome"], a["approval_id"]) for a in decisions] == [
        ("approve", "refused", approval["id"]), ("approve", "done", approval["id"])][::-1]
    assert drv.drive(waiting).status is RunStatus.COMPLETED
    effects = json.loads(onward("effects", "ls", "--run", str(waiting), "--json"))
    publish = next(e for e in effects if e["effect_type"] == "test.publish")
    shown = onward("effects", "show", publish["effect_id"][:12])
    assert "attempts" in shown and "call" in shown
    plan = onward("effects", "repeat", publish["effect_id"], "--reason", "lost", "--yes",
                  code=2)
    assert "needs the admin role" in plan and "dedup method" not in plan  # checked first
    done = onward("effects", "repeat", publish["effect_id"], "--reason", "lost", "--yes",
                  role="admin")
    assert "dedup method:   lookup" in done and "completed" in done
    running = drv.ledger.start_run("test_ops_notes", {"topic": "cli"})
    assert "cancelled" in onward("runs", "cancel", str(running), "--reason", "stop", "--yes")
    onward("runs", "cancel", str(running), "--reason", "stop", "--yes", code=2)


def test_cli_approvals__a_unique_prefix_names_an_approval_an_ambiguous_one_is_refused(
        drv: Driver) -> None:
    """approvals approve / reject take a unique prefix of the id (6+ digits), as runs and
    effects do; a prefix two approvals share is refused (exit 2) naming both, and decides
    nothing."""
    waiting = [drv.ledger.start_run("test_ops_notes", {"topic": "cli", "approve": True})
               for _ in range(2)]
    assert {drv.drive(r).status for r in waiting} == {RunStatus.WAITING}
    ids = sorted(a["id"] for a in json.loads(onward("approvals", "ls", "--json")))
    # uuid7: both begin with the time they were asked (the first 6 digits change every 4.7 h)
    shared = next(ids[0][:n] for n in range(len(ids[0]), 0, -1) if ids[1].startswith(ids[0][:n]))
    assert len(shared) >= 6, ids
    refused = onward("approvals", "approve", shared, "-m", "ok", input="y\n", code=2)
    assert "ambiguous" in refused and all(i in refused for i in ids), refused
    onward("approvals", "approve", "zz" + shared[2:], input="y\n", code=2)  # not hex
    out = onward("approvals", "approve", ids[0][:len(shared) + 2], "-m", "ok", input="y\n")
    assert "approved by olga" in out
    out = onward("approvals", "reject", ids[1][:len(shared) + 2], input="y\n")
    assert "rejected by olga" in out
    assert {a["status"] for a in json.loads(onward("approvals", "ls", "--status", "approved",
                                                   "--json"))} == {"approved"}
    decisions = json.loads(onward("audit", "ls", "--json"))
    # the ambiguous prefix and the one that is not hex are refusals, audited as for runs
    assert sorted((a["action"], a["outcome"], str(a["approval_id"])) for a in decisions
                  if a["action"] in ("approve", "reject")) == [
        ("approve", "done", ids[0]), ("approve", "refused", "None"),
        ("approve", "refused", "None"), ("reject", "done", ids[1])]


def test_cli_refusals_before_the_ledger_are_audited(drv: Driver) -> None:
    """Input the CLI refuses itself (an unknown mode, a malformed patch, an unknown run) is
    audited like any refusal, and exits 2."""
    parent = finished(drv)
    onward("runs", "replay", str(parent), "--mode", "dream", "--reason", "x", "--yes", code=2)
    onward("runs", "branch", str(parent), "--set", "channel=x", "--reason", "x", "--yes",
           code=2)
    missing = "01a229be-0000-7000-8000-000000000000"
    onward("runs", "cancel", missing, "--reason", "x", "--yes", code=2)
    audit = json.loads(onward("audit", "ls", "--outcome", "refused", "--limit", "3", "--json"))
    assert [(a["action"], a["run_id"]) for a in reversed(audit)] == [
        ("replay", str(parent)), ("branch", str(parent)), ("cancel", missing)]


def test_cli_inspect__reading_a_run_or_an_effect_is_audited(drv: Driver) -> None:
    """`runs show` and `effects show` each leave one 'inspect' audit row naming the reader
    and the role they read with (docs/design.md section 8: inspect is audited like every command);
    listing runs leaves none."""
    run_id = finished(drv)
    onward("runs", "ls", "--workflow", "test_ops_notes", role="viewer")
    onward("runs", "show", str(run_id), role="viewer")
    [effect, *_] = json.loads(onward("effects", "ls", "--run", str(run_id), "--json"))
    onward("effects", "show", effect["effect_id"])

    audit = json.loads(onward("audit", "ls", "--run", str(run_id), "--json"))
    assert [(a["action"], a["outcome"], a["actor"], a["role"], a["effect_id"])
            for a in reversed(audit)] == [
        ("inspect", "done", "olga", "viewer", None),
        ("inspect", "done", "olga", "operator", effect["effect_id"])]


def test_cli_since__counts_back_from_the_database_clock(
        cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: `runs ls --since 1h` and `audit ls --since 1h` count back from the
    database's clock, never this host's: with the database's clock a day behind this host's
    (every connection of this process), a run started now by the database's clock and its
    audit row are listed; an ISO time without a zone is refused, not guessed."""
    url = cli_env["ONWARD_DATABASE_URL"]
    behind = url + ("&" if "?" in url else "?") + "options=-c%20onward.clock_offset%3D-1d"
    monkeypatch.setenv("ONWARD_DATABASE_URL", behind)
    ledger = Ledger.from_env().acting_as("olga", Role.OPERATOR)
    run_id = ledger.start_run("test_ops_notes", {"topic": "clock"})
    ledger.cancel(run_id, "to leave an audit row")
    rows = json.loads(onward("runs", "ls", "--since", "1h", "--json", role="viewer"))
    assert str(run_id) in [r["id"] for r in rows]
    audit = json.loads(onward("audit", "ls", "--since", "1h", "--json", role="viewer"))
    assert str(run_id) in [a["run_id"] for a in audit]
    refused = onward("runs", "ls", "--since", "2026-01-01T09:00", role="viewer", code=2)
    assert "no time zone" in refused


def test_cli_effects_resolve__admin_records_what_was_found_then_continue(drv: Driver) -> None:
    """Invariant (review F11): ``effects resolve`` needs the admin role (checked before
    anything is shown), refuses a finding it cannot read (audited, exit 2), shows what it
    will record before asking, and records it; the continued run finishes with the object
    the person found, and nothing is sent again."""
    from tests.workflows_outcomes import OUTSIDE

    OUTSIDE.reset()
    with driver(Ledger.from_env(), ["tests.workflows_outcomes"]) as outcomes:
        OUTSIDE.lose_answers = 1
        run_id = outcomes.ledger.start_run("test_outcome_send", {"tool": "blind"})
        assert outcomes.drive(run_id).parked_reason == "effect_outcome_unknown"
        [effect] = json.loads(onward("effects", "ls", "--run", str(run_id), "--json"))
        key = effect["effect_id"]
        refused = onward("effects", "resolve", key, "--completed", "--provider-ref", "obj_1",
                         "--reason", "found it", "--yes", code=2)
        assert "needs the admin role" in refused and "you found" not in refused
        onward("effects", "resolve", key, "--completed", "--not-sent", "--reason", "x",
               "--yes", role="admin", code=2)
        onward("effects", "resolve", key, "--completed", "--provider-ref", "obj_1",
               "--result", "{not json", "--reason", "x", "--yes", role="admin", code=2)
        declined = onward("effects", "resolve", key, "--completed", "--provider-ref", "obj_1",
                          "--reason", "found it", role="admin", input="n\n", code=1)
        assert "you found:      completed (provider ref obj_1)" in declined
        out = onward("effects", "resolve", key, "--completed", "--provider-ref", "obj_1",
                     "--result", '{"id": "obj_1", "n": 1}', "--reason", "found it",
                     "--json", role="admin", input="y\n")
        done = json.loads(out.strip().splitlines()[-1])
        assert (done["finding"], done["effect"]["status"]) == ("completed", "completed")
        audit = json.loads(onward("audit", "ls", "--run", str(run_id), "--json"))
        assert [(a["action"], a["outcome"]) for a in audit
                if a["action"] == "resolve_effect"] == [
            ("resolve_effect", "done"), ("resolve_effect", "refused"),
            ("resolve_effect", "refused")]  # the role refusal came before the effect was read
        onward("runs", "continue", str(run_id), "--reason", "found obj_1", "--yes")
        run = outcomes.drive(run_id)
    assert run.status is RunStatus.COMPLETED and run.result == {"sent": "obj_1"}
    assert OUTSIDE.count() == 1
    OUTSIDE.reset()


def _parked(drv: Driver) -> UUID:
    """A run parked for review (attempts exhausted): one continue resumes."""
    run_id = drv.ledger.start_run("test_ops_notes", {"topic": "parked"})
    with drv.ledger.engine.begin() as conn:
        conn.execute(sa.text("UPDATE onward.runs SET status = 'needs_review', parked_reason = "
                             "'attempts_exhausted' WHERE id = :id"), {"id": run_id})
    return run_id


def test_cli_continue__refused_before_the_question(drv: Driver) -> None:
    """Given a run continue cannot resume (finished) or no --reason, continue refuses before
    it asks, with the ledger's words and exit 2, and audits the refusal once, as before;
    it asked first and refused only after a "y". A run it can resume is still asked about."""
    done = finished(drv)
    refused = onward("runs", "continue", str(done), "--reason", "again", input="y\n", code=2)
    assert "continue?" not in refused
    assert (f"refused: run {done} is completed: a finished run is never resumed; replay or "
            "branch it to take a new path") in refused
    parked = _parked(drv)
    no_reason = onward("runs", "continue", str(parked), input="y\n", code=2)
    assert "continue?" not in no_reason and "needs a reason (--reason)" in no_reason
    assert "continue?" in onward("runs", "continue", str(parked), "--reason", "look",
                                 input="n\n", code=1)
    audit = json.loads(onward("audit", "ls", "--action", "continue", "--json"))
    assert [(a["run_id"], a["outcome"], a["details"]["type"]) for a in reversed(audit)] == [
        (str(done), "refused", "OperationRefused"), (str(parked), "refused", "InvalidInput")]


def test_cli_continue__the_ledger_decides_when_the_run_changes_meanwhile(
        drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a run that could be continued when asked about, but is cancelled while the
    person answers, the ledger's own check (under the run's lock) still refuses the
    continue: exit 2, nothing resumed, one refusal audited."""
    parked = _parked(drv)

    def cancelled_meanwhile(question: str, default: bool) -> bool:
        with drv.ledger.engine.begin() as conn:
            conn.execute(sa.text("UPDATE onward.runs SET status = 'cancelled' WHERE id = :id"),
                         {"id": parked})
        return True

    monkeypatch.setattr("console.common.typer.confirm", cancelled_meanwhile)
    refused = onward("runs", "continue", str(parked), "--reason", "look", code=2)
    assert f"refused: run {parked} is cancelled" in refused
    assert drv.ledger.get_run(parked).status is RunStatus.CANCELLED  # type: ignore[union-attr]
    audit = json.loads(onward("audit", "ls", "--run", str(parked), "--json"))
    assert [(a["action"], a["outcome"]) for a in audit] == [("continue", "refused")]


def _refusals(action: str) -> list[tuple[str | None, str]]:
    """The audited refusals of ``action``, oldest first: (run_id, the error's type)."""
    audit = json.loads(onward("audit", "ls", "--action", action, "--outcome", "refused",
                              "--json"))
    return [(a["run_id"], a["details"]["type"]) for a in reversed(audit)]


def test_cli_cancel_replay_branch__refused_before_the_question(drv: Driver) -> None:
    """Given a cancel, replay or branch the ledger refuses (a finished run, no --reason, a
    checkpoint that ends the run), the command refuses before it shows the run or asks,
    with the ledger's words and exit 2, and audits the refusal once; it asked first and
    refused only after a "y"."""
    done = finished(drv)
    parked = _parked(drv)
    refused = onward("runs", "cancel", str(done), "--reason", "stop", input="y\n", code=2)
    assert "cancel it?" not in refused and f"cancel run {done}" not in refused
    assert f"refused: run {done} is already completed" in refused
    no_reason = onward("runs", "cancel", str(parked), input="y\n", code=2)
    assert "cancel it?" not in no_reason and "cancel needs a reason (--reason)" in no_reason
    refused = onward("runs", "replay", str(done), "--from", "3", "--reason", "again",
                     input="y\n", code=2)
    assert "start the replay?" not in refused and f"replay run {done}" not in refused
    assert f"refused: checkpoint 3 of run {done} ends the run (finish)" in refused
    no_reason = onward("runs", "replay", str(done), input="y\n", code=2)
    assert "start the replay?" not in no_reason and "replay needs a reason" in no_reason
    no_reason = onward("runs", "branch", str(done), "--from", "2", "--set", "/channel=x",
                       input="y\n", code=2)
    assert "start the branch?" not in no_reason and "branch needs a reason" in no_reason
    assert _refusals("cancel") == [(str(done), "OperationRefused"),
                                   (str(parked), "InvalidInput")]
    assert _refusals("replay") == [(str(done), "OperationRefused"), (str(done), "InvalidInput")]
    assert _refusals("branch") == [(str(done), "InvalidInput")]
    assert drv.ledger.children(done) == []
    assert drv.ledger.get_run(parked).status is RunStatus.NEEDS_REVIEW  # type: ignore[union-attr]
    # what the ledger allows is still shown and asked about
    asked = onward("runs", "cancel", str(parked), "--reason", "stop", input="n\n", code=1)
    assert f"cancel run {parked}" in asked and "cancel it?" in asked
    asked = onward("runs", "replay", str(done), "--reason", "look", input="n\n", code=1)
    assert "start the replay?" in asked and drv.ledger.children(done) == []
    assert len(_refusals("cancel")) == 2 and len(_refusals("replay")) == 2


def test_cli_effects_repeat_resolve__refused_before_the_question(drv: Driver) -> None:
    """Given a repeat without --reason, a resolve of an effect whose outcome is known, or an
    effect id that names none, effects repeat / resolve refuse before they show the plan or
    ask, with the ledger's words and exit 2, each refusal audited once (an unknown id too,
    which was refused unaudited)."""
    run_id = finished(drv)
    effects = json.loads(onward("effects", "ls", "--run", str(run_id), "--json"))
    publish = next(e for e in effects if e["effect_type"] == "test.publish")["effect_id"]
    refused = onward("effects", "repeat", publish, input="y\n", role="admin", code=2)
    assert "repeat this effect?" not in refused and "payload:" not in refused
    assert "repeat_effect needs a reason (--reason)" in refused
    refused = onward("effects", "resolve", publish, "--completed", "--provider-ref", "obj_9",
                     "--reason", "found it", input="y\n", role="admin", code=2)
    assert "record this finding?" not in refused and "you found:" not in refused
    assert f"refused: effect test.publish {publish[:16]}… is completed: its outcome is known" \
        in refused
    unknown = onward("effects", "repeat", "0123456789abcdef", "--reason", "lost", input="y\n",
                     role="admin", code=2)
    assert "refused: no effect 0123456789abcdef" in unknown
    onward("effects", "resolve", publish[:7], "--not-sent", "--reason", "x", role="admin",
           code=2)  # fewer than 8 characters
    audit = json.loads(onward("audit", "ls", "--outcome", "refused", "--json"))
    assert [(a["action"], a["effect_id"], a["details"]["type"]) for a in reversed(audit)] == [
        ("repeat_effect", publish, "InvalidInput"),
        ("resolve_effect", publish, "OperationRefused"),
        ("repeat_effect", None, "UnknownEffect"), ("resolve_effect", None, "InvalidInput")]
    assert [a.kind for a in drv.ledger.effect_attempts(
        drv.ledger.find_effect(publish))] == ["call"]  # nothing repeated or resolved


def test_cli_approvals__refused_before_the_artifact_and_the_question(drv: Driver) -> None:
    """Given an approval already decided, approvals approve / reject refuse before they show
    the artifact or ask, with the ledger's words and exit 2, each refusal audited once;
    they showed the whole artifact, asked, and refused only after a "y"."""
    waiting = drv.ledger.start_run("test_ops_notes", {"topic": "cli", "approve": True})
    assert drv.drive(waiting).status is RunStatus.WAITING
    [approval] = json.loads(onward("approvals", "ls", "--run", str(waiting), "--json"))
    assert "approved by olga" in onward("approvals", "approve", approval["id"], input="y\n")
    for verb in ("approve", "reject"):
        refused = onward("approvals", verb, approval["id"], input="y\n", code=2)
        assert f"{verb} it?" not in refused and "--- artifact" not in refused, refused
        assert (f"refused: approval {approval['id']} is already approved by olga at "
                in refused) and "a decision is taken once" in refused
    audit = json.loads(onward("audit", "ls", "--json"))
    assert [(a["action"], a["outcome"], a["details"].get("type")) for a in reversed(audit)
            if a["approval_id"] == approval["id"]] == [
        ("approve", "done", None), ("approve", "refused", "ApprovalRefused"),
        ("reject", "refused", "ApprovalRefused")]


def test_cli_cancel__the_ledger_decides_when_the_run_changes_meanwhile(
        drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a run that could be cancelled when asked about, but that a worker finishes
    while the person answers, the ledger's own check (under the run's lock) still refuses
    the cancel: exit 2, the run stays completed, one refusal audited."""
    run_id = drv.ledger.start_run("test_ops_notes", {"topic": "meanwhile"})

    def finished_meanwhile(question: str, default: bool) -> bool:
        assert drv.drive(run_id).status is RunStatus.COMPLETED
        return True

    monkeypatch.setattr("console.common.typer.confirm", finished_meanwhile)
    refused = onward("runs", "cancel", str(run_id), "--reason", "stop", code=2)
    assert f"cancel run {run_id}" in refused
    assert f"refused: run {run_id} is already completed" in refused
    assert drv.ledger.get_run(run_id).status is RunStatus.COMPLETED  # type: ignore[union-attr]
    audit = json.loads(onward("audit", "ls", "--run", str(run_id), "--json"))
    assert [(a["action"], a["outcome"]) for a in audit] == [("cancel", "refused")]


def test_cli_approve__the_ledger_decides_when_the_approval_is_decided_meanwhile(
        drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a pending approval, rejected by someone else while the person looks at the
    artifact and answers, the ledger's own check (under the approval's lock) refuses the
    approval: exit 2, the rejection stands, one refusal audited after the rejection."""
    waiting = drv.ledger.start_run("test_ops_notes", {"topic": "cli", "approve": True})
    assert drv.drive(waiting).status is RunStatus.WAITING
    [approval] = json.loads(onward("approvals", "ls", "--run", str(waiting), "--json"))
    other = drv.ledger.acting_as("rita", Role.ADMIN)

    def rejected_meanwhile(question: str, default: bool) -> bool:
        other.reject(UUID(approval["id"]), artifact_hash=approval["artifact_hash"],
                     comment="not now")
        return True

    monkeypatch.setattr("console.common.typer.confirm", rejected_meanwhile)
    refused = onward("approvals", "approve", approval["id"], "-m", "ok", code=2)
    assert "--- artifact" in refused
    assert f"refused: approval {approval['id']} is already rejected by rita" in refused
    assert drv.ledger.get_approval(UUID(approval["id"])).status.value == "rejected"
    audit = json.loads(onward("audit", "ls", "--json"))
    assert [(a["action"], a["outcome"], a["actor"]) for a in reversed(audit)
            if a["approval_id"] == approval["id"]] == [
        ("reject", "done", "rita"), ("approve", "refused", "olga")]


def test_cli_json__every_error_is_one_json_object_on_stdout(drv: Driver) -> None:
    """Given --json, a command that ends in an error (refused, not authenticated, a usage
    error, declined at the prompt) prints one JSON object on stdout, ``{"kind": "error",
    "ok": false, "error", "type", "message", "exit_code"}``, the text on stderr as before,
    and exits as before; stdout was empty (or text), which no JSON reader accepts. The plan
    a command shows before asking goes to stderr with --json."""
    done = finished(drv)
    cases = [
        (("runs", "show", "0123456789ab", "--json"), "operator", 2, "refused", "no run"),
        (("runs", "ls", "--json"), None, 2, "not_authenticated", "ONWARD_TOKEN"),
        (("runs", "ls", "--status", "bogus", "--json"), "operator", 2, "usage", "bogus"),
        (("runs", "replay", str(done), "--reason", "look", "--json"), "operator", 1,
         "declined", "nothing done"),
        (("runs", "replay", str(done), "--from", "3", "--reason", "x", "--json"), "operator",
         2, "refused", "ends the run")]
    for args, role, code, error, words in cases:
        [answer] = _json_lines(onward(*args, role=role, input="n\n", code=code))
        assert (answer["kind"], answer["ok"], answer["error"], answer["exit_code"]) == (
            "error", False, error, code), (args, answer)
        assert words in answer["message"], (args, answer)
    effects = json.loads(onward("effects", "ls", "--run", str(done), "--json"))
    publish = next(e for e in effects if e["effect_type"] == "test.publish")["effect_id"]
    declined = onward("effects", "repeat", publish, "--reason", "lost", "--json", role="admin",
                      input="n\n", code=1)
    assert [a["error"] for a in _json_lines(declined)] == ["declined"]


def _json_lines(stdout: str) -> list[dict[str, object]]:
    """Each line of ``stdout`` parsed, but the answer typed at a prompt, which CliRunner
    echoes to stdout (a terminal echoes it itself; the prompt went to stderr)."""
    return [json.loads(line) for line in stdout.splitlines() if line.strip() not in ("", "n")]


def test_cli_keys_erase_tenant__refused_before_the_question(drv: Driver) -> None:
    """Given no encryption keys configured, keys erase-tenant refuses before it asks, with
    the ledger's words and exit 2, audited once; it asked "destroy the data keys …?" and
    refused only after a "y"."""
    refused = onward("keys", "erase-tenant", "--reason", "leaving", role="admin", input="y\n",
                     code=2)
    assert "destroy the data keys" not in refused
    assert "refused: no encryption keys are configured" in refused
    audit = json.loads(onward("audit", "ls", "--action", "keys", "--json"))
    assert [(a["outcome"], a["details"]["type"]) for a in audit] == [("refused", "InvalidInput")]


def test_cli_start_and_signal__input_nested_past_the_parser_is_refused_not_a_traceback(
        drv: Driver) -> None:
    """--input (start), --payload (signal) and --patch (branch) nesting 100,000 arrays are
    refused with exit 2 and a message saying the JSON nests too deeply (they ended the
    command with a RecursionError traceback, exit 1); nothing is started or sent."""
    deep = "[" * 100_000 + "]" * 100_000
    said = onward("start", "test_ops_notes", "--input", '{"topic": ' + deep + "}", code=2)
    assert "nests objects and arrays too deeply" in " ".join(said.split()), said
    run_id = finished(drv)
    for args in (["runs", "signal", str(run_id), "go", "--payload", deep],
                 ["runs", "branch", str(run_id), "--from", "0", "--patch", deep,
                  "--reason", "r", "--yes"]):
        said = onward(*args, code=2)
        assert "nests objects and arrays too deeply" in " ".join(said.split()), (args, said)
    assert len(drv.ledger.list_runs()) == 1


def test_cli_replay_branch__refused_while_the_parent_has_an_effect_of_unknown_outcome(
        drv: Driver) -> None:
    """Invariant: a live replay or a branch runs the parent's steps again under new keys,
    so while the parent has an effect whose outcome at the provider is unknown (its answer
    lost), starting one could make the same write twice. Given such a parent, runs replay
    --mode live and runs branch are refused (exit 2, the effect named, nothing created,
    audited); an evidence replay, which calls nothing, starts; with --allow-unresolved each
    starts (audited with the effect it was allowed beside); once the effect is resolved, a
    live replay starts without it."""
    from tests.workflows_outcomes import OUTSIDE

    OUTSIDE.reset()
    try:
        with driver(Ledger.from_env(), ["tests.workflows_outcomes"]) as outcomes:
            OUTSIDE.lose_answers = 1
            parent = outcomes.ledger.start_run("test_outcome_send", {"tool": "blind"})
            assert outcomes.drive(parent).parked_reason == "effect_outcome_unknown"
        [effect] = json.loads(onward("effects", "ls", "--run", str(parent), "--json"))
        key = effect["effect_id"]
        live = ["runs", "replay", str(parent), "--mode", "live", "--reason", "again", "--yes"]
        branch = ["runs", "branch", str(parent), "--set", '/tool="blind"', "--reason",
                  "again", "--yes"]
        for command in (live, branch):
            refused = onward(*command, code=2)
            assert "refused:" in refused and key in refused, refused
            assert "outcome at the provider is unknown" in refused
            assert "--allow-unresolved" in refused
        assert drv.ledger.children(parent) == []
        assert _refusals("replay") == [(str(parent), "OperationRefused")]
        assert _refusals("branch") == [(str(parent), "OperationRefused")]
        onward("runs", "replay", str(parent), "--mode", "evidence", "--reason", "look",
               "--yes")
        assert [c.mode for c in drv.ledger.children(parent)] == ["evidence"]
        # --allow-unresolved with a mode that sends nothing is a usage mistake
        onward("runs", "replay", str(parent), "--mode", "evidence", "--allow-unresolved",
               "--reason", "look", "--yes", code=2)
        assert "started live run" in onward(*live, "--allow-unresolved")
        assert "started branch run" in onward(*branch, "--allow-unresolved")
        assert sorted(c.mode for c in drv.ledger.children(parent)) == [
            "branch", "evidence", "live"]
        audit = json.loads(onward("audit", "ls", "--run", str(parent), "--json"))
        allowed = [a["details"]["unresolved_effects"] for a in audit
                   if a["action"] in ("replay", "branch") and a["outcome"] == "done"
                   and a["details"].get("allow_unresolved")]
        assert [[e["effect_id"] for e in found] for found in allowed] == [[key], [key]]
        onward("effects", "resolve", key, "--completed", "--provider-ref", "obj_1",
               "--reason", "found it", "--yes", role="admin")
        assert "started live run" in onward(*live)
        assert len(drv.ledger.children(parent)) == 4
    finally:
        OUTSIDE.reset()


def test_cli_replay_branch__a_parent_with_its_effects_settled_is_replayed_live(
        drv: Driver) -> None:
    """A parent whose effects all have a known outcome is replayed live and branched with
    no extra flag (the guard above only counts effects of unknown outcome)."""
    parent = finished(drv)
    onward("runs", "replay", str(parent), "--mode", "live", "--reason", "again", "--yes")
    onward("runs", "branch", str(parent), "--from", "2", "--set", "/channel=sports",
           "--reason", "again", "--yes")
    assert sorted(c.mode for c in drv.ledger.children(parent)) == ["branch", "live"]


def test_cli_verify__an_edited_effect_recipient_is_reported(drv: Driver) -> None:
    """Invariant: an effect's recipient edited in the database (the publish went to 'news';
    the row is made to say 'attacker') is reported by ``onward verify`` (exit 3, naming the
    effect's recipient), as an edit of its request is; its MAC removed as well, too. A
    recipient dropped (NULL, as retention leaves it) is not a problem."""
    run_id = finished(drv)
    assert "0 problem(s)" in onward("verify", str(run_id), role="admin")
    [publish] = [e for e in drv.ledger.effects(run_id) if e.effect_type == "test.publish"]
    assert publish.recipient == "news" and publish.recipient_mac

    def edit(assignments: str) -> None:
        with drv.ledger.engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE onward.effects SET {assignments} "
                                 "WHERE effect_type = :t AND effect_id = :i"),
                         {"t": publish.effect_type, "i": publish.effect_id})

    edit("recipient = 'attacker'")
    reported = onward("verify", str(run_id), role="admin", code=3)
    assert publish.effect_id[:16] in reported and "recipient does not match its MAC" in reported
    edit("recipient_mac = NULL")
    reported = onward("verify", str(run_id), role="admin", code=3)
    assert "recipient is not signed" in reported
    edit("recipient = NULL")
    assert "0 problem(s)" in onward("verify", str(run_id), role="admin")


# each CLI option that reads JSON a person gives: its arguments around the value (an
# object's member, a patch operation's value); the nested cases 7939afa covers are left out
ENTRY_POINTS = {
    "start --input": lambda run, v, f: ["start", "test_ops_notes", "--input",
                                        '{"topic": ' + v + "}"],
    "runs signal --payload": lambda run, v, f: ["runs", "signal", run, "go", "--payload", v],
    "runs branch --patch": lambda run, v, f: [
        "runs", "branch", run, "--from", "0", "--reason", "r", "--yes", "--patch",
        '[{"op": "replace", "path": "/topic", "value": ' + v + "}]"],
    "runs branch --patch-file": lambda run, v, f: [
        "runs", "branch", run, "--from", "0", "--reason", "r", "--yes", "--patch-file",
        f('[{"op": "replace", "path": "/topic", "value": ' + v + "}]")],
    "runs branch --set": lambda run, v, f: [
        "runs", "branch", run, "--from", "0", "--reason", "r", "--yes", "--set", "/topic=" + v],
    "effects resolve --result": lambda run, v, f: [
        "effects", "resolve", run, "--completed", "--provider-ref", "obj_1", "--reason", "r",
        "--yes", "--result", '{"id": ' + v + "}"],
    "tools check --payload": lambda run, v, f: [
        "tools", "check", "examples.sales:create_offer", "--payload", '{"amount": ' + v + "}"],
    "tools check --payload-file": lambda run, v, f: [
        "tools", "check", "examples.sales:create_offer", "--payload-file",
        f('{"amount": ' + v + "}")],
}
# refused in these words before: nested, by 7939afa's parse_json (the nested_past test);
# a NUL, by the ledger's own check of the value
BEFORE = {(entry, "nested") for entry in ("start --input", "runs signal --payload",
                                          "runs branch --patch", "runs branch --patch-file")
          } | {(entry, "nul") for entry in ENTRY_POINTS if not entry.startswith("tools")}


@pytest.mark.parametrize("case", [(entry, bad) for entry in ENTRY_POINTS for bad in NOT_PLAIN
                                  if (entry, bad) not in BEFORE], ids="-".join)
def test_cli_json_options__json_onward_cannot_store_is_refused_with_what_and_where(
        drv: Driver, tmp_path: Path, case: tuple[str, str]) -> None:
    """Every option that reads JSON a person gives (start's input, a signal's payload, a
    branch's patch, its file and its --set values, a resolve's result, a tool check's
    sample) refuses, exit 2 and a message saying what, JSON that json.loads reads but
    onward cannot store: nested past the parser (a RecursionError traceback, exit 1),
    NaN, a float too large to be finite, a NUL, a lone surrogate, an integer of 5,001
    digits (refused later, if at all, in other words, or, for tools check, not before the
    tool was about to be called). Nothing is started, sent, branched or resolved."""
    entry, bad = case
    value, said = NOT_PLAIN[bad]
    run_id = finished(drv)
    publish = next(e.effect_id for e in drv.ledger.effects(run_id)
                   if e.effect_type == "test.publish")

    def written(text: str) -> str:
        path = tmp_path / "given.json"
        path.write_text(text, errors="surrogatepass")
        return str(path)

    target = publish if entry.startswith("effects") else str(run_id)
    answer = CliRunner().invoke(app, ENTRY_POINTS[entry](target, value, written),
                                env={"COLUMNS": "220", "ONWARD_TOKEN": TOKENS["admin"]})
    assert answer.exit_code == 2, (answer.exit_code, answer.output[-2000:])
    assert said in " ".join(answer.output.split()), answer.output[-2000:]
    assert len(drv.ledger.list_runs()) == 1
    assert [a.kind for a in drv.ledger.effect_attempts(drv.ledger.find_effect(publish))] == [
        "call"]
