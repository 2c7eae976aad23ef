"""``onward verify``: check stored history offline and report each problem precisely."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated
from uuid import UUID

import typer

from console.commands_anchor import compare_with_anchor
from console.common import open_ledger, resolve_run
from console.safe import console, line
from ledger.verify import Problem
from ledger.vocabulary import AuditAction

__all__ = ["out", "verify"]


out = console()


def verify(
    run_id: Annotated[str | None, typer.Argument(
        metavar="[RUN | ANCHOR]", help="The run to check (id or prefix); with --anchor, an "
        "anchor file or directory (default: the latest in ONWARD_ANCHOR_LOCATION).")] = None,
    all_runs: Annotated[bool, typer.Option(
        "--all", help="Check every run of your tenant, and its audit log.")] = False,
    audit_only: Annotated[bool, typer.Option(
        "--audit", help="Check only your tenant's audit log (row MACs and the chain).")]
    = False,
    anchor: Annotated[bool, typer.Option(
        "--anchor", help="Compare your tenant's runs with an anchor (onward anchor): report "
        "runs that moved backwards, were rewritten or vanished since it was taken.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per problem.")] = False,
) -> None:
    """Verify what the ledger signed: checkpoint MACs, the hash chain, the head, artifact
    hashes, recorded evidence, effects, results, and (--all, --audit) the audit chain; or
    (--anchor) that no run moved backwards since an anchor. Exit 3 when a problem is found."""
    if sum((run_id is not None and not anchor, all_runs, audit_only, anchor)) != 1:
        out.print(line(("error:", "red"), " give a RUN, --all, --audit or --anchor"))
        raise typer.Exit(2)
    if anchor:
        _verify_anchor(run_id, as_json)
        return
    ledger = open_ledger(AuditAction.VERIFY)
    target = resolve_run(ledger, run_id) if run_id is not None else None
    results: Iterable[tuple[UUID | None, list[Problem]]] = (
        [(target, ledger.verify_run(target))] if target is not None
        else [] if audit_only else ledger.verify_all())
    checked, found = 0, 0
    for current, problems in results:
        checked += 1
        found += _report(problems, as_json)
        if not as_json and not problems and run_id is not None:
            out.print(line(("✓", "green"), f" {current}: history verifies"))
    audit_problems = ledger.verify_audit() if target is None else []
    found += _report(audit_problems, as_json)
    ledger.verified(target, checked, found)
    if not as_json:
        audit_note = f", the audit log: {len(audit_problems)}" if target is None else ""
        out.print(line(f"checked {checked} run(s), {found} problem(s){audit_note}"))
    if found:
        raise typer.Exit(3)


def _verify_anchor(path: str | None, as_json: bool) -> None:
    problems, summary = compare_with_anchor(open_ledger(AuditAction.VERIFY), path)
    found = _report(problems, as_json)
    if not as_json:
        out.print(line(summary), soft_wrap=True)
    if found:
        raise typer.Exit(3)


def _report(problems: list[Problem], as_json: bool) -> int:
    for problem in problems:
        if as_json:
            print(json.dumps({"run_id": str(problem.run_id) if problem.run_id else None,
                              "seq": problem.seq, "kind": problem.kind,
                              "detail": problem.detail}))
        else:
            out.print(line(("✗", "red"), " ", str(problem)), soft_wrap=True)
    return len(problems)
