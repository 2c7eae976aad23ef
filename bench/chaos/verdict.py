"""The report (one JSON object) and the pass bar: 0 lost runs, 0 duplicate provider
objects, 0 duplicate commits, 0 orphan pending effects, parked = expected, and every
cross-check between the ledger and the provider clean."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bench.chaos.state import Chaos

if TYPE_CHECKING:
    from bench.chaos.count import CrossCheck, EffectCounts, LedgerView, ProviderView, RunCounts


def report_of(c: Chaos, settled: bool, *, ledger: LedgerView, runs: RunCounts,
              effects: EffectCounts, provider: ProviderView, cross: CrossCheck,
              log_events: dict[str, int]) -> dict[str, Any]:
    report = {
        **_pass_bar(c, ledger, runs, effects, provider, cross),
        **_cross_checks(ledger, effects, provider, cross),
        **_ledger_figures(ledger, runs, effects),
        **_chaos_done(c, provider),
        **_attempts(ledger, provider, log_events),
        "unexpected_exits": c.tally.unexpected_exits,
        "exits_while_postgres_down": c.tally.exits_while_db_down,
        "private_postgres": c.servers.pg is not None,
        "settled": settled,
        "seed": c.cfg.seed,
        "database": c.servers.db_name,
    }
    report.update(_details(c, ledger, runs, effects, cross))
    failures = [name for name, bad in checks(report, settled, runs, provider, cross).items()
                if bad]
    report["pass"] = not failures
    report["failures"] = failures
    return report


def _pass_bar(c: Chaos, ledger: LedgerView, runs: RunCounts, effects: EffectCounts,
              provider: ProviderView, cross: CrossCheck) -> dict[str, Any]:
    return {
        "runs": len(c.run_ids),
        "steps_per_run": c.cfg.steps,
        "kills": sum(kills_by_kind(c).values()),
        "lost_runs": len(runs.lost),
        "duplicate_provider_objects": int(provider.stats.get("duplicate_objects", 0)),
        "duplicate_commits": ledger.stats.duplicate_commits,
        "orphan_pending_effects": len(effects.orphans),
        "parked": len(runs.parked),
        "expected_parked": len(c.blind),
        "provider_objects": len(provider.objects),
        "expected_provider_objects": cross.expected_objects,
        "provider_objects_unconfirmed": cross.unconfirmed,
    }


def _cross_checks(ledger: LedgerView, effects: EffectCounts, provider: ProviderView,
                  cross: CrossCheck) -> dict[str, Any]:
    return {
        "duplicate_objects_by_payload": provider.dup_by_payload,
        "provider_objects_not_completed_in_ledger": len(cross.not_completed_in_ledger),
        "completed_effects_missing_at_provider": len(cross.missing_at_provider),
        "provider_ref_mismatches": len(cross.ref_mismatch),
        "result_ref_mismatches": cross.result_mismatch,
        "completed_runs_missing_objects": cross.missing_by_payload,
        "foreign_provider_objects": len(provider.foreign),
        "duplicate_effect_intents": effects.duplicate_intents,
        "stale_commits": ledger.stale_commits,
        "runs_with_gaps": ledger.stats.runs_with_gaps,
    }


def _ledger_figures(ledger: LedgerView, runs: RunCounts,
                    effects: EffectCounts) -> dict[str, Any]:
    stats = ledger.stats
    return {
        "completed": len(runs.completed),
        "failed": stats.failed,
        "restores": stats.restores,
        "stale_deliveries": stats.stale_deliveries,
        "steps_committed": stats.steps_committed,
        "completed_steps_reexecuted": stats.completed_steps_reexecuted,
        "uncommitted_attempts": stats.uncommitted_attempts,
        "reconciled_effects": sum(1 for e in ledger.effects if e.reconciled),
        "failed_effects": len(effects.failed),
    }


def kills_by_kind(c: Chaos) -> dict[str, int]:
    kills = dict(c.tally.kills)
    kills["named_points"] = sum(1 for _role, point in c.fleet.fired() if ":" not in point)
    return kills


def _chaos_done(c: Chaos, provider: ProviderView) -> dict[str, Any]:
    events, tally = c.tally.events, c.tally
    armed = sorted(spec.split(":")[0]
                   + ("" if spec.split(":")[1] == "kill" else ":" + spec.split(":")[1])
                   for m in c.fleet.armed() for spec in m.faults.split(",") if spec)
    return {
        "kills_by_kind": kills_by_kind(c),
        "child_kills_detail": {**tally.kills_detail, "worker_child_idle":
                               tally.kills["worker_child"]
                               - tally.kills_detail["worker_child_lease_holder"]},
        "named_points_armed": armed,
        "named_points_fired": sorted(point for _role, point in c.fleet.fired()),
        "broker_flushes": events.get("broker_flushes", 0),
        "postgres_restarts": events.get("postgres_restarts", 0),
        "backend_kills": events.get("backend_kills", 0),
        "backend_kills_by_role": {role: events.get(f"backend_kills_{role}", 0)
                                  for role in ("worker", "dispatcher")},
        "long_calls": int(provider.stats.get("slow_requests", 0)),
        "long_call_s": c.cfg.long_call_s,
        "pauses": events.get("pauses", 0) + events.get("pauses_at_point", 0),
        "stale_holders_resumed_after_takeover":
            events.get("stale_holders_resumed_after_takeover", 0),
    }


def _attempts(ledger: LedgerView, provider: ProviderView,
              log_events: dict[str, int]) -> dict[str, Any]:
    return {
        "provider": {k: provider.stats.get(k, 0) for k in (
            "requests", "created", "dedupe_hits", "dropped_responses", "errors_500",
            "conflicts_409")},
        "effect_attempts": {f"{k}:{o}": int(n) for k, o, n in ledger.effect_attempts},
        "step_attempts": {o: int(n) for o, n in ledger.step_outcomes},
        "outbox_rows_of_finished_runs": ledger.outbox_left,
        "worker_log_events": log_events,
    }


def _details(c: Chaos, ledger: LedgerView, runs: RunCounts, effects: EffectCounts,
             cross: CrossCheck) -> dict[str, Any]:
    """The first ten of each kind of failure, to start looking from."""
    rows, details = ledger.runs, {}
    if runs.lost:
        details["lost_run_detail"] = [
            {"run": str(rid), "status": rows[rid].status if rid in rows else None,
             "seq": rows[rid].seq if rid in rows else None,
             "parked_reason": rows[rid].parked_reason if rid in rows else None,
             "blind_at": c.blind.get(rid)} for rid in runs.lost[:10]]
    if effects.orphans:
        details["orphan_detail"] = [
            {"run": str(e.run_id), "seq": e.seq, "type": e.effect_type, "status": e.status,
             "run_status": rows[e.run_id].status} for e in effects.orphans[:10]]
    if cross.not_completed_in_ledger:
        details["not_completed_detail"] = [
            {"id": o["id"], "key": o["idempotency_key"][:16], "body": o["body"],
             "ledger": effects.by_key[o["idempotency_key"]].status
             if o["idempotency_key"] in effects.by_key else None}
            for o in cross.not_completed_in_ledger[:10]]
    return details


def checks(report: dict[str, Any], settled: bool, runs: RunCounts, provider: ProviderView,
           cross: CrossCheck) -> dict[str, Any]:
    """Each failure of the pass bar, by name (truthy: failed)."""
    return {
        "settled": not settled,
        "lost_runs": report["lost_runs"] or runs.missing_runs or runs.short_runs,
        "duplicate_provider_objects": report["duplicate_provider_objects"]
        or provider.dup_by_key_own,
        "duplicate_objects_by_payload": report["duplicate_objects_by_payload"],
        "duplicate_commits": report["duplicate_commits"],
        "orphan_pending_effects": report["orphan_pending_effects"],
        "parked != expected_parked": report["parked"] != report["expected_parked"],
        "provider_objects != expected + unconfirmed":
            len(provider.objects) != cross.expected_objects + cross.unconfirmed,
        "provider_objects_not_completed_in_ledger":
            report["provider_objects_not_completed_in_ledger"],
        "completed_effects_missing_at_provider":
            report["completed_effects_missing_at_provider"],
        "provider_ref_mismatches": report["provider_ref_mismatches"],
        "result_ref_mismatches": report["result_ref_mismatches"],
        "completed_runs_missing_objects": report["completed_runs_missing_objects"],
        "foreign_provider_objects": report["foreign_provider_objects"],
        "duplicate_effect_intents": report["duplicate_effect_intents"],
        "stale_commits": report["stale_commits"],
        "runs_with_gaps": report["runs_with_gaps"],
    }


def summary_lines(report: dict[str, Any]) -> list[str]:
    keys = ["runs", "kills", "lost_runs", "duplicate_provider_objects", "duplicate_commits",
            "orphan_pending_effects", "parked", "expected_parked", "provider_objects",
            "expected_provider_objects", "provider_objects_unconfirmed", "restores",
            "stale_deliveries", "postgres_restarts", "backend_kills", "long_calls",
            "elapsed_s"]
    lines = [f"  {k:28s} {report.get(k)}" for k in keys]
    lines.append(f"  {'kills_by_kind':28s} {report.get('kills_by_kind')}")
    lines.append(f"  {'named_points_fired':28s} {report.get('named_points_fired')}")
    lines.append(f"  {'provider':28s} {report.get('provider')}")
    lines.append(f"  {'PASS' if report.get('pass') else 'FAIL ' + str(report.get('failures'))}")
    return lines
