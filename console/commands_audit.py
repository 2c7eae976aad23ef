"""``onward audit``: who did what to which run, why, and what was refused."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from console.common import (
    JsonFlag,
    LimitOpt,
    OffsetOpt,
    open_ledger,
    out,
    parse_since,
    print_json,
    reported,
    short,
    when,
)
from console.safe import add_row, cell
from ledger.vocabulary import AuditOutcome

__all__ = ["audit_app", "audit_ls"]


audit_app = typer.Typer(help="The audit log of operator commands.", no_args_is_help=True)


@audit_app.command("ls")
def audit_ls(
    run: Annotated[str | None, typer.Option(help="Rows about this run (or runs it made).")]
    = None,
    action: Annotated[str | None, typer.Option(help="continue, replay, branch, cancel, "
                                               "approve, reject, repeat_effect, park")] = None,
    actor: Annotated[str | None, typer.Option(help="Only this person.")] = None,
    outcome: Annotated[str | None, typer.Option(help="done or refused")] = None,
    since: Annotated[str | None, typer.Option(help="30m, 2h, 7d or an ISO time.")] = None,
    limit: LimitOpt = 50,
    offset: OffsetOpt = 0,
    as_json: JsonFlag = False,
) -> None:
    """List audit rows, newest first."""
    ledger = open_ledger()
    with reported():
        rows = ledger.audit(run_id=ledger.resolve_run(run) if run else None, action=action,
                            actor=actor, outcome=outcome, since=parse_since(since),
                            limit=limit, offset=offset)
    if as_json:
        print_json(rows)
        return
    table = Table("at", "actor", "role", "action", "outcome", "run", "new run", "seq", "reason",
                  "detail")
    for a in rows:
        seq = f"{a.before_seq}→{a.after_seq}" if a.before_seq is not None else "-"
        detail = (a.details or {}).get("error") or (a.details or {}).get("mode") or ""
        result = cell(a.outcome)
        if a.outcome != AuditOutcome.DONE:
            result.stylize("red")
        add_row(table, when(a.at), a.actor, a.role, a.action, result, a.run_id or "-",
                a.new_run_id or "", seq, short(a.reason, 40), short(detail, 60))
    out.print(table)
