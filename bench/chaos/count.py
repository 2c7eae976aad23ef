"""Counting after the chaos: the ledger and the provider, each read on its own, then
checked against each other (verdict.py turns the counts into the report and the pass bar)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from bench.chaos.fleet import Fleet
from bench.chaos.state import Chaos
from bench.chaos.verdict import report_of
from ledger.stats import BatchStats

Row = Any  # a SQLAlchemy row, read by column name


@dataclass
class LedgerView:
    """What the ledger holds about the bench's runs."""

    stats: BatchStats
    runs: dict[UUID, Row]
    effects: list[Row]
    stale_commits: int
    effect_attempts: list[Row]
    step_outcomes: list[Row]
    outbox_left: int


@dataclass
class RunCounts:
    completed: set[UUID]
    parked: set[UUID]
    expected_parked: set[UUID]
    lost: list[UUID]
    missing_runs: int
    short_runs: list[UUID]


@dataclass
class EffectCounts:
    by_key: dict[str, Row]
    duplicate_intents: int
    unconfirmed_ok: set[str]  # the unknown write of each expected park
    orphans: list[Row]
    completed: list[Row]
    failed: list[Row]


@dataclass
class ProviderView:
    """What the provider holds, asked from the provider itself."""

    stats: dict[str, Any]
    objects: list[dict[str, Any]]
    dup_by_key_own: int
    dup_by_payload: int
    foreign: list[dict[str, Any]]
    first_by_key: dict[str, dict[str, Any]]


@dataclass
class CrossCheck:
    """The ledger and the provider against each other."""

    unconfirmed: int
    not_completed_in_ledger: list[dict[str, Any]]
    missing_at_provider: list[Row]
    ref_mismatch: list[Row]
    missing_by_payload: int
    result_mismatch: int
    expected_objects: int


def count(c: Chaos, settled: bool) -> dict[str, Any]:
    ids = c.run_ids
    ledger = read_ledger(c, ids)
    runs = count_runs(ledger, ids, c.blind, c.cfg.steps)
    effects = count_effects(ledger.effects, runs.expected_parked, c.blind)
    provider = read_provider(c, ids)
    cross = cross_check(ledger, runs, effects, provider, c.blind, c.cfg.steps)
    return report_of(c, settled, ledger=ledger, runs=runs, effects=effects,
                     provider=provider, cross=cross, log_events=worker_log_events(c.fleet))


def read_ledger(c: Chaos, ids: list[UUID]) -> LedgerView:
    stats = c.servers.ledger.batch_stats(ids)
    with c.servers.engine.connect() as conn:
        return LedgerView(stats=stats, runs=_runs(conn, ids), effects=_effects(conn, ids),
                          stale_commits=_stale_commits(conn, ids),
                          effect_attempts=_effect_attempts(conn, ids),
                          step_outcomes=_step_outcomes(conn, ids),
                          outbox_left=_outbox_left(conn, ids))


def _runs(conn: Connection, ids: list[UUID]) -> dict[UUID, Row]:
    return {r.id: r for r in conn.execute(sa.text(
        "SELECT id, status, seq, parked_reason, result, restore_count "
        "FROM onward.runs WHERE id = ANY(:ids)"), {"ids": ids}).all()}


def _effects(conn: Connection, ids: list[UUID]) -> list[Row]:
    return list(conn.execute(sa.text(
        "SELECT effect_id, effect_type, run_id, seq, status, provider_ref, reconciled "
        "FROM onward.effects WHERE run_id = ANY(:ids)"), {"ids": ids}).all())


def _stale_commits(conn: Connection, ids: list[UUID]) -> int:
    """Checkpoints whose commit was not made by the attempt that held the lease."""
    return int(conn.execute(sa.text(
        "SELECT count(*) FROM onward.checkpoints c WHERE c.run_id = ANY(:ids) "
        "AND c.seq > 0 AND NOT EXISTS (SELECT 1 FROM onward.step_attempts a "
        " WHERE a.run_id = c.run_id AND a.lease_epoch = c.lease_epoch "
        " AND a.seq = c.seq - 1 AND a.outcome = 'committed')"),
        {"ids": ids}).scalar_one())


def _effect_attempts(conn: Connection, ids: list[UUID]) -> list[Row]:
    return list(conn.execute(sa.text(
        "SELECT a.kind, coalesce(a.outcome, 'none'), count(*) "
        "FROM onward.effect_attempts a JOIN onward.effects e "
        "  ON e.effect_type = a.effect_type AND e.effect_id = a.effect_id "
        "WHERE e.run_id = ANY(:ids) GROUP BY 1, 2"), {"ids": ids}).all())


def _step_outcomes(conn: Connection, ids: list[UUID]) -> list[Row]:
    return list(conn.execute(sa.text(
        "SELECT coalesce(outcome, 'open'), count(*) FROM onward.step_attempts "
        "WHERE run_id = ANY(:ids) GROUP BY 1"), {"ids": ids}).all())


def _outbox_left(conn: Connection, ids: list[UUID]) -> int:
    return int(conn.execute(sa.text(
        "SELECT count(*) FROM onward.outbox o JOIN onward.runs r ON r.id = o.run_id "
        "WHERE o.run_id = ANY(:ids) AND r.status <> 'running'"), {"ids": ids}).scalar_one())


