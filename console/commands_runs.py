"""``onward runs``: list and inspect runs, and the commands that act on one
(continue, replay, branch, cancel). Each change shows what it will do and asks first."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn
from uuid import UUID

import typer
from rich.table import Table

from console.commands_workers import note_unserved
from console.common import (
    EXIT_REFUSED,
    JsonFlag,
    LimitOpt,
    OffsetOpt,
    ReasonOpt,
    YesFlag,
    confirm,
    err,
    fail,
    open_ledger,
    out,
    parse_json,
    parse_since,
    plain,
    print_json,
    reported,
    resolve_run,
    run_of,
    when,
)
from console.render import run_detail, show_run
from console.safe import add_row, id_column, json_text, line
from ledger import Ledger, RunStatus
from ledger.api import REFUSALS
from ledger.exceptions import InvalidInput, UnknownRun
from ledger.forks import BudgetPolicy, PatchChange
from ledger.inspection import RunFilter
from ledger.json_input import NotPlainJson, unstorable
from ledger.vocabulary import AuditAction, LaunchMode

__all__ = [
    "FromSeq",
    "RunArg",
    "diff_table",
    "run_row",
    "runs_app",
    "runs_branch",
    "runs_cancel",
    "runs_continue",
    "runs_ls",
    "runs_replay",
    "runs_show",
    "runs_signal",
    "runs_wait",
]


runs_app = typer.Typer(help="Inspect runs and act on them (continue, replay, branch, cancel).",
                       no_args_is_help=True)

RunArg = Annotated[str, typer.Argument(metavar="RUN", help="The run's id, or a unique prefix of it "
                                              "(6+ hex digits, as `runs ls` shows).")]
FromSeq = Annotated[int, typer.Option("--from-seq", "--from", min=0,
                                      help="The parent's checkpoint to start from.")]


def run_row(run: Any) -> dict[str, Any]:
    return {
        "id": str(run.id), "workflow": run.workflow, "version": run.workflow_version,
        "status": run.status.value, "seq": run.seq, "step": run.step, "attempt": run.attempt,
        "restores": run.restore_count, "stale_deliveries": run.stale_deliveries,
        "conversation_id": run.conversation_id, "idempotency_key": run.idempotency_key,
        "parked_reason": run.parked_reason, "last_error": run.last_error, "result": run.result,
        "mode": run.mode, "parent_run_id": str(run.parent_run_id) if run.parent_run_id else None,
        "parent_seq": run.parent_seq, "launch_reason": run.launch_reason,
        "created_at": run.created_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }


@runs_app.command("ls")
def runs_ls(
    status: Annotated[RunStatus | None, typer.Option(help="Only runs in this status.")] = None,
    workflow: Annotated[str | None, typer.Option(help="Only runs of this workflow.")] = None,
    since: Annotated[str | None, typer.Option(help="Created since: 30m, 2h, 7d or ISO.")] = None,
    conversation: Annotated[str | None, typer.Option(help="Only this conversation.")] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="The run started with this key.")]
    = None,
    parent: Annotated[str | None, typer.Option(help="Replays and branches of this run.")]
    = None,
    version: Annotated[int | None, typer.Option(help="Only runs of this workflow version.")]
    = None,
    before: Annotated[UUID | None, typer.Option(help="Page cursor: runs older than this one.")]
    = None,
    limit: LimitOpt = 50,
    offset: OffsetOpt = 0,
    as_json: JsonFlag = False,
) -> None:
    """List runs, newest first. Page with --limit/--offset, or --before the last id shown."""
    ledger = open_ledger()
    with reported():
        where = RunFilter(
            status=status, workflow=workflow, workflow_version=version,
            conversation_id=conversation, idempotency_key=idempotency_key,
            since=parse_since(since), before=before,
            parent_run_id=resolve_run(ledger, parent) if parent else None)
        found = ledger.find_runs(where, limit=limit, offset=offset)
    if as_json:
        print_json([run_row(r) for r in found])
        return
    # replays and branches only: two empty columns took the room the run id needs
    lineage = any(r.parent_run_id for r in found)
    table = Table(id_column("run"), "workflow", "status", "seq", "step",
                  *(("mode", "parent") if lineage else ()), "created")
    for r in found:
        parent = f"{r.parent_run_id}@{r.parent_seq}" if r.parent_run_id else ""
        add_row(table, r.id, f"{r.workflow} v{r.workflow_version or '-'}", r.status.value,
                r.seq, r.step or "-", *((r.mode or "", parent) if lineage else ()),
                when(r.created_at))
    out.print(table)
    if len(found) == limit:
        out.print(line(f"more: --before {found[-1].id}  (or --offset {offset + limit})"))


@runs_app.command("show")
def runs_show(run_id: RunArg, as_json: JsonFlag = False) -> None:
    """A run: header, lineage (parent, children), step timeline, checkpoints, effects,
    approvals and its audit trail. Each inspection is itself audited."""
    ledger = open_ledger(AuditAction.INSPECT)
    found = resolve_run(ledger, run_id)
    with reported():
        ledger.inspected(run_id=found)
        detail = run_detail(ledger, found)
    if as_json:
        print_json(detail)
        return
    show_run(detail)


def _get(ledger: Ledger, text: str, action: AuditAction) -> Any:
    """The run ``text`` names (id or unique prefix), once the actor's role allows
    ``action`` (checked first); refusals are audited."""
    with reported():
        run_id = run_of(ledger, text, action)
    run = ledger.get_run(run_id)
    if run is None:
        _refuse(ledger, action, UnknownRun(f"no run {run_id}"), run_id)
    return run


def _refuse(ledger: Ledger, action: AuditAction, error: Exception,
            run_id: UUID | None = None) -> NoReturn:
    """A refusal found before the ledger is asked: audited like any other, exit 2."""
    with reported():
        raise ledger.refuse(action, error, run_id=run_id)
    raise AssertionError("unreachable")  # pragma: no cover - reported() exits


@runs_app.command("continue")
def runs_continue(run_id: RunArg, reason: ReasonOpt = None, yes: YesFlag = False) -> None:
    """Resume the ORIGINAL run at its current seq (parked, failed by an error, or stalled).
    Finished runs, replays and waits are refused with the command to use instead."""
    ledger = open_ledger()
    run = _get(ledger, run_id, AuditAction.CONTINUE)
    with reported():  # refused before the question, as the ledger would refuse after it
        ledger.continue_run(run.id, reason, dry_run=True)
    out.print(line(f"continue run {run.id} (", run.workflow, f"): {run.status.value} at seq "
                   f"{run.seq}, next step ", run.step or "(start)"), soft_wrap=True)
    if run.parked_reason or run.last_error:
        out.print(line("  stopped because: ", run.parked_reason or "", " ",
                       _error_chain(run.last_error)), soft_wrap=True)
    out.print(line("  the step runs again at the same seq; recorded model calls and effects are "
              "reused, unknown effect outcomes are reconciled first"))
    with reported():
        confirm("continue?", yes)
        done = ledger.continue_run(run.id, reason)
    out.print(line(("continued", "green"), f" run {done.run_id} at seq {done.seq} "
                   f"(was {done.previous_status.value})"), soft_wrap=True)
    note_unserved(ledger, run.workflow)
    if done.due_at is not None:  # its head is a timer whose time has not come
        out.print(line(f"  its timer has not ended: step {done.step} runs at "
                       f"{done.due_at:%Y-%m-%d %H:%M:%S}"), soft_wrap=True)
    elif done.waiting_on is not None:  # its head is a wait nothing ended
        out.print(line("  its wait has not ended: it waits again for ", done.waiting_on),
                  soft_wrap=True)


def _error_chain(error: Any) -> str:
    """An error's message, then each earlier error it wraps (``previous``) as ``← type:
    message``: a run parked after its attempts ran out says '… in 3 attempts: *** (sealed:
    see previous)', and the cause is the one before."""
    parts: list[str] = []
    while isinstance(error, dict):
        message = str(error.get("message", ""))
        parts.append(f"← {error.get('type')}: {message}" if parts else message)
        error = error.get("previous")
    return " ".join(parts)


