"""``onward verify``: check stored history offline and report each problem precisely."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated
from uuid import UUID

import typer

from console.commands_anchor import compare_with_anchor
from console.common import EXIT_REFUSED, fail, open_ledger, reported, run_of
from console.safe import console, line
from ledger import Ledger
from ledger.audit_chain import UNSEALED, Sealed
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
    seal: Annotated[bool, typer.Option(
        "--seal", help="With --all or --audit (admin): first seal your tenant's pending audit "
        "rows into its chain, as a reaper would (when none runs, e.g. after make demo).")]
    = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line: one per "
                                          "problem, then always a summary (kind summary).")]
    = False,
) -> None:
    """Verify what the ledger signed: checkpoint MACs, the hash chain, the head, artifact
    hashes, recorded evidence, effects, results, and (--all, --audit) the audit chain; or
    (--anchor) that no run moved backwards since an anchor. Exit 3 when a problem is found;
    exit 4 when the only finding is audit rows left unsealed (no reaper running: a warning,
    not tampering; --seal seals them)."""
    if sum((run_id is not None and not anchor, all_runs, audit_only, anchor)) != 1 or \
            (seal and not (all_runs or audit_only)):
        fail("give a RUN, --all, --audit or --anchor (--seal goes with --all or --audit)",
             EXIT_REFUSED)
    if anchor:
        _verify_anchor(run_id, as_json)
        return
    ledger = open_ledger(AuditAction.VERIFY)
    with reported():  # an unknown or ambiguous prefix: an audited refusal, exit 2
        target = run_of(ledger, run_id, AuditAction.VERIFY) if run_id is not None else None
    results: Iterable[tuple[UUID | None, list[Problem]]] = (
        [(target, ledger.verify_run(target))] if target is not None
        else [] if audit_only else ledger.verify_all())
    checked, found = 0, 0
    for current, problems in results:
        checked += 1
        found += _report(problems, as_json)
        if not as_json and not problems and run_id is not None:
            out.print(line(("✓", "green"), f" {current}: history verifies"))
    sealed = _seal(ledger, as_json) if seal else None
    audit_problems = ledger.verify_audit() if target is None else []
    unsealed = [p for p in audit_problems if p.kind == UNSEALED]
    found += _report([p for p in audit_problems if p.kind != UNSEALED], as_json)
    _report(unsealed, as_json, warning=True)
    ledger.verified(target, checked, found + len(unsealed),
                    mode="run" if target else "audit" if audit_only else "all")
    if as_json:
        _summary(run_id=str(target) if target else None, runs_checked=checked, problems=found,
                 warnings=len(unsealed),
                 **({} if sealed is None else {"sealed": sealed.rows,
                                               "not_sealed": sealed.refused}))
    else:
        audit_note = f", the audit log: {len(audit_problems) - len(unsealed)}" \
            if target is None else ""
        out.print(line(f"checked {checked} run(s), {found} problem(s){audit_note}"))
        if unsealed:
            out.print(line(("!", "yellow"), f" {len(unsealed)} audit row(s) not sealed into "
                           "the chain yet (no reaper running?): nothing fails a check, but a "
                           "row can be deleted unseen until sealed; run `onward reaper`, or "
                           "`onward verify --all --seal` (admin) to seal them now"),
                      soft_wrap=True)
    if found:
        raise typer.Exit(3)
    if unsealed:
        raise typer.Exit(4)


def _seal(ledger: Ledger, as_json: bool) -> Sealed:
    """Seal the tenant's pending audit rows; what was sealed, and why a chain was not
    extended (its end does not verify: the audit check below reports what)."""
    with reported():
        sealed = ledger.seal_audit()
    if not as_json:  # with --json, the summary says both (sealed, not_sealed)
        out.print(line(f"sealed {sealed.rows} pending audit row(s) into the chain"))
        for refused in sealed.refused:
            out.print(line(("✗", "red"), f" not sealed: {refused}"), soft_wrap=True)
    return sealed


def _verify_anchor(path: str | None, as_json: bool) -> None:
    compared = compare_with_anchor(open_ledger(AuditAction.VERIFY), path)
    found = _report(compared.problems, as_json)
    if as_json:
        _summary(anchor=compared.anchor, runs_checked=compared.runs_compared, problems=found,
                 warnings=0)
    else:
        out.print(line(compared.text), soft_wrap=True)
    if found:
        raise typer.Exit(3)


def _summary(*, problems: int, warnings: int, **fields: object) -> None:
    """The last line of ``--json``, printed whatever was found, so the output is never empty:
    ``ok`` is true when no problem was found (warnings, e.g. unsealed audit rows, exit 4
    without failing a check), with the counts the text summary gives."""
    print(json.dumps({"kind": "summary", "ok": problems == 0, **fields, "problems": problems,
                      "warnings": warnings}))


def _report(problems: list[Problem], as_json: bool, *, warning: bool = False) -> int:
    for problem in problems:
        if as_json:
            print(json.dumps({"run_id": str(problem.run_id) if problem.run_id else None,
                              "seq": problem.seq, "kind": problem.kind,
                              "detail": problem.detail, "warning": warning}))
        else:
            mark = ("!", "yellow") if warning else ("✗", "red")
            out.print(line(mark, " ", str(problem)), soft_wrap=True)
    return len(problems)
