"""``onward approvals``: pending decisions, and approve/reject (audited). A decision names
the artifact hash it was taken on; an edited artifact needs a new approval."""

from __future__ import annotations

import json
import shutil
import sys
from typing import Annotated, Any, NoReturn

import click
import typer
from rich.table import Table

from console.common import (
    JsonFlag,
    LimitOpt,
    YesFlag,
    approval_of,
    confirm,
    open_ledger,
    out,
    print_json,
    reported,
    short,
    when,
)
from console.exceptions import ArtifactNotShown
from console.safe import add_row, id_column, json_text, line
from ledger.checkpoints import canonical_json, sha256_hex
from ledger.exceptions import ApprovalRefused, InvalidInput, OnwardError
from ledger.vocabulary import ApprovalStatus, AuditAction
from ledger.waits import may_decide

__all__ = [
    "ApprovalArg",
    "CommentOpt",
    "HashOpt",
    "approvals_app",
    "approvals_approve",
    "approvals_ls",
    "approvals_reject",
    "show_artifact",
]


approvals_app = typer.Typer(help="Approvals: list, approve, reject.", no_args_is_help=True)

ApprovalArg = Annotated[str, typer.Argument(
    help="The approval's id, or a unique prefix of it (6+ digits, as for runs).")]
HashOpt = Annotated[str | None, typer.Option(
    help="The artifact hash you reviewed (needed with --yes; otherwise the one shown). It "
         "must be the hash of the artifact printed now.")]
CommentOpt = Annotated[str | None, typer.Option("--comment", "-m", help="Why (audited).")]


@approvals_app.command("ls")
def approvals_ls(
    status: Annotated[ApprovalStatus | None, typer.Option(help="Default: pending.")]
    = ApprovalStatus.PENDING,
    run: Annotated[str | None, typer.Option(help="Only this run's approvals (id or prefix).")]
    = None,
    mine: Annotated[bool, typer.Option("--mine", help="Only those you may decide.")] = False,
    limit: LimitOpt = 50,
    as_json: JsonFlag = False,
) -> None:
    """List approvals, newest first."""
    ledger = open_ledger()
    with reported():
        run_id = ledger.resolve_run(run) if run else None
        found = ledger.approvals(status=status, run_id=run_id, limit=limit, approver=mine)
    if as_json:
        print_json(found)
        return
    table = Table(id_column("approval"), "run", "seq", "action", "status", "approvers", "artifact",
                  "expires")
    for a in found:
        add_row(table, a.id, a.run_id, a.seq, a.action, a.status.value,
                ", ".join(a.approvers) or "any operator", short(a.artifact_hash),
                when(a.expires_at))
    out.print(table)
    if not found and status is ApprovalStatus.PENDING:
        out.print(line("no approval is pending; decided ones: --status approved (or rejected, "
                       "expired, invalidated)"))


def _decide(approval_text: str, approve: bool, artifact_hash: str | None,
            comment: str | None, yes: bool) -> None:
    verb = "approve" if approve else "reject"
    action = AuditAction.APPROVE if approve else AuditAction.REJECT
    ledger = open_ledger()
    with reported():
        # the role first (nothing is looked up for a caller refused), then the id or prefix
        approval_id = approval_of(ledger, approval_text, action)
        approval = ledger.get_approval(approval_id)
        if not may_decide(approval, ledger.actor.name, ledger.actor.approver_roles):
            raise ledger.refuse(action, ApprovalRefused(
                f"{ledger.actor.name} may not {verb} approval {approval_id}: it names "
                f"{', '.join(approval.approvers)}; your token's approver roles: "
                f"{', '.join(ledger.actor.approver_roles) or 'none'}"),
                run_id=approval.run_id, approval_id=approval_id)

    def refuse(error: OnwardError) -> NoReturn:
        with reported():
            raise ledger.refuse(action, error, run_id=approval.run_id, approval_id=approval.id)
        raise AssertionError("unreachable")  # pragma: no cover - reported() exits

    decide = ledger.approve if approve else ledger.reject
    try:
        _, to_show = _artifact_text(approval.artifact)
    except ArtifactNotShown as exc:
        refuse(exc)
    with reported():  # refused before the artifact and the question, as it would be after
        decide(approval_id, artifact_hash=to_show, comment=comment, dry_run=True)
    out.print(line(f"{verb} ", (approval.action, "bold"), f" for run {approval.run_id} (seq "
                   f"{approval.seq}), as ", ledger.actor.name), soft_wrap=True)
    try:
        shown = show_artifact(approval.artifact, approval.artifact_hash, page=not yes)
    except ArtifactNotShown as exc:
        refuse(exc)
    if artifact_hash is None and yes:
        refuse(InvalidInput("with --yes, name what you reviewed: --artifact-hash HASH"))
    if artifact_hash is not None and artifact_hash != shown:
        refuse(InvalidInput(f"you named artifact {artifact_hash[:12]}…, but the artifact shown "
                            f"hashes to {shown[:12]}…; review it again"))
    with reported():
        confirm(f"{verb} it?", yes)
        # the decision names the hash of what was shown; the ledger refuses it unless it is
        # the hash the run bound when it asked
        decided = decide(approval_id, artifact_hash=shown, comment=comment)
    out.print(line((decided.status.value, "green"), " by ", decided.decided_by or "-"))


def _interactive() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def _artifact_text(artifact: Any) -> tuple[str, str]:
    """The artifact as it is printed (JSON), and the sha256 of the canonical JSON of that."""
    text = json_text(artifact, indent=2)
    try:
        return text, sha256_hex(canonical_json(json.loads(text)))
    except (ValueError, OnwardError) as exc:
        raise ArtifactNotShown(f"the artifact could not be shown: {exc}") from exc


def show_artifact(artifact: Any, bound_hash: str, *, page: bool) -> str:
    """Print the whole artifact as JSON (through a pager when long and interactive) and
    return the sha256 of the canonical JSON of what was printed."""
    text, shown = _artifact_text(artifact)
    head = (f"--- artifact {bound_hash} ({len(text)} characters) ---\n"
            if shown == bound_hash else
            f"--- artifact: bound to {bound_hash}, but what is stored hashes to {shown} ---\n")
    body = f"{head}{text}\n--- end of artifact ---"
    try:
        if page and _interactive() and body.count("\n") + 4 > shutil.get_terminal_size().lines:
            click.echo_via_pager(body + "\n")
        else:
            click.echo(body)
    except Exception as exc:  # a pager or terminal that failed: nothing was reviewed
        raise ArtifactNotShown(f"the artifact could not be shown ({type(exc).__name__}: "
                               f"{exc}); nothing was decided") from exc
    return shown


@approvals_app.command("approve")
def approvals_approve(approval_id: ApprovalArg, artifact_hash: HashOpt = None,
                      comment: CommentOpt = None, yes: YesFlag = False) -> None:
    """Approve: the run resumes at the approved step (in the same transaction). The whole
    artifact is shown first (paged when long); the decision is bound to its hash. Needs the
    approver role; an approval that names approvers needs you among them, by name or by an
    approver role of your token."""
    _decide(approval_id, True, artifact_hash, comment, yes)


@approvals_app.command("reject")
def approvals_reject(approval_id: ApprovalArg, artifact_hash: HashOpt = None,
                     comment: CommentOpt = None, yes: YesFlag = False) -> None:
    """Reject: the run goes to its rejection step, or fails with approval_rejected. The
    whole artifact is shown first (paged when long); the decision is bound to its hash."""
    _decide(approval_id, False, artifact_hash, comment, yes)
