"""``onward approvals``: pending decisions, and approve/reject (audited). A decision names
the artifact hash it was taken on; an edited artifact needs a new approval."""

from __future__ import annotations

import json
from typing import Annotated
from uuid import UUID

import typer
from rich.table import Table

from console.common import (
    JsonFlag,
    LimitOpt,
    YesFlag,
    confirm,
    open_ledger,
    out,
    print_json,
    reported,
    short,
    when,
)
from ledger.audit import AuditAction
from ledger.exceptions import InvalidInput
from ledger.schema import ApprovalStatus

approvals_app = typer.Typer(help="Approvals: list, approve, reject.", no_args_is_help=True)

ApprovalArg = Annotated[UUID, typer.Argument(help="The approval's id.")]
HashOpt = Annotated[str | None, typer.Option(
    help="The artifact hash you reviewed (needed with --yes; otherwise the one shown).")]
CommentOpt = Annotated[str | None, typer.Option("--comment", "-m", help="Why (audited).")]
RolesOpt = Annotated[list[str] | None, typer.Option(
    "--as-role", help="An approver role you hold, for approvals that name roles (repeatable).")]


@approvals_app.command("ls")
def approvals_ls(
    status: Annotated[ApprovalStatus | None, typer.Option(help="Default: pending.")]
    = ApprovalStatus.PENDING,
    run: Annotated[UUID | None, typer.Option(help="Only this run's approvals.")] = None,
    limit: LimitOpt = 50,
    as_json: JsonFlag = False,
) -> None:
    """List approvals, newest first."""
    with reported():
        found = open_ledger().approvals(status=status, run_id=run, limit=limit)
    if as_json:
        print_json(found)
        return
    table = Table("approval", "run", "seq", "action", "status", "approvers", "artifact",
                  "expires")
    for a in found:
        table.add_row(str(a.id), str(a.run_id), str(a.seq), a.action, a.status.value,
                      ", ".join(a.approvers) or "any operator", short(a.artifact_hash),
                      when(a.expires_at))
    out.print(table)


def _decide(approval_id: UUID, approve: bool, artifact_hash: str | None, comment: str | None,
            roles: list[str] | None, yes: bool) -> None:
    verb = "approve" if approve else "reject"
    ledger = open_ledger()
    with reported():
        approval = ledger.get_approval(approval_id)
    out.print(f"{verb} [bold]{approval.action}[/bold] for run {approval.run_id} (seq "
              f"{approval.seq}), as {ledger.actor.name}")
    out.print(f"artifact {approval.artifact_hash}:")
    out.print(json.dumps(approval.artifact, indent=2)[:4000])
    if artifact_hash is None:
        if yes:
            with reported():
                raise ledger.refuse(
                    AuditAction.APPROVE if approve else AuditAction.REJECT,
                    InvalidInput("with --yes, name what you reviewed: --artifact-hash HASH"),
                    run_id=approval.run_id, approval_id=approval.id)
        artifact_hash = approval.artifact_hash  # what was just shown is what is decided
    with reported():
        confirm(f"{verb} it?", yes)
        decide = ledger.approve if approve else ledger.reject
        decided = decide(approval_id, artifact_hash=artifact_hash, comment=comment,
                         roles=tuple(roles or ()))
    out.print(f"[green]{decided.status.value}[/green] by {decided.decided_by}")


@approvals_app.command("approve")
def approvals_approve(approval_id: ApprovalArg, artifact_hash: HashOpt = None,
                      comment: CommentOpt = None, as_role: RolesOpt = None,
                      yes: YesFlag = False) -> None:
    """Approve: the run resumes at the approved step (in the same transaction)."""
    _decide(approval_id, True, artifact_hash, comment, as_role, yes)


@approvals_app.command("reject")
def approvals_reject(approval_id: ApprovalArg, artifact_hash: HashOpt = None,
                     comment: CommentOpt = None, as_role: RolesOpt = None,
                     yes: YesFlag = False) -> None:
    """Reject: the run goes to its rejection step, or fails with approval_rejected."""
    _decide(approval_id, False, artifact_hash, comment, as_role, yes)
