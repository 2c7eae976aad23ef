"""The audit log as a keyed hash chain per tenant.

Audit rows are written by many transactions at once, some inside one-statement CTEs (the
park statement), so no writer knows its predecessor. Each writer signs its own row
(``audit.mac``, ledger/signed.py ``audit_row``) in the transaction that writes it. The
reaper's sealer then links committed rows into their tenant's chain in order, one sealer at
a time (an advisory lock): ``chain_seq`` 1, 2, … and ``chain_mac``, a MAC over the row's
place, id, time and own MAC and the previous link; and it signs the chain's last link
(``audit_heads``). The key stays in Python: nothing here needs it in the database.

So an edited row fails its own MAC at once; a deleted row, once sealed, leaves a gap (or a
head naming rows that are gone); an edited time or id fails its link. The window: a row can
be deleted without trace until it is sealed, normally within one reaper interval;
``onward verify`` reports rows left unsealed longer than ``ONWARD_AUDIT_SEAL_GRACE_S`` as
kind ``unsealed``: a warning of its own (exit 4), not tampering, since nothing there fails a
check; it means no reaper is sealing, and ``onward verify --seal`` (an admin) seals them.
Rolling the whole log (rows and head) back to an earlier copy is the snapshot restore the
keys cannot see (docs/guarantees.md, "Integrity").
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection, RowMapping

from ledger import signed, sql
from ledger.checkpoints import CheckpointKeys
from ledger.exceptions import IntegrityViolation
from ledger.schema import audit, audit_heads
from ledger.verify import Problem

__all__ = ["SEAL_LOCK", "UNSEALED", "Sealed", "seal_txn", "verify_audit_txn"]


SEAL_LOCK = 0x0A_0D_17_5E
"""The advisory lock one sealer holds while it extends the chains."""

UNSEALED = "unsealed"
"""The kind of the problem verify reports for a row left unsealed past the grace period."""

_UNSEALED = sql.text("unsealed_audit_rows")
_UNSEALED_OF_TENANT = sql.text("unsealed_audit_rows_of_tenant")
_SEAL_ROW = sql.text("seal_audit_row")
_TRY_SEAL_LOCK = sql.text("try_seal_lock")


@dataclass(frozen=True)
class Sealed:
    rows: int = 0
    refused: list[str] = field(default_factory=list)  # tenants whose chain did not verify


def seal_txn(conn: Connection, keys: CheckpointKeys, limit: int = 1000, *,
             tenant_id: str | None = None) -> Sealed:
    """Link up to ``limit`` committed, unsealed rows into their tenants' chains (only
    ``tenant_id``'s when given: an admin's ``verify --seal``), in id order.
    Another sealer holding the lock: nothing to do now. A tenant whose chain's end does not
    verify is not extended (that would sign over a deletion): it is named in ``refused``."""
    if not conn.execute(_TRY_SEAL_LOCK, {"k": SEAL_LOCK}).scalar():
        return Sealed()
    rows = conn.execute(_UNSEALED, {"limit": limit}).mappings().all() if tenant_id is None \
        else conn.execute(_UNSEALED_OF_TENANT, {"limit": limit, "tenant": tenant_id}
                          ).mappings().all()
    sealed, refused = 0, []
    for tenant, group in itertools.groupby(rows, key=lambda r: str(r["tenant_id"])):
        try:
            sealed += _seal_tenant(conn, keys, tenant, list(group))
        except IntegrityViolation as exc:
            refused.append(str(exc))
    return Sealed(sealed, refused)


def _seal_tenant(conn: Connection, keys: CheckpointKeys, tenant: str,
                 rows: Sequence[RowMapping]) -> int:
    head = conn.execute(sa.select(audit_heads).where(audit_heads.c.tenant_id == tenant)
                        .with_for_update()).mappings().first()
    seq, previous = _verified_end(conn, keys, tenant, head)
    links = []
    for row in rows:
        seq += 1
        at_us = signed.micros(row["at"])
        previous = keys.sign(signed.audit_link(tenant, seq, row["id"], at_us, row["mac"],
                                               previous))
        links.append({"id": row["id"], "seq": seq, "link": previous})
    conn.execute(_SEAL_ROW, links)
    values = {"chain_seq": seq, "chain_mac": previous,
              "mac": keys.sign(signed.audit_head(tenant, seq, previous)),
              "sealed_at": sa.func.onward.now()}
    conn.execute(pg_insert(audit_heads).values(tenant_id=tenant, **values)
                 .on_conflict_do_update(index_elements=["tenant_id"], set_=values))
    return len(rows)


def _verified_end(conn: Connection, keys: CheckpointKeys, tenant: str,
                  head: RowMapping | None) -> tuple[int, str | None]:
    """The place and link the chain continues from, once its head and last row verify."""
    last = conn.execute(sa.select(audit.c.chain_seq, audit.c.chain_mac)
                        .where(audit.c.tenant_id == tenant, audit.c.chain_seq.is_not(None))
                        .order_by(audit.c.chain_seq.desc()).limit(1)).first()
    if head is None:
        if last is not None:
            raise IntegrityViolation(f"tenant {tenant!r}: the audit chain's head is missing "
                                     "but sealed rows exist; not sealing more")
        return 0, None
    keys.check(signed.audit_head(tenant, head["chain_seq"], head["chain_mac"]), head["mac"],
               f"tenant {tenant!r}: the audit chain's head")
    if last is None or (last.chain_seq, last.chain_mac) != (head["chain_seq"],
                                                            head["chain_mac"]):
        raise IntegrityViolation(f"tenant {tenant!r}: the audit chain ends at place "
                                 f"{last.chain_seq if last else 0}, its head names place "
                                 f"{head['chain_seq']} (rows deleted); not sealing more")
    return int(head["chain_seq"]), str(head["chain_mac"])


def verify_audit_txn(conn: Connection, keys: CheckpointKeys, tenant_id: str, *,
                     grace_s: float) -> list[Problem]:
    """Every problem in a tenant's audit log: rows that fail their own MAC (edited) or
    have none, gaps and broken links in the sealed chain (deleted, reordered, time or id
    edited), a head that names rows that are gone, rows left unsealed past ``grace_s``
    (kind ``unsealed``: intact as far as anyone can tell, but open to a deletion unseen)."""
    rows = conn.execute(sa.select(audit).where(audit.c.tenant_id == tenant_id)
                        .order_by(audit.c.chain_seq.nulls_last(), audit.c.id)).mappings().all()
    now = conn.execute(sa.select(sa.func.onward.now())).scalar_one()
    problems = [p for row in rows for p in _row_problems(keys, row)]
    problems.extend(_chain_problems(keys, tenant_id, [r for r in rows
                                                      if r["chain_seq"] is not None]))
    late = now - timedelta(seconds=grace_s)
    problems.extend(
        Problem(row["run_id"], None, UNSEALED,
                f"audit row {row['id']} written at {row['at']:%Y-%m-%d %H:%M:%S} is not "
                f"sealed after {grace_s:.0f}s (is a reaper running?)")
        for row in rows if row["chain_seq"] is None and row["at"] < late)
    head = conn.execute(sa.select(audit_heads).where(audit_heads.c.tenant_id == tenant_id)
                        ).mappings().first()
    sealed = [r for r in rows if r["chain_seq"] is not None]
    problems.extend(_head_problems(keys, tenant_id, head, sealed[-1] if sealed else None))
    return problems


def _row_problems(keys: CheckpointKeys, row: RowMapping) -> Iterator[Problem]:
    try:
        keys.check(signed.audit_row(row), row["mac"], f"audit row {row['id']}")
    except IntegrityViolation as exc:
        yield Problem(row["run_id"], None, "audit", str(exc))


def _chain_problems(keys: CheckpointKeys, tenant: str,
                    sealed: Sequence[RowMapping]) -> Iterator[Problem]:
    expected, previous = 1, None
    for row in sealed:
        place = row["chain_seq"]
        if place != expected:
            yield Problem(row["run_id"], None, "audit",
                          f"audit rows sealed at places {expected}..{place - 1} are missing "
                          f"(deleted); the chain goes on at row {row['id']}")
        else:
            try:
                at_us = signed.micros(row["at"])
                keys.check(signed.audit_link(tenant, place, row["id"], at_us, row["mac"],
                                             previous), row["chain_mac"],
                           f"audit row {row['id']}'s link in the chain (place {place})")
            except IntegrityViolation as exc:
                yield Problem(row["run_id"], None, "audit", str(exc))
        expected, previous = place + 1, row["chain_mac"]


def _head_problems(keys: CheckpointKeys, tenant: str, head: RowMapping | None,
                   last: RowMapping | None) -> Iterator[Problem]:
    if head is None:
        if last is not None:
            yield Problem(None, None, "audit", "the audit chain's head is missing")
        return
    try:
        keys.check(signed.audit_head(tenant, head["chain_seq"], head["chain_mac"]),
                   head["mac"], "the audit chain's head")
    except IntegrityViolation as exc:
        yield Problem(None, None, "audit", str(exc))
        return
    if last is None or (last["chain_seq"], last["chain_mac"]) != (head["chain_seq"],
                                                                  head["chain_mac"]):
        yield Problem(None, None, "audit",
                      f"the audit chain's head names place {head['chain_seq']}, the last "
                      f"sealed row is at place {last['chain_seq'] if last else 0} (rows "
                      "deleted from its end)")
