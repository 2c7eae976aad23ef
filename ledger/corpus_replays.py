"""Opening a corpus replay's divergent runs in a ledger for inspection (``onward corpus
replay --open-branches``; docs/corpus.md#opening-divergent-runs).

An offline replay runs in a scratch ledger that is dropped afterwards. The replays a person
should look at are copied out first (their run row, checkpoints, step attempts and state
artifacts, exactly as the replay wrote them, MACs included) and written into the ledger that
holds the recorded runs, each as a child of its recorded run (an evidence replay, stopped),
with one audit row naming the corpus, the code and the divergence. They verify there like
any run; nothing executes them (they are never left runnable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from ledger.artifact_sweep import share_txn
from ledger.audit import Actor, AuditRecord, record_txn
from ledger.checkpoints import ARTIFACT_KEY, CheckpointKeys
from ledger.corpus_bundle import add_keys_txn
from ledger.exceptions import IntegrityViolation, OperationRefused
from ledger.schema import artifacts, checkpoints, runs, step_attempts, tenant_keys
from ledger.verify import verify_run_txn
from ledger.vocabulary import AuditAction, AuditOutcome, RunStatus

__all__ = ["ReplayCopy", "copy_replays_txn", "open_replays_txn"]


@dataclass(frozen=True)
class ReplayCopy:
    """One replay run's rows, read from the scratch ledger."""

    run_id: UUID
    parent_run_id: UUID
    status: str
    rows: dict[str, list[dict[str, Any]]]


def copy_replays_txn(conn: Connection, run_ids: list[UUID]) -> list[ReplayCopy]:
    copies = []
    for run_id in run_ids:
        run = dict(conn.execute(sa.select(runs).where(runs.c.id == run_id)).mappings().one())
        cps = [dict(r) for r in conn.execute(sa.select(checkpoints).where(
            checkpoints.c.run_id == run_id).order_by(checkpoints.c.seq)).mappings()]
        shas = [cp["state"][ARTIFACT_KEY]["sha256"] for cp in cps
                if isinstance(cp["state"], dict) and ARTIFACT_KEY in cp["state"]]
        arts = [dict(r) for r in conn.execute(
            sa.select(artifacts).where(artifacts.c.sha256.in_(shas))).mappings()] if shas else []
        attempts = [dict(r) for r in conn.execute(sa.select(step_attempts).where(
            step_attempts.c.run_id == run_id).order_by(step_attempts.c.lease_epoch)).mappings()]
        # the data keys the replay sealed its values with (the scratch ledger made its own)
        held = [dict(r) for r in conn.execute(sa.select(tenant_keys).where(
            tenant_keys.c.tenant_id == run["tenant_id"],
            tenant_keys.c.state != "destroyed").order_by(tenant_keys.c.key_id)).mappings()]
        copies.append(ReplayCopy(run_id, run["parent_run_id"], run["status"], {
            "runs": [run], "artifacts": arts, "checkpoints": cps, "step_attempts": attempts,
            "tenant_keys": held}))
    return copies


def open_replays_txn(conn: Connection, actor: Actor, keys: CheckpointKeys, copies: list[ReplayCopy],
                     details: dict[UUID, dict[str, Any]], reason: str) -> list[UUID]:
    """Write each replay into this ledger under its recorded run, verified and audited."""
    actor.require(AuditAction.REPLAY)
    opened = []
    for copy in copies:
        _check_parent(conn, actor, copy)
        add_keys_txn(conn, actor.tenant_id, copy.rows.get("tenant_keys", []))
        if copy.rows["artifacts"]:  # kept from a sweep to our commit (ledger/artifact_sweep.py)
            share_txn(conn, [row["sha256"] for row in copy.rows["artifacts"]])
            conn.execute(pg_insert(artifacts).on_conflict_do_nothing(), copy.rows["artifacts"])
        conn.execute(runs.insert(), copy.rows["runs"])
        conn.execute(checkpoints.insert(), copy.rows["checkpoints"])
        if copy.rows["step_attempts"]:
            conn.execute(step_attempts.insert(), copy.rows["step_attempts"])
        problems = verify_run_txn(conn, keys, copy.run_id)
        if problems:
            raise IntegrityViolation(f"the replay {copy.run_id} does not verify here "
                                     f"({problems[0]}): nothing was opened")
        record_txn(conn, keys, actor, AuditRecord(
            AuditAction.REPLAY, AuditOutcome.DONE, reason, run_id=copy.parent_run_id,
            new_run_id=copy.run_id, details={"corpus_replay": True,
                                             **details.get(copy.run_id, {})}))
        opened.append(copy.run_id)
    return opened


def _check_parent(conn: Connection, actor: Actor, copy: ReplayCopy) -> None:
    if RunStatus(copy.status) in (RunStatus.RUNNING, RunStatus.WAITING):
        raise OperationRefused(f"replay {copy.run_id} is {copy.status}: only a replay that "
                               "stopped is opened (nothing may execute it here)")
    tenant = conn.execute(sa.select(runs.c.tenant_id)
                          .where(runs.c.id == copy.parent_run_id)).scalar()
    if tenant is None:
        raise OperationRefused(
            f"the recorded run {copy.parent_run_id} is not in this ledger, so its replay "
            "cannot be opened under it: import the bundle first (onward corpus import)")
    if tenant != actor.tenant_id:
        raise OperationRefused(f"run {copy.parent_run_id} belongs to tenant {tenant!r}; "
                               f"{actor.name} operates tenant {actor.tenant_id!r}")
