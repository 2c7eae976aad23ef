"""``onward keys rotate``: rewrap the tenants' data keys under the active master key, give
each tenant a new data key, and re-encrypt every sealed value under it, in batches.

Resumable: each batch commits on its own; a value already under its tenant's active key
is left as it is (``Keyring.reseal``), so running it again after a stop redoes nothing and
goes on where it stopped. MACs and chains are untouched (they cover each sealed value's
digest, which a re-encryption keeps: ledger/crypto.py). Once it has finished, every data
key (the retired ones too, which still open a state stored apart as an artifact) is wrapped
by the active master key only, so the others can be removed from
``ONWARD_ENCRYPTION_KEYS`` (``masters_in_use`` says which are still needed). A value that
does not open (an erased tenant's, an edited one) is counted in ``unreadable`` and left.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from psycopg.types.json import Jsonb
from sqlalchemy.engine import Engine

from ledger.crypto import Keyring
from ledger.exceptions import OperationRefused, SealedValueUnreadable

__all__ = ["TABLES", "RotationReport", "check_masters", "rotate"]


@dataclass(frozen=True)
class _Table:
    name: str
    key: tuple[str, ...]  # primary key columns, for keyset pagination
    columns: tuple[str, ...]  # JSON columns that may hold sealed values
    tenant: str  # SQL giving the row's tenant
    run: str  # SQL giving the row's run


TABLES = (
    _Table("effects", ("effect_type", "effect_id"), ("payload", "result", "error"),
           "t.tenant_id", "t.run_id"),
    _Table("effect_attempts", ("effect_type", "effect_id", "attempt"), ("error",),
           "(SELECT e.tenant_id FROM onward.effects e WHERE e.effect_type = t.effect_type "
           "AND e.effect_id = t.effect_id)",
           "(SELECT e.run_id FROM onward.effects e WHERE e.effect_type = t.effect_type "
           "AND e.effect_id = t.effect_id)"),
    _Table("evidence", ("run_id", "command_id"), ("response", "request"),
           "(SELECT r.tenant_id FROM onward.runs r WHERE r.id = t.run_id)", "t.run_id"),
    _Table("approvals", ("id",), ("artifact",), "t.tenant_id", "t.run_id"),
    _Table("checkpoints", ("run_id", "seq"), ("state", "state_delta"),
           "(SELECT r.tenant_id FROM onward.runs r WHERE r.id = t.run_id)", "t.run_id"),
    _Table("runs", ("id",), ("result", "last_error"), "t.tenant_id", "t.id"),
    _Table("call_retries", ("run_id", "seq", "command_id"), ("last_error",),
           "(SELECT r.tenant_id FROM onward.runs r WHERE r.id = t.run_id)", "t.run_id"),
    _Table("signals", ("id",), ("payload",),
           "(SELECT r.tenant_id FROM onward.runs r WHERE r.id = t.run_id)", "t.run_id"),
)
"""Where sealed values are stored. A state stored apart as an artifact is content-addressed
(its sha256 is under the checkpoint's MAC), so it is not rewritten: see ``skipped``."""


@dataclass
class RotationReport:
    rewrapped: int = 0  # data keys wrapped again under the active master key
    new_keys: int = 0  # tenants given a new active data key
    scanned: dict[str, int] = field(default_factory=dict)  # rows read per table
    resealed: dict[str, int] = field(default_factory=dict)  # rows rewritten per table
    unreadable: dict[str, int] = field(default_factory=dict)  # rows left: did not open
    masters_in_use: list[str] = field(default_factory=list)  # master keys still wrapping

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def check_masters(engine: Engine, crypt: Keyring) -> None:
    """Refuse, before anything is changed, a rotation that could not rewrap every data key:
    one wrapped by a master key this process does not have (a key imported with a corpus
    bundle keeps the master key of the ledger it was exported from)."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT master_key_id, count(*) AS keys, array_agg(DISTINCT tenant_id) AS tenants "
            "FROM onward.tenant_keys WHERE state <> 'destroyed' GROUP BY master_key_id "
            "ORDER BY master_key_id")).mappings().all()
    missing = [row for row in rows if row["master_key_id"] not in crypt.masters]
    if not missing:
        return
    named = ", ".join(f"{row['master_key_id']!r} ({row['keys']} data key(s) of tenant(s) "
                      f"{', '.join(sorted(row['tenants']))})" for row in missing)
    raise OperationRefused(
        f"cannot rotate: data keys are wrapped by master key(s) this process does not have: "
        f"{named}; configured: {sorted(crypt.masters)}. Keys imported with a corpus bundle "
        "keep the master key of the ledger they came from. Nothing was changed: add the "
        "missing key(s) to ONWARD_ENCRYPTION_KEYS (keeping ONWARD_ENCRYPTION_KEY_ID="
        f"{crypt.active}) and run `onward keys rotate` again; it rewraps them under "
        f"{crypt.active!r}, after which the old key(s) can be removed")


def rewrap(engine: Engine, crypt: Keyring) -> int:
    """Wrap every data key that is not destroyed under the active master key."""
    done = 0
    with engine.begin() as conn:
        rows = conn.execute(sa.text(
            "SELECT tenant_id, key_id, master_key_id, wrapped FROM onward.tenant_keys "
            "WHERE state <> 'destroyed' AND master_key_id IS DISTINCT FROM :active "
            "FOR UPDATE"), {"active": crypt.active}).mappings().all()
        for row in rows:
            key = crypt.unwrap(row["tenant_id"], row["key_id"], row["master_key_id"],
                               bytes(row["wrapped"]))
            conn.execute(sa.text(
                "UPDATE onward.tenant_keys SET wrapped = :wrapped, master_key_id = :active "
                "WHERE key_id = :key_id"),
                {"wrapped": crypt.wrap(row["tenant_id"], row["key_id"], key),
                 "active": crypt.active, "key_id": row["key_id"]})
            done += 1
    return done


def new_data_keys(engine: Engine, crypt: Keyring) -> int:
    """Retire each tenant's active data key; the next seal (or reseal) makes a new one."""
    with engine.begin() as conn:
        retired = conn.execute(sa.text(
            "UPDATE onward.tenant_keys SET state = 'retired' WHERE state = 'active'")).rowcount
    crypt.forget()
    return int(retired or 0)


def _batches(engine: Engine, table: _Table, batch: int) -> Iterator[list[Any]]:
    key = ", ".join(f"t.{c}" for c in table.key)
    cols = ", ".join(f"t.{c}" for c in table.columns)
    after: tuple[Any, ...] | None = None
    while True:
        where = f"WHERE ({key}) > ({', '.join(f':k{i}' for i in range(len(table.key)))})" \
            if after is not None else ""
        params = {f"k{i}": v for i, v in enumerate(after or ())}
        with engine.connect() as conn:
            rows = conn.execute(sa.text(
                f"SELECT {key}, {cols}, {table.tenant} AS tenant, {table.run} AS run "
                f"FROM onward.{table.name} t {where} ORDER BY {key} LIMIT {int(batch)}"),
                params).mappings().all()
        if not rows:
            return
        yield list(rows)
        after = tuple(rows[-1][c] for c in table.key)


def reseal_table(engine: Engine, crypt: Keyring, table: _Table, batch: int,
                 progress: Callable[[str, int, int], None]) -> tuple[int, int, int]:
    """Re-encrypt every sealed value of ``table`` not under its tenant's active key."""
    scanned = changed = unreadable = 0
    for rows in _batches(engine, table, batch):
        updates = []
        for row in rows:
            try:
                values = {c: crypt.reseal(row[c], tenant=row["tenant"], run_id=row["run"])
                          if row[c] is not None else None for c in table.columns}
            except SealedValueUnreadable:
                unreadable += 1
                continue
            if any(values[c] is not row[c] for c in table.columns):
                updates.append({**{f"k{i}": row[c] for i, c in enumerate(table.key)},
                                **{c: Jsonb(v) if v is not None else None
                                   for c, v in values.items()}})
        if updates:
            sets = ", ".join(f"{c} = :{c}" for c in table.columns)
            match = " AND ".join(f"{c} = :k{i}" for i, c in enumerate(table.key))
            with engine.begin() as conn:
                conn.execute(sa.text(f"UPDATE onward.{table.name} SET {sets} WHERE {match}"),
                             updates)
        scanned += len(rows)
        changed += len(updates)
        progress(table.name, scanned, changed)
    return scanned, changed, unreadable


def rotate(engine: Engine, crypt: Keyring, *, batch: int = 500, new_keys: bool = True,
           progress: Callable[[str, int, int], None] = lambda *_: None) -> RotationReport:
    """Rewrap, give every tenant a new data key (``new_keys``; False to resume a rotation
    that stopped), and re-encrypt every sealed value under it. Resumable (module
    docstring). Refused, with nothing changed, when a data key's master key is missing
    (``check_masters``)."""
    check_masters(engine, crypt)
    report = RotationReport(rewrapped=rewrap(engine, crypt))
    if new_keys:
        report.new_keys = new_data_keys(engine, crypt)
    for table in TABLES:
        scanned, changed, unreadable = reseal_table(engine, crypt, table, batch, progress)
        report.scanned[table.name], report.resealed[table.name] = scanned, changed
        report.unreadable[table.name] = unreadable
    with engine.connect() as conn:
        report.masters_in_use = sorted(conn.execute(sa.text(
            "SELECT DISTINCT master_key_id FROM onward.tenant_keys "
            "WHERE master_key_id IS NOT NULL")).scalars())
    return report