AllowUnresolved = Annotated[bool, typer.Option(
    "--allow-unresolved",
    help="Live replays and branches: start even though the parent has effects whose outcome "
         "at the provider is unknown, which the new run may make a second time.")]
_UNRESOLVED_TEXT = "; the parent's effects of unknown outcome MAY be made a second time"


@runs_app.command("replay")
def runs_replay(
    run_id: RunArg,
    from_seq: FromSeq = 0,
    mode: Annotated[str, typer.Option(
        help="evidence: recorded answers only, nothing called; simulation: tools' sandboxes; "
             "live: real calls")] = LaunchMode.EVIDENCE.value,
    reason: ReasonOpt = None,
    budgets: Annotated[BudgetPolicy, typer.Option(
        help="inherited: the parent's limits and spend before the checkpoint; reset: fresh")]
    = BudgetPolicy.INHERITED,
    allow_irreversible: Annotated[bool, typer.Option(
        "--allow-irreversible", help="Live only: let irreversible effects be sent for real.")]
    = False,
    allow_unresolved: AllowUnresolved = False,
    yes: YesFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Start a NEW run from a copy of checkpoint --from-seq of RUN, in the given mode."""
    ledger = open_ledger()
    run = _get(ledger, run_id, AuditAction.REPLAY)
    if mode not in {m.value for m in _MODE_TEXT}:
        _refuse(ledger, AuditAction.REPLAY, InvalidInput(
            f"--mode {mode!r}: one of {', '.join(m.value for m in _MODE_TEXT)}"), run.id)
    launch_mode = LaunchMode(mode)
    with reported():  # refused before the question, as the ledger would refuse after it
        ledger.replay(run.id, from_seq, launch_mode, reason, budgets=budgets,
                      allow_irreversible=allow_irreversible,
                      allow_unresolved=allow_unresolved, dry_run=True)
    say = err if as_json else out  # with --json, stdout carries the JSON only
    say.print(line(f"replay run {run.id} (", run.workflow, f") from checkpoint {from_seq} as a "
                   f"new {launch_mode.value} run; budgets {budgets.value}",
                   "; irreversible effects WILL be sent" if allow_irreversible else "",
                   _UNRESOLVED_TEXT if allow_unresolved else ""),
              soft_wrap=True)
    say.print(line(_MODE_TEXT[launch_mode]))
    with reported():
        confirm("start the replay?", yes)
        launched = ledger.replay(run.id, from_seq, launch_mode, reason, budgets=budgets,
                                 allow_irreversible=allow_irreversible,
                                 allow_unresolved=allow_unresolved)
    _launched(ledger, run.workflow, launched, as_json)


_MODE_TEXT = {
    LaunchMode.EVIDENCE: "  evidence: every model call, read and effect is answered from the "
                         "parent's records; nothing external is called; a call the parent "
                         "never made stops the replay as diverged",
    LaunchMode.SIMULATION: "  simulation: tools run their sandbox (simulate); model calls and "
                           "reads are live",
    LaunchMode.LIVE: "  live: real calls with the new run's own keys; irreversible effects "
                     "are refused unless --allow-irreversible",
}


def _launched(ledger: Ledger, workflow: str, launched: Any, as_json: bool) -> None:
    if as_json:
        print_json(launched)
    else:
        _print_launched(launched)
    note_unserved(ledger, workflow)


def _print_launched(launched: Any) -> None:
    out.print(line(("started", "green"), f" {launched.mode.value} run {launched.run_id} from "
                   f"{launched.parent_run_id}@{launched.parent_seq}: {launched.status.value}, "
                   "next step ", launched.step or "(start)"), soft_wrap=True)
    if launched.last_error:
        out.print(line("  ", ("diverged at once:", "red"), " ",
                       str(launched.last_error.get("message"))), soft_wrap=True)


@runs_app.command("branch")
def runs_branch(
    run_id: RunArg,
    from_seq: FromSeq = 0,
    patch: Annotated[str | None, typer.Option(help="RFC 6902 JSON Patch, as JSON text.")] = None,
    patch_file: Annotated[Path | None, typer.Option(help="A file holding the patch.")] = None,
    set_values: Annotated[list[str] | None, typer.Option(
        "--set", help="Shorthand for a replace: /path=JSON (repeatable).")] = None,
    reason: ReasonOpt = None,
    allow_irreversible: Annotated[bool, typer.Option(
        "--allow-irreversible", help="Let the branch send irreversible effects.")] = False,
    allow_unresolved: AllowUnresolved = False,
    budgets: Annotated[BudgetPolicy, typer.Option(help="inherited or reset")]
    = BudgetPolicy.INHERITED,
    yes: YesFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Start a NEW live run from checkpoint --from-seq of RUN with an edited state. Shows the
    diff first; the parent's queue, approvals and effects are never touched."""
    from tasks.operator import state_check

    ledger = open_ledger()
    run = _get(ledger, run_id, AuditAction.BRANCH)
    try:
        operations = _patch(patch, patch_file, set_values or [])
    except InvalidInput as exc:
        _refuse(ledger, AuditAction.BRANCH, exc, run.id)
    try:
        diff = ledger.preview_branch(run.id, from_seq, operations)
    except REFUSALS as exc:
        _refuse(ledger, AuditAction.BRANCH, exc, run.id)
    with reported():  # a workflow module that cannot be imported: one paragraph, exit 2
        check_state = state_check(ledger.settings.workflows)
    with reported():  # refused before the question, as the ledger would refuse after it
        ledger.branch(run.id, from_seq, operations, reason, allow_irreversible=allow_irreversible,
                      budgets=budgets, check_state=check_state,
                      allow_unresolved=allow_unresolved, dry_run=True)
    say = err if as_json else out  # with --json, stdout carries the JSON only
    say.print(line(f"branch run {run.id} (", run.workflow, f") from checkpoint {from_seq}, "
                   "with:"), soft_wrap=True)
    say.print(diff_table(diff))
    say.print(line("  the branch calls for real under its own keys"
                   + ("; irreversible effects WILL be sent" if allow_irreversible
                      else "; irreversible effects are refused (--allow-irreversible to send)")
                   + (_UNRESOLVED_TEXT if allow_unresolved else "")))
    with reported():
        confirm("start the branch?", yes)
        launched = ledger.branch(run.id, from_seq, operations, reason,
                                 allow_irreversible=allow_irreversible, budgets=budgets,
                                 check_state=check_state, allow_unresolved=allow_unresolved)
    _launched(ledger, run.workflow, launched, as_json)


def _patch(text: str | None, path: Path | None, sets: list[str]) -> list[dict[str, Any]]:
    operations: list[dict[str, Any]] = []
    try:
        if text is not None:
            operations.extend(parse_json(text))
        if path is not None:
            operations.extend(parse_json(path.read_text()))
        for item in sets:
            pointer, sep, value = item.partition("=")
            if not sep or not pointer.startswith("/"):
                raise InvalidInput(f"--set {item!r}: write it as /path=JSON, e.g. /amount=1500")
            operations.append({"op": "replace", "path": pointer, "value": _json(value)})
    except (ValueError, TypeError, OSError) as exc:
        raise InvalidInput(f"the patch is not a JSON list of operations: {exc}") from exc
    if not operations:
        raise InvalidInput("give the changes: --patch, --patch-file or --set /path=JSON")
    return operations


def _json(value: str) -> Any:
    try:
        return parse_json(value)
    except NotPlainJson:
        raise  # NaN, a NUL...: refused, not taken for a word
    except ValueError:
        pass
    problem = unstorable(value)  # a bare word is a string, one onward can store
    if problem is not None:
        raise NotPlainJson(problem)
    return value


def diff_table(changes: list[PatchChange]) -> Table:
    table = Table("op", "path", "before", "after")
    for change in changes:
        path = change.path if change.from_path is None else f"{change.from_path} → {change.path}"
        add_row(table, change.op, path, json_text(plain(change.before)),
                json_text(plain(change.after)))
    return table


@runs_app.command("cancel")
def runs_cancel(run_id: RunArg, reason: ReasonOpt = None, yes: YesFlag = False) -> None:
    """Stop a run that has not finished, never abandoning an external effect whose outcome is
    unknown: a step in flight stops at its next call and its worker ends the run; pending
    approvals are invalidated."""
    ledger = open_ledger()
    run = _get(ledger, run_id, AuditAction.CANCEL)
    with reported():  # refused before the question, as the ledger would refuse after it
        ledger.cancel(run.id, reason, dry_run=True)
    out.print(line(f"cancel run {run.id} (", run.workflow, f"): {run.status.value} at seq "
                   f"{run.seq}, next step ", run.step or "(start)"), soft_wrap=True)
    with reported():
        confirm("cancel it?", yes)
        done = ledger.cancel(run.id, reason)
    if done.requested:
        holder = (f"worker {done.was_leased_by} stops at its next call"
                  if done.was_leased_by else "a worker resolves its effects first")
        out.print(line(("cancel requested", "yellow"),
                       f" for run {done.run_id} at seq {done.seq}: {holder}, then ends it "
                       "cancelled (or parks it if an effect's outcome stays unknown); follow "
                       "it with onward runs show"), soft_wrap=True)
        return
    out.print(line(("cancelled", "green"), f" run {done.run_id} at seq {done.seq}",
                   f"; invalidated approvals {', '.join(map(str, done.approvals_invalidated))}"
                   if done.approvals_invalidated else "",
                   "; effects left with an unknown outcome: "
                   f"{', '.join(done.effects_left_unknown)}"
                   if done.effects_left_unknown else ""), soft_wrap=True)


@runs_app.command("wait")
def runs_wait(run_id: RunArg, timeout: Annotated[float, typer.Option(
        min=0, help="Seconds to wait at most.")] = 60.0, as_json: JsonFlag = False) -> None:
    """Wait until RUN is no longer running (finished, waiting for a person, parked); exit 1
    if it still runs after --timeout."""
    import time

    ledger = open_ledger()
    found = resolve_run(ledger, run_id)
    deadline = time.monotonic() + timeout
    while True:
        with reported():
            run = ledger.get_run(found)
        if run is None:  # removed since (retention, erasure)
            fail(f"no run {found}", EXIT_REFUSED)
        if run.status is not RunStatus.RUNNING or time.monotonic() >= deadline:
            break
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    if as_json:
        print_json(run_row(run))
    else:
        out.print(line(str(found), " ", (run.status.value, "bold"), f" at seq {run.seq}"))
    if run.status is RunStatus.RUNNING:
        raise typer.Exit(1)


@runs_app.command("signal")
def runs_signal(run_id: RunArg, name: Annotated[str, typer.Argument(help="The signal's name.")],
                payload: Annotated[str, typer.Option(help="Its payload, as JSON.")] = "{}"
                ) -> None:
    """Send a named signal to RUN (operator; audited): it wakes the run if it waits for it,
    and is kept for later otherwise."""
    ledger = open_ledger()
    run = _get(ledger, run_id, AuditAction.SIGNAL)
    try:
        value = parse_json(payload)
    except ValueError as exc:
        _refuse(ledger, AuditAction.SIGNAL, InvalidInput(f"--payload must be JSON ({exc})"),
                run.id)
    with reported():
        woke = ledger.signal(run.id, name, value)
    out.print(line(f"signal {name!r} sent to {run.id}: ",
                   "it woke the run" if woke else "kept until the run waits for it"))
