"""``onward retention``: plan and apply the retention policies, legal holds
(docs/operating.md#retention)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from console.commands_runs import RunArg
from console.common import JsonFlag, ReasonOpt, open_ledger, out, reported, run_of
from console.safe import line
from ledger.vocabulary import AuditAction

__all__ = ["apply", "hold", "plan", "retention_app"]


retention_app = typer.Typer(
    help="Retention: compact old runs' payloads so their history still verifies.",
    no_args_is_help=True)


@retention_app.command("plan")
def plan(as_json: JsonFlag = False) -> None:
    """What ONWARD_RETENTION_POLICIES would compact now, in counts and bytes (a dry run)."""
    ledger = open_ledger(AuditAction.RETENTION)
    with reported():
        found = ledger.retention_plan()
        months = ledger.partitions_plan()
    policies = ledger.settings.retention_policies
    if as_json:
        print(json.dumps({**found.as_dict(), "partitions": months, "policies": policies}))
        return
    out.print(line(f"policies: {policies}" if policies else
                   "no policies (ONWARD_RETENTION_POLICIES is unset): every run keeps its "
                   "payloads forever; e.g. ONWARD_RETENTION_POLICIES='*/*=90' compacts them "
                   "90 days after a run ends (docs/operating.md#retention)"), soft_wrap=True)
    kinds = ", ".join(f"{kind} of {count}" for kind, count in found.kinds.items() if count)
    out.print(line(f"{found.runs} run(s), {found.checkpoints} checkpoint(s), "
                   f"{found.bytes:,} bytes of payloads would be compacted"
                   + (f" ({kinds} run(s))" if kinds else "") + f"; {found.artifacts} "
                   f"artifact(s), {found.artifact_bytes:,} bytes, would no longer be "
                   "referenced and be deleted; kept although due: "
                   f"{found.held} on legal hold, {found.pinned} in a corpus"), soft_wrap=True)
    for name, why in months.items():
        out.print(line(f"partition {name}: " + (f"kept ({why})" if why else "would be dropped")),
                  soft_wrap=True)


@retention_app.command("apply")
def apply(
    batch: Annotated[int, typer.Option(help="Runs read per query.")] = 100,
    max_runs: Annotated[int | None, typer.Option(help="Stop after this many runs.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Compact what the policies make due: one run per transaction, each audited; run it
    again to go on where it stopped. Then drop each ended month's partition of the tables
    partitioned by time whose rows the policies all let go (audited)."""
    ledger = open_ledger(AuditAction.RETENTION)
    with reported():
        done = ledger.retention_apply(batch=batch, max_runs=max_runs)
        months = ledger.partitions_expire()
    if as_json:
        print(json.dumps({"runs": done.runs, "checkpoints": done.checkpoints,
                          "artifacts": done.artifacts, "artifact_bytes": done.artifact_bytes,
                          "refused": done.refused, "partitions": months.as_dict()}))
        return
    out.print(line(("✓", "green"), f" compacted {done.runs} run(s), {done.checkpoints} "
                   f"checkpoint(s); deleted {done.artifacts} unreferenced artifact(s), "
                   f"{done.artifact_bytes:,} bytes"), soft_wrap=True)
    for name in months.dropped:
        out.print(line(("✓", "green"), f" dropped partition {name}"), soft_wrap=True)
    for refused in done.refused[:10]:
        out.print(line(("✗", "red"), f" kept: {refused}"), soft_wrap=True)


@retention_app.command("hold")
def hold(run: RunArg, reason: ReasonOpt = None,
         release: Annotated[bool, typer.Option("--release", help="End the hold.")] = False
         ) -> None:
    """Put a run on legal hold (retention keeps it whatever the policy), or --release it."""
    ledger = open_ledger(AuditAction.HOLD)
    run_id = run_of(ledger, run, AuditAction.HOLD)
    with reported():
        ledger.hold(run_id, reason, release=release)
    out.print(line(("✓", "green"), f" {run_id} {'released' if release else 'held'}"))
