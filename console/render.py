"""How ``onward runs show`` gathers and prints one run: header, lineage, timeline,
checkpoints, effects, approvals, audit."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from rich.table import Table

from console.common import out, plain, short
from console.safe import add_row, json_text, line
from ledger import Ledger

__all__ = ["run_detail", "say", "show_run"]


def run_detail(ledger: Ledger, run_id: UUID) -> dict[str, Any]:
    """Everything ``runs show`` prints, as plain data (also its --json output)."""
    from console.commands_runs import run_row

    run = ledger.get_run(run_id)
    if run is None:
        raise ValueError(f"no run {run_id}")
    parent = ledger.get_run(run.parent_run_id) if run.parent_run_id else None
    result_problem = ledger.result_problem(run_id)
    return {
        "run": {**run_row(run), "max_attempts": run.max_attempts,
                "result_verified": (None if run.result is None and result_problem is None
                                    else result_problem is None),
                "result_problem": result_problem,
                "attempts_total": run.attempts_total, "used_tokens": run.used_tokens,
                "used_cost_usd": float(run.used_cost_usd), "budget_tokens": run.budget_tokens,
                "budget_cost_usd": plain(run.budget_cost_usd),
                "deadline_at": plain(run.deadline_at), "waiting_on": run.waiting_on,
                "allow_irreversible": run.allow_irreversible, "branch_patch": run.branch_patch},
        "parent": ({"id": str(parent.id), "status": parent.status.value, "seq": parent.seq,
                    "mode": parent.mode} if parent else None),
        "children": [{"id": str(c.id), "mode": c.mode, "from_seq": c.parent_seq,
                      "status": c.status.value, "reason": c.launch_reason}
                     for c in ledger.children(run_id)],
        "timeline": [{"seq": e.seq, "step": e.step, "attempt": e.attempt, "worker": e.worker,
                      "outcome": e.outcome, "started_at": plain(e.started_at),
                      "duration_ms": e.duration_ms, "error_type": e.error_type,
                      "error": e.error_message} for e in ledger.timeline(run_id)],
        "checkpoints": [{"seq": c.identity.seq, "step": c.position.step,
                         "next_step": c.position.next_step,
                         "outcome": c.position.outcome.value, "hash": c.identity.hash,
                         "parent_hash": c.identity.parent_hash,
                         "workflow_version": c.compatibility.workflow_version,
                         "migrated_from": (c.compatibility.migrated_from.model_dump()
                                           if c.compatibility.migrated_from else None),
                         "created_at": plain(c.created_at)}
                        for c in ledger.checkpoints(run_id)],
        "effects": [{"effect_type": e.effect_type, "effect_id": e.effect_id, "seq": e.seq,
                     "command_id": e.command_id, "status": e.status.value,
                     "attempts": e.attempts, "recipient": e.recipient,
                     "provider_ref": e.provider_ref, "reconciled": e.reconciled}
                    for e in ledger.effects(run_id)],
        "approvals": [{"id": str(a.id), "seq": a.seq, "action": a.action,
                       "status": a.status.value, "artifact_hash": a.artifact_hash,
                       "decided_by": a.decided_by, "expires_at": plain(a.expires_at)}
                      for a in ledger.approvals(run_id=run_id)],
        "audit": [plain(a) for a in ledger.audit(run_id=run_id, limit=20)],
    }


def show_run(detail: dict[str, Any]) -> None:
    run = detail["run"]
    say((run["id"], "bold"), "  ", run["workflow"], f" v{run['version'] or '-'}  ",
        (run["status"], "bold"), f"  seq={run['seq']}  next=", _next(run),
        f"  {_attempt(run)}  restores={run['restores']}")
    say(f"created {run['created_at']}  finished {run['finished_at'] or '-'}  conversation=",
        run["conversation_id"] or "-", "  key=", run["idempotency_key"] or "-")
    say(f"spent: {run['attempts_total']} step executions, {run['used_tokens']} tokens, "
        f"${run['used_cost_usd']:.4f}")
    _lineage(detail)
    if run["waiting_on"]:
        say("waiting on: ", run["waiting_on"])
    if run["parked_reason"]:
        say(("parked:", "yellow"), " ", run["parked_reason"])
    if run["last_error"]:
        say(("last error:", "red"), " ", json_text(run["last_error"]))
    if run["result_verified"] is False:
        say(("result does not verify:", "red"), " ", run["result_problem"] or "",
            " (what follows is not what the run finished with; run `onward verify`)")
    if run["result"] is not None:
        say("result: ", json_text(run["result"]))
    _timeline(detail["timeline"])
    _checkpoints(detail["checkpoints"])
    _effects(detail["effects"])
    _approvals(detail["approvals"])
    _audit(detail["audit"])


def say(*parts: str | tuple[str, str]) -> None:
    """One line of the run's header; data is printed literally and whole."""
    out.print(line(*parts), soft_wrap=True)