def count_runs(ledger: LedgerView, ids: list[UUID], blind: dict[UUID, int],
               steps: int) -> RunCounts:
    """Completed, parked, parked as planned (the blind write's step, outcome unknown), lost."""
    runs = ledger.runs
    completed = {rid for rid, r in runs.items() if r.status == "completed"}
    parked = {rid for rid, r in runs.items() if r.status == "needs_review"}
    expected = {rid for rid in parked if rid in blind
                and runs[rid].parked_reason == "effect_outcome_unknown"
                and runs[rid].seq == blind[rid]}
    return RunCounts(
        completed=completed, parked=parked, expected_parked=expected,
        lost=[rid for rid in ids if rid not in completed and rid not in expected],
        missing_runs=len(ids) - len(runs),
        short_runs=[rid for rid in completed if runs[rid].seq != steps])


def count_effects(effects: list[Row], expected_parked: set[UUID],
                  blind: dict[UUID, int]) -> EffectCounts:
    intents = Counter((e.run_id, e.seq) for e in effects)
    unconfirmed_ok = {e.effect_id for e in effects
                      if e.run_id in expected_parked and e.seq == blind[e.run_id]
                      and e.effect_type == "chaos.blind_write" and e.status == "pending"}
    return EffectCounts(
        by_key={e.effect_id: e for e in effects},
        duplicate_intents=sum(n - 1 for n in intents.values() if n > 1),
        unconfirmed_ok=unconfirmed_ok,
        orphans=[e for e in effects if e.status in ("pending", "accepted")
                 and e.effect_id not in unconfirmed_ok],
        completed=[e for e in effects if e.status == "completed"],
        failed=[e for e in effects if e.status == "failed"])


def read_provider(c: Chaos, ids: list[UUID]) -> ProviderView:
    stats = c.servers.provider.stats()
    objects = c.servers.provider.objects()
    id_set = {str(i) for i in ids}
    per_key = Counter((o["collection"], o["idempotency_key"]) for o in objects)
    per_payload = Counter(_payload(o) for o in objects)
    first_by_key: dict[str, dict[str, Any]] = {}
    for obj in sorted(objects, key=lambda o: o["created_at"]):
        first_by_key.setdefault(obj["idempotency_key"], obj)
    return ProviderView(
        stats=stats, objects=objects,
        dup_by_key_own=sum(n - 1 for n in per_key.values() if n > 1),
        dup_by_payload=sum(n - 1 for n in per_payload.values() if n > 1),
        foreign=[o for o in objects if o["body"].get("run") not in id_set],
        first_by_key=first_by_key)


def _payload(obj: dict[str, Any]) -> tuple[Any, Any]:
    """(run, step) that an object's body names."""
    return obj["body"].get("run"), obj["body"].get("n")


def cross_check(ledger: LedgerView, runs: RunCounts, effects: EffectCounts,
                provider: ProviderView, blind: dict[UUID, int], steps: int) -> CrossCheck:
    unconfirmed, not_completed = _objects_not_completed(effects, provider)
    first = provider.first_by_key
    missing_by_payload, result_mismatch = _results_against_objects(ledger, runs, provider,
                                                                   steps)
    return CrossCheck(
        unconfirmed=unconfirmed, not_completed_in_ledger=not_completed,
        missing_at_provider=[e for e in effects.completed if e.effect_id not in first],
        ref_mismatch=[e for e in effects.completed if e.effect_id in first
                      and first[e.effect_id]["id"] != e.provider_ref],
        missing_by_payload=missing_by_payload, result_mismatch=result_mismatch,
        expected_objects=(len(runs.completed) * steps
                          + sum(ledger.runs[rid].seq for rid in runs.expected_parked)))


def _objects_not_completed(effects: EffectCounts,
                           provider: ProviderView) -> tuple[int, list[dict[str, Any]]]:
    """Objects whose effect the ledger has not completed: the expected unconfirmed writes
    (counted) and the others (listed)."""
    unconfirmed, others = 0, []
    for obj in provider.objects:
        effect = effects.by_key.get(obj["idempotency_key"])
        if effect is not None and effect.status == "completed":
            continue
        if obj["idempotency_key"] in effects.unconfirmed_ok:
            unconfirmed += 1
        else:
            others.append(obj)
    return unconfirmed, others


def _results_against_objects(ledger: LedgerView, runs: RunCounts, provider: ProviderView,
                             steps: int) -> tuple[int, int]:
    """Each completed run's result lists, step by step, the id of the object its step made
    (matched by the objects' bodies): (objects missing, ids that differ)."""
    by_payload: dict[tuple[Any, Any], str] = {}
    for obj in sorted(provider.objects, key=lambda o: o["created_at"]):
        by_payload.setdefault(_payload(obj), obj["id"])
    missing = mismatch = 0
    for rid in runs.completed:
        refs = (ledger.runs[rid].result or {}).get("refs") or []
        for n in range(steps):
            object_id = by_payload.get((str(rid), n))
            if object_id is None:
                missing += 1
            elif n >= len(refs) or refs[n] != object_id:
                mismatch += 1
    return missing, mismatch


def worker_log_events(fleet: Fleet) -> dict[str, int]:
    """Stale deliveries, discarded results and pool start failures, from the workers' logs."""
    seen: Counter[str] = Counter()
    for member in fleet.all:
        if member.role != "worker":
            continue
        for line in member.proc.log().splitlines():
            if "stale delivery" in line:
                match = re.search(r"reason=(\w+)", line)
                seen[f"stale:{match.group(1) if match else '?'}"] += 1
            elif "lease lost" in line:
                seen["lease_lost_result_discarded"] += 1
            elif "Could not start worker processes" in line and "Unrecoverable" in line:
                seen["celery_could_not_start_pool"] += 1
    return dict(sorted(seen.items()))
