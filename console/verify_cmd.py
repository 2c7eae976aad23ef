"""``onward verify``: check stored history offline and report each problem precisely."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated
from uuid import UUID

import typer

from console.common import open_ledger, resolve_run
from console.safe import console, line
from ledger.audit import AuditAction
from ledger.verify import Problem

out = console()


def verify(
    run_id: Annotated[str | None, typer.Argument(help="The run to check (id or prefix).")]
    = None,
    all_runs: Annotated[bool, typer.Option("--all", help="Check every run.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per problem.")] = False,
) -> None:
    """Verify checkpoint MACs, the hash chain, the head and artifact hashes. Exit 3 when a
    problem is found."""
    if (run_id is None) == (not all_runs):
        out.print(line(("error:", "red"), " give a RUN or --all"))
        raise typer.Exit(2)
    ledger = open_ledger(AuditAction.VERIFY)
    target = resolve_run(ledger, run_id) if run_id is not None else None
    checked = 0
    found = 0
    results: Iterable[tuple[UUID, list[Problem]]] = (
        [(target, ledger.verify_run(target))] if target is not None else ledger.verify_all())
    for current, problems in results:
        checked += 1
        for problem in problems:
            found += 1
            if as_json:
                print(json.dumps({"run_id": str(problem.run_id), "seq": problem.seq,
                                  "kind": problem.kind, "detail": problem.detail}))
            else:
                out.print(line(("✗", "red"), " ", str(problem)), soft_wrap=True)
        if not as_json and not problems and run_id is not None:
            out.print(line(("✓", "green"), f" {current}: history verifies"))
    ledger.verified(target, checked, found)
    if not as_json:
        out.print(line(f"checked {checked} run(s), {found} problem(s)"))
    if found:
        raise typer.Exit(3)
