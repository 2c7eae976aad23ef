"""Exporting a corpus to a bundle and loading a bundle into a ledger (docs/corpus.md#bundles).

Export reads in one REPEATABLE READ transaction, so a bundle is one snapshot. Loading
inserts the rows as they were stored (MACs included) in the caller's transaction and then
verifies every run it added with ``ledger/verify.py``: a run that does not verify with the
keys configured here refuses the whole load.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from ledger import sql
from ledger.artifact_sweep import share_txn
from ledger.audit import Actor, AuditRecord, record_txn
from ledger.bundle import (
    BUNDLE_VERSION,
    FORMAT,
    RUN_TABLES,
    TABLES,
    Bundle,
    BundleWriter,
    DropPolicy,
)
from ledger.checkpoints import ARTIFACT_KEY, CheckpointKeys
from ledger.corpus import PINNABLE, get_corpus_txn
from ledger.db import HEAD_REVISION
from ledger.exceptions import IntegrityViolation, InvalidInput, OperationRefused
from ledger.schema import (
    approvals,
    artifacts,
    checkpoints,
    corpus_runs,
    effect_attempts,
    effects,
    evidence,
    runs,
    signals,
    step_attempts,
    tenant_keys,
)
from ledger.verify import Problem, verify_run_txn
from ledger.vocabulary import AuditAction, AuditOutcome

__all__ = [
    "Exported",
    "Loaded",
    "add_keys_txn",
    "check_complete",
    "export_txn",
    "load_txn",
    "verify_loaded_txn",
]


@dataclass(frozen=True)
class Exported:
    corpus: str
    digest: str
    counts: dict[str, int]
    dropped: tuple[str, ...]
    skipped: list[dict[str, str]] = field(default_factory=list)  # pinned, not stopped now


def export_txn(conn: Connection, keys: CheckpointKeys, actor: Actor, name: str,
               out: IO[bytes], drop: DropPolicy, *, audit: bool = True) -> Exported:
    """Write the corpus ``name`` of the actor's tenant to ``out``; with ``audit``, one
    audit row records it (a replay by name reads without writing anything).

    An audited export first verifies every run it writes and is refused, with nothing
    written, if one does not verify here: a bundle is what an import into a ledger running
    this code accepts (``verify_loaded_txn``), never a copy that laundered an edited run or
    one this code cannot read. A replay by name restores, and so checks, each run itself."""
    actor.require(AuditAction.CORPUS_EXPORT)
    corpus = get_corpus_txn(conn, actor.tenant_id, name)
    pins = sa.select(corpus_runs.c.run_id).where(corpus_runs.c.tenant_id == actor.tenant_id,
                                                 corpus_runs.c.corpus == name)
    stopped = [s.value for s in PINNABLE]
    # a run pinned when it stopped may have been continued since: it is left out until it
    # stops again (a bundle holds only runs that stopped; nothing may execute an import)
    pinned = sa.select(runs.c.id).where(runs.c.id.in_(pins), runs.c.status.in_(stopped))
    skipped = [{"run_id": str(r.id), "status": r.status} for r in conn.execute(
        sa.select(runs.c.id, runs.c.status).where(runs.c.id.in_(pins),
                                                  runs.c.status.not_in(stopped)))]
    if audit:
        _refuse_problems([p for (run_id,) in conn.execute(pinned)
                          for p in verify_run_txn(conn, keys, run_id)],
                         "in the corpus's runs, so nothing was exported",
                         f"unpin them (onward corpus rm {name} --run RUN) or export from "
                         "the ledger and onward version that wrote them")
    writer = BundleWriter(out)
    writer.line({
        "format": FORMAT, "version": BUNDLE_VERSION, "schema_revision": HEAD_REVISION,
        "corpus": name, "description": corpus.description, "tenant_id": actor.tenant_id,
        "exported_by": actor.name, "dropped": list(drop.fields), "skipped": skipped,
        "exported_at": conn.execute(sa.select(sa.func.onward.now())).scalar_one().isoformat(),
    })
    for table in TABLES:
        writer.rows(table, (drop.apply(table, dict(row))
                            for row in _rows(conn, table, pinned, drop)))
    digest = writer.finish(keys)
    if audit:
        record_txn(conn, keys, actor, AuditRecord(
            AuditAction.CORPUS_EXPORT, AuditOutcome.DONE,
            details={"corpus": name, "digest": digest, "counts": writer.counts,
                     "dropped": list(drop.fields), "skipped": skipped}))
    return Exported(name, digest, writer.counts, drop.fields, skipped)


def _rows(conn: Connection, table: str, pinned: Any,
          drop: DropPolicy) -> Iterator[sa.RowMapping]:
    query = _QUERIES[table](pinned, drop)
    yield from conn.execute(query.execution_options(yield_per=500)).mappings()


def _artifacts(pinned: Any, drop: DropPolicy) -> Any:
    used = [
        sa.select(evidence.c.artifact_sha256.label("sha"))
        .where(evidence.c.run_id.in_(pinned), evidence.c.artifact_sha256.is_not(None)),
        sa.select(checkpoints.c.state[ARTIFACT_KEY]["sha256"].astext.label("sha"))
        .where(checkpoints.c.run_id.in_(pinned)),
    ]
    if not drop.drops_requests:  # a request is kept as the artifact its hash names
        used.append(sa.select(evidence.c.request_hash.label("sha"))
                    .where(evidence.c.run_id.in_(pinned)))
    shas = sa.union(*used).subquery()
    return sa.select(artifacts).where(artifacts.c.sha256.in_(sa.select(shas.c.sha))) \
        .order_by(artifacts.c.sha256)


_QUERIES: dict[str, Any] = {
    "runs": lambda p, d: sa.select(runs).where(runs.c.id.in_(p)).order_by(runs.c.id),
    "artifacts": _artifacts,
    "checkpoints": lambda p, d: sa.select(checkpoints).where(checkpoints.c.run_id.in_(p))
    .order_by(checkpoints.c.run_id, checkpoints.c.seq),
    "evidence": lambda p, d: sa.select(evidence).where(evidence.c.run_id.in_(p))
    .order_by(evidence.c.run_id, evidence.c.seq, evidence.c.command_id),
    "effects": lambda p, d: sa.select(effects).where(effects.c.run_id.in_(p))
    .order_by(effects.c.run_id, effects.c.seq, effects.c.created_at, effects.c.effect_id),
    "effect_attempts": lambda p, d: sa.select(effect_attempts).join(effects, sa.and_(
        effects.c.effect_type == effect_attempts.c.effect_type,
        effects.c.effect_id == effect_attempts.c.effect_id)).where(effects.c.run_id.in_(p))
    .order_by(effect_attempts.c.effect_type, effect_attempts.c.effect_id,
              effect_attempts.c.attempt),
    "approvals": lambda p, d: sa.select(approvals).where(approvals.c.run_id.in_(p))
    .order_by(approvals.c.run_id, approvals.c.seq, approvals.c.id),
    "signals": lambda p, d: sa.select(signals).where(
        signals.c.run_id.in_(p), signals.c.consumed_seq.is_not(None)).order_by(signals.c.id),
    "step_attempts": lambda p, d: sa.select(step_attempts).where(step_attempts.c.run_id.in_(p))
    .order_by(step_attempts.c.run_id, step_attempts.c.lease_epoch),
    "tenant_keys": lambda p, d: _tenant_keys(p),
}


def _tenant_keys(pinned: Any) -> Any:
    """The data keys of the runs' tenant that were not destroyed, wrapped as stored (the
    master key that unwraps them never enters a ledger, nor a bundle)."""
    tenants = sa.select(runs.c.tenant_id).where(runs.c.id.in_(pinned))
    return sa.select(tenant_keys).where(tenant_keys.c.tenant_id.in_(tenants),
                                        tenant_keys.c.state != "destroyed") \
        .order_by(tenant_keys.c.key_id)


# -- loading -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Loaded:
    """What a load added: runs new to the ledger, and runs it already held identically."""

    added: list[UUID]
    present: list[UUID]
    counts: dict[str, int] = field(default_factory=dict)
    keys_dropped: int = 0  # data keys the bundle carried and the load left out


def load_txn(conn: Connection, bundle: Bundle, tenant_id: str, *,
             with_keys: bool = True) -> Loaded:
    """Insert the bundle's rows in the caller's transaction (skipping runs already present
    with the same head). Nothing is verified yet: ``verify_loaded_txn`` does that.

    The bundle's data keys are inserted only ``with_keys`` and only if the tenant's keys
    were never erased here: a bundle carrying keys for an erased tenant is refused, nothing
    written, since its keys would make the tenant's sealed values readable again (erasure
    is permanent: ``with_keys=False`` loads the runs without the keys, their sealed values
    unreadable). Signals keep their ids: the signal id sequence is moved past the bundle's
    before anything is inserted, so a signal sent to this ledger while the bundle loads
    takes an id above them (the move waits for signal sends in flight to commit, and sends
    wait for the move: migration 0044). Imports of one tenant run one at a time (an advisory lock to
    the caller's commit): the second of two imports of the same runs skips them as present."""
    _check_rows(bundle, tenant_id)
    check_complete(bundle)
    conn.execute(_IMPORT_LOCK, {"tenant": tenant_id})  # after another import's commit
    if bundle.rows["signals"]:  # before taking any lock a signal send could wait for
        conn.execute(sa.select(sa.func.onward.signal_ids_past(
            max(row["id"] for row in bundle.rows["signals"]))))
    present = _present(conn, bundle)
    keys = bundle.rows.get("tenant_keys", []) if with_keys else []
    if keys:
        _check_not_erased(conn, tenant_id, len(keys))
    keep = {run_id for run_id in bundle.run_ids if run_id not in present}
    effect_runs = {(e["effect_type"], e["effect_id"]): e["run_id"]
                   for e in bundle.rows["effects"]}
    counts: dict[str, int] = {}
    for table in TABLES:
        rows = (keys if table == "tenant_keys" else
                [row for row in bundle.rows[table]
                 if table == "artifacts" or _owner(table, row, effect_runs) in keep])
        counts[table] = _insert(conn, table, rows)
    dropped = 0 if with_keys else len(bundle.rows.get("tenant_keys", []))
    return Loaded(sorted(keep), sorted(present), counts, keys_dropped=dropped)


_IMPORT_LOCK = sql.text("corpus_import_lock")
_KEYS_LOCK = sql.text("tenant_keys_lock_shared")
_KEYS_ERASED = sql.text("tenant_keys_destroyed")


def _check_not_erased(conn: Connection, tenant_id: str, carried: int) -> None:
    """Refuse to add data keys for a tenant whose keys were erased here. Holds the lock an
    erasure takes (shared) to the caller's commit: an erasure that begins meanwhile waits,
    then destroys the keys this adds too."""
    conn.execute(_KEYS_LOCK, {"tenant": tenant_id})
    if conn.execute(_KEYS_ERASED, {"tenant": tenant_id}).scalar():
        raise OperationRefused(
            f"tenant {tenant_id!r}'s data keys were erased in this ledger (`onward keys "
            f"erase-tenant`), and the bundle carries {carried} of its data key(s), which would "
            "make its sealed values readable here again: nothing was imported. Erasure is "
            "permanent; to import the runs with their sealed values unreadable, import the "
            "bundle without its keys (`onward corpus import --without-keys`)")


def verify_loaded_txn(conn: Connection, keys: CheckpointKeys, run_ids: list[UUID]) -> None:
    """Raise IntegrityViolation unless every run verifies with the keys configured here."""
    _refuse_problems([p for run_id in run_ids for p in verify_run_txn(conn, keys, run_id)],
                     "in the bundle's runs, so nothing was imported",
                     "are the MAC keys configured here those of the ledger the bundle "
                     "came from?")


def _refuse_problems(problems: list[Problem], what: str, hint: str) -> None:
    """Raise IntegrityViolation naming the first problems found, if any."""
    if problems:
        shown = "; ".join(str(p) for p in problems[:3])
        raise IntegrityViolation(f"{len(problems)} problem(s) {what}: {shown}"
                                 f"{' …' if len(problems) > 3 else ''} ({hint})")


def _owner(table: str, row: dict[str, Any], effect_runs: dict[tuple[str, str], UUID]) -> Any:
    if table == "runs":
        return row["id"]
    if table == "effect_attempts":
        return effect_runs.get((row["effect_type"], row["effect_id"]))
    return row.get("run_id")


def _check_rows(bundle: Bundle, tenant_id: str) -> None:
    """Every run of the tenant the load is for, every row belonging to one of them."""
    ids = set(bundle.run_ids)
    if not ids:
        raise InvalidInput("the bundle holds no runs")
    for run in bundle.rows["runs"]:
        if run["tenant_id"] != tenant_id:
            raise OperationRefused(
                f"the bundle's runs belong to tenant {run['tenant_id']!r}; you operate tenant "
                f"{tenant_id!r} (set ONWARD_TENANT_ID, or use a token of that tenant)")
        if run["parent_run_id"] is not None:
            raise InvalidInput(f"bundle run {run['id']} is a replay or branch: a bundle holds "
                               "recorded runs only")
        if run["status"] not in {s.value for s in PINNABLE}:
            raise InvalidInput(f"bundle run {run['id']} is {run['status']}: a bundle holds runs "
                               "that stopped, which nothing executes once imported")
    for key in bundle.rows.get("tenant_keys", []):
        if key["tenant_id"] != tenant_id or key["wrapped"] is None:
            raise InvalidInput(f"the bundle's data key {key['key_id']} is not a wrapped key of "
                               f"tenant {tenant_id!r}")
    effect_runs = {(e["effect_type"], e["effect_id"]) for e in bundle.rows["effects"]}
    for table in RUN_TABLES:
        for row in bundle.rows[table]:
            owned = ((row["effect_type"], row["effect_id"]) in effect_runs
                     if table == "effect_attempts" else row["run_id"] in ids)
            if not owned:
                raise InvalidInput(f"a {table} row of the bundle belongs to no run in it")


def check_complete(bundle: Bundle) -> None:
    """Every model call, read and effect a checkpoint names under its MAC (its refs) is in
    the bundle: a record left out (or deleted from the ledger before the export) is
    refused here, not found missing by a replay."""
    recorded = {(row["run_id"], row["command_id"]) for row in bundle.rows["evidence"]}
    effects_held = {(row["effect_type"], row["effect_id"]) for row in bundle.rows["effects"]}
    for cp in bundle.rows["checkpoints"]:
        refs = cp.get("refs") or {}
        for used in refs.get("evidence") or []:
            if (cp["run_id"], used.get("command_id")) not in recorded:
                raise IntegrityViolation(
                    f"run {cp['run_id']}'s checkpoint {cp['seq']} names the recorded "
                    f"{used.get('kind')} call {used.get('command_id')}, which the bundle does "
                    "not hold (deleted from the ledger, or left out): nothing was loaded")
        for used in refs.get("effects") or []:
            if (used.get("effect_type"), used.get("effect_id")) not in effects_held:
                raise IntegrityViolation(
                    f"run {cp['run_id']}'s checkpoint {cp['seq']} names effect "
                    f"{used.get('effect_type')} {str(used.get('effect_id'))[:16]}…, which the "
                    "bundle does not hold (deleted from the ledger, or left out): nothing was "
                    "loaded")


def _present(conn: Connection, bundle: Bundle) -> set[UUID]:
    heads = {row["id"]: row["head_hash"] for row in bundle.rows["runs"]}
    found = conn.execute(sa.select(runs.c.id, runs.c.head_hash)
                         .where(runs.c.id.in_(list(heads)))).all()
    for run_id, head in found:
        if head != heads[run_id]:
            raise OperationRefused(
                f"run {run_id} is already in this ledger with another history (head "
                f"{head[:12]}…, the bundle's {heads[run_id][:12]}…): nothing was imported")
    return {UUID(str(run_id)) for run_id, _ in found}


_TABLES = {"runs": runs, "artifacts": artifacts, "checkpoints": checkpoints,
           "evidence": evidence, "effects": effects, "effect_attempts": effect_attempts,
           "approvals": approvals, "signals": signals, "step_attempts": step_attempts,
           "tenant_keys": tenant_keys}


def _insert(conn: Connection, table: str, rows: list[dict[str, Any]]) -> int:
    if not rows:
        return 0
    if table == "signals":
        return _insert_signals(conn, rows)
    if table == "tenant_keys":
        return _insert_keys(conn, rows)
    target = _TABLES[table]
    if table == "artifacts":  # content-addressed: one the ledger holds is the same bytes
        share_txn(conn, [row["sha256"] for row in rows])  # kept from a sweep to our commit
        conn.execute(pg_insert(target).on_conflict_do_nothing(), rows)
    else:
        conn.execute(target.insert(), rows)
    return len(rows)


def add_keys_txn(conn: Connection, tenant_id: str, rows: list[dict[str, Any]]) -> int:
    """Add ``tenant_id``'s wrapped data keys from another ledger (a scratch ledger's replay:
    ledger/corpus_replays.py) that this one lacks, retired; refused for a tenant whose keys
    were erased here, as an import's are. The number added."""
    held = set(conn.execute(sa.select(tenant_keys.c.key_id).where(
        tenant_keys.c.key_id.in_([r["key_id"] for r in rows]))).scalars()) if rows else set()
    missing = [r for r in rows if r["key_id"] not in held]
    if not missing:
        return 0
    _check_not_erased(conn, tenant_id, len(missing))
    return _insert_keys(conn, missing)


def _insert_keys(conn: Connection, rows: list[dict[str, Any]]) -> int:
    """The tenant's wrapped data keys, to open the bundle's sealed values with (a key this
    ledger holds by that id is kept as it is: one it destroyed stays destroyed). They arrive
    retired: they open, they never seal (this ledger's tenant may have an active key of its
    own, and gets one at its first seal otherwise)."""
    retired = [{**row, "state": "retired"} for row in rows]
    added = conn.execute(pg_insert(tenant_keys).on_conflict_do_nothing(
        index_elements=[tenant_keys.c.key_id]).returning(tenant_keys.c.key_id), retired)
    return len(list(added.scalars()))


def _insert_signals(conn: Connection, rows: list[dict[str, Any]]) -> int:
    """Signals keep their ids (a signal's MAC covers its id, and checkpoints name the ones
    they consumed by id): ``load_txn`` moved the id sequence past the bundle's largest
    first (migration 0043), so a signal sent meanwhile takes another id; an id this ledger
    already gave to another signal (or another import, committed first, did) refuses the
    load (nothing is renumbered)."""
    added = set(conn.execute(pg_insert(signals).on_conflict_do_nothing()
                             .returning(signals.c.id), rows).scalars())
    taken = sorted(row["id"] for row in rows if row["id"] not in added)
    if taken:
        raise OperationRefused(
            f"signal id(s) {', '.join(map(str, taken[:5]))} of the bundle are already used in "
            "this ledger by other signals; a signal's MAC covers its id, so it cannot be "
            "renumbered: import into a ledger that does not hold them (a fresh one, as the "
            "scratch ledger of a corpus replay is). Nothing was imported")
    return len(rows)