def _attempt(run: dict[str, Any]) -> str:
    """A finished run has no current attempt (the counter restarts at each step): say how
    many step executions it took; the timeline lists each one."""
    if run["finished_at"]:
        return f"executions={run['attempts_total']}"
    return f"attempt={run['attempt']}/{run['max_attempts']}"


def _next(run: dict[str, Any]) -> str:
    if run["finished_at"]:
        return "-"
    return run["step"] or "(start)"


def _lineage(detail: dict[str, Any]) -> None:
    run = detail["run"]
    if run["parent_run_id"]:
        parent = detail["parent"] or {}
        say((str(run["mode"]), "bold"), f" of {run['parent_run_id']} from checkpoint "
            f"{run['parent_seq']} (parent now {parent.get('status')} at seq "
            f"{parent.get('seq')}); reason: ", run["launch_reason"] or "",
            "; irreversible effects allowed" if run["allow_irreversible"] else "")
        if run["branch_patch"]:
            say("patch: ", json_text(run["branch_patch"]))
    for child in detail["children"]:
        say(f"  └─ {child['mode']} {child['id']} from seq {child['from_seq']}: "
            f"{child['status']} (", child["reason"] or "", ")")


def _timeline(entries: list[dict[str, Any]]) -> None:
    table = Table("seq", "step", "attempt", "worker", "outcome", "ms", "error",
                  title="steps")
    for e in entries:
        ms = f"{e['duration_ms']:.1f}" if e["duration_ms"] is not None else "-"
        add_row(table, e["seq"], e["step"] or "(start)", e["attempt"], e["worker"],
                e["outcome"] or "(running)", ms, short(e["error"], 60))
    out.print(table)


def _checkpoints(rows: list[dict[str, Any]]) -> None:
    table = Table("seq", "produced by", "next", "outcome", "hash", "at", title="checkpoints")
    for c in rows:
        migrated = c.get("migrated_from")
        outcome = c["outcome"] + (f" (migrated from v{migrated['workflow_version']})"
                                  if migrated else "")
        add_row(table, c["seq"], c["step"] or "-", c["next_step"] or "-", outcome,
                short(c["hash"]), c["created_at"][:19])
    out.print(table)


def _effects(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    table = Table("effect", "id", "command", "status", "attempts", "recipient", "provider ref",
                  title="effects")
    for e in rows:
        add_row(table, e["effect_type"], short(e["effect_id"], 16), e["command_id"],
                e["status"] + (" (reconciled)" if e["reconciled"] else ""),
                e["attempts"], e["recipient"] or "-", e["provider_ref"] or "-")
    out.print(table)


def _approvals(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    table = Table("approval", "seq", "action", "status", "by", "expires", title="approvals")
    for a in rows:
        add_row(table, a["id"], a["seq"], a["action"], a["status"], a["decided_by"] or "-",
                str(a["expires_at"])[:19])
    out.print(table)


def _audit(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    table = Table("at", "actor", "role", "action", "outcome", "reason", "seq", title="audit")
    for a in reversed(rows):
        seq = f"{a['before_seq']}→{a['after_seq']}" if a["before_seq"] is not None else "-"
        add_row(table, str(a["at"])[:19], a["actor"], a["role"], a["action"], a["outcome"],
                short(a["reason"], 40), seq)
    out.print(table)
