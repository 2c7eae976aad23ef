"""Taking anchors of the ledger and comparing the ledger with them (ledger/anchor.py is the
file, ledger/anchor_store.py where it is kept; docs/guarantees.md, "Rollback of the whole
database").

Taking one reads every run's head in one READ ONLY snapshot, streamed by run id, and leaves
out heads whose MAC does not verify (``onward verify`` reports those). Before it writes a
new anchor it compares the ledger with the latest one and refuses when runs moved backwards
or vanished, or that anchor does not verify: otherwise the next anchor would silently accept
a rolled-back database. An operator who restored an older copy on purpose anchors it with
``onward anchor --accept-rollback --reason …`` (audited).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING
from uuid import UUID

from sqlalchemy.engine import Connection, Engine

from ledger import signed, sql
from ledger.anchor import Anchor, Head, decode, encode
from ledger.anchor_store import AnchorStore, anchor_name, taken_at_of
from ledger.audit import AuditRecord, record_txn
from ledger.checkpoints import CheckpointKeys
from ledger.db import snapshot, wrap_driver_errors
from ledger.exceptions import AnchorRefused, IntegrityViolation, RollbackFound
from ledger.verify import Problem
from ledger.vocabulary import AuditAction, AuditOutcome

if TYPE_CHECKING:
    from ledger.api import Ledger

__all__ = [
    "BATCH",
    "Anchorer",
    "Anchors",
    "Compared",
    "Published",
    "check_against",
    "compare_txn",
    "latest",
    "publish",
    "read_heads",
]


BATCH = 5000
"""Heads fetched (when taking) and compared (one statement) at a time."""

_NOW = sql.text("database_now")
_HEADS = sql.text("run_heads")
_AT_ANCHORED_SEQ = sql.text("at_anchored_seq")


@dataclass(frozen=True)
class Published:
    """An anchor just written."""

    name: str
    where: str
    taken_at: datetime
    runs: int
    root: str
    size: int  # bytes written
    not_anchored: list[UUID]  # heads whose MAC does not verify (left out)
    previous: str | None
    accepted: list[Problem] = field(default_factory=list)


@dataclass(frozen=True)
class Compared:
    """The ledger compared with one anchor, for one tenant (or all)."""

    anchor: Anchor
    age: timedelta  # the database's clock now, minus the time the anchor was taken
    compared: int  # anchored runs compared
    other_tenants: int  # anchored runs of other tenants, not compared
    problems: list[Problem]


def read_heads(engine: Engine, keys: CheckpointKeys) -> tuple[datetime, list[Head], list[UUID]]:
    """Every run's head as of one moment (the database's clock), sorted by run id, and the
    runs left out because their head MAC does not verify."""
    heads: list[Head] = []
    unsigned: list[UUID] = []
    with wrap_driver_errors("reading every run's head"), snapshot(engine) as conn:
        taken_at: datetime = conn.execute(_NOW).scalar_one()
        rows = conn.execution_options(yield_per=BATCH).execute(_HEADS)
        for run_id, tenant_id, seq, head_hash, head_mac in rows:
            if _head_verifies(keys, run_id, seq, head_hash, head_mac):
                heads.append(Head(run_id, tenant_id, seq, head_hash))
            else:
                unsigned.append(run_id)
    return taken_at, heads, unsigned


_HEAD_BODY = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _head_verifies(keys: CheckpointKeys, run_id: UUID, seq: int, head_hash: str,
                   head_mac: str | None) -> bool:
    """``keys.check(signed.head(…), head_mac)`` without its generic encoder: the body is four
    plain fields, which ``json.dumps(sort_keys)`` writes as RFC 8785 does (a unit test checks
    it), at a third of the cost: this runs once per run per anchor."""
    key_id, _, mac = (head_mac or "").rpartition(":")
    key = keys.keys.get(key_id)
    if key is None:
        return False
    body = _HEAD_BODY.encode(signed.head(run_id, seq, head_hash)).encode()
    return hmac.compare_digest(hmac.new(key, body, hashlib.sha256).hexdigest(), mac)


def compare_txn(conn: Connection, anchor: Anchor,
                tenant_id: str | None = None) -> tuple[int, list[Problem]]:
    """Compare the ledger with ``anchor`` (only ``tenant_id``'s runs, or all): how many runs
    were compared, and each that moved backwards, was rewritten, or vanished. Runs started
    after the anchor was taken are not in it, so nothing is said of them."""
    heads = [h for h in anchor.heads if tenant_id is None or h.tenant_id == tenant_id]
    problems: list[Problem] = []
    for start in range(0, len(heads), BATCH):
        chunk = heads[start:start + BATCH]
        rows = conn.execute(_AT_ANCHORED_SEQ, {"ids": [h.run_id for h in chunk],
                                               "seqs": [h.seq for h in chunk]})
        found = {run_id: (seq, digest) for run_id, seq, digest in rows}
        problems.extend(p for h in chunk
                        if (p := _moved(anchor, h, *found[h.run_id])) is not None)
    return len(heads), problems


def _moved(anchor: Anchor, head: Head, seq: int | None, digest: str | None) -> Problem | None:
    if seq is not None and seq >= head.seq and digest == head.head_hash:
        return None
    seen = (f"the anchor taken at {anchor.taken_at:%Y-%m-%d %H:%M:%S%z} saw it at seq "
            f"{head.seq} (head {head.head_hash[:12]}…)")
    if seq is None:
        return Problem(head.run_id, head.seq, "vanished",
                       f"the run is not in the ledger; {seen} (deleted, or the database is "
                       "an older copy)")
    if seq < head.seq:
        return Problem(head.run_id, head.seq, "rolled_back",
                       f"the run is at seq {seq}; {seen}: its history moved backwards by "
                       f"{head.seq - seq} step(s) (the database is an older copy?)")
    now = "is missing" if digest is None else f"is {digest[:12]}…"
    return Problem(head.run_id, head.seq, "diverged",
                   f"checkpoint {head.seq} {now}; {seen}: the history since was rewritten "
                   "(an older copy that then ran on?)")


def latest(store: AnchorStore) -> str | None:
    names = store.names()
    return names[-1] if names else None


def check_against(engine: Engine, keys: CheckpointKeys, name: str, data: bytes,
                  tenant_id: str | None = None) -> Compared:
    """The ledger compared with the anchor ``data``; raises AnchorRefused if it does not
    verify."""
    anchor = decode(keys, name, data)
    with wrap_driver_errors("comparing the ledger with an anchor"), \
            snapshot(engine) as conn:
        now: datetime = conn.execute(_NOW).scalar_one()
        compared, problems = compare_txn(conn, anchor, tenant_id)
    return Compared(anchor, now - anchor.taken_at, compared,
                    len(anchor.heads) - compared, problems)


def publish(engine: Engine, keys: CheckpointKeys, store: AnchorStore, *,
            accept_rollback: bool = False) -> Published:
    """Take an anchor and write it to ``store``, after comparing the ledger with the latest
    anchor there: raises RollbackFound (writing nothing) when anything moved backwards or
    that anchor does not verify, unless ``accept_rollback``."""
    previous = latest(store)
    problems: list[Problem] = []
    if previous is not None:
        try:
            problems = check_against(engine, keys, previous, store.read(previous)).problems
        except AnchorRefused as exc:
            problems = [Problem(None, None, "anchor", str(exc))]
    if problems and not accept_rollback:
        raise RollbackFound(_rollback_message(previous, problems), problems)
    taken_at, heads, unsigned = read_heads(engine, keys)
    root, data = encode(keys, taken_at, heads, not_anchored=len(unsigned), previous=previous,
                        accepted=len(problems))
    name = anchor_name(taken_at, root)
    where = store.create(name, data)
    return Published(name, where, taken_at, len(heads), root, len(data), unsigned, previous,
                     problems)


def _rollback_message(previous: str | None, problems: Sequence[Problem]) -> str:
    kinds = sorted({p.kind for p in problems})
    counts = ", ".join(f"{sum(p.kind == k for p in problems)} {k}" for k in kinds)
    return (f"the ledger does not match the latest anchor {previous} ({counts}), so no new "
            "anchor was written: `onward verify --anchor` lists what moved. If the database "
            "was restored from an older copy on purpose, anchor it as it is with `onward "
            "anchor --accept-rollback --reason …`")


class Anchorer:
    """The reaper's schedule: an anchor every ``interval_s``, counted from the latest one in
    the store (by the database's clock), so reapers that restart, or several reapers, write
    about one per interval. After a failure it tries again within a minute."""

    def __init__(self, engine: Engine, keys: CheckpointKeys, store: AnchorStore,
                 interval_s: float) -> None:
        self.engine, self.keys, self.store = engine, keys, store
        self.interval = timedelta(seconds=interval_s)
        self._next_check = 0.0  # time.monotonic()

    def run_if_due(self) -> Published | None:
        """Write an anchor if the latest is an interval old (or there is none)."""
        if time.monotonic() < self._next_check:
            return None
        self._next_check = time.monotonic() + min(self.interval.total_seconds(), 60.0)
        previous = latest(self.store)
        if previous is not None:
            with wrap_driver_errors("reading the clock"), self.engine.connect() as conn:
                age = conn.execute(_NOW).scalar_one() - taken_at_of(previous)
            if age < self.interval:
                self._next_check = time.monotonic() + (self.interval - age).total_seconds()
                return None
        published = publish(self.engine, self.keys, self.store)
        self._next_check = time.monotonic() + self.interval.total_seconds()
        return published


class Anchors:
    """The anchor commands of one ``Ledger``, acting as its actor."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def publish(self, store: AnchorStore, *, accept_rollback: bool = False,
                reason: str | None = None) -> Published:
        """Anchor every run of every tenant (admin; audited)."""
        keys = self.ledger.keys

        def body(conn: Connection) -> Published:
            done = publish(self.ledger.engine, keys, store, accept_rollback=accept_rollback)
            record_txn(conn, keys, self.ledger.actor, AuditRecord(
                AuditAction.ANCHOR, AuditOutcome.DONE, reason, details={
                    "anchor": done.name, "where": done.where, "runs": done.runs,
                    "root": done.root, "not_anchored": len(done.not_anchored),
                    "accepted": len(done.accepted)}))
            return done

        if accept_rollback and not (reason or "").strip():
            raise self.ledger.refuse(AuditAction.ANCHOR, IntegrityViolation(
                "--accept-rollback needs --reason: say why this copy of the database is the "
                "one to keep"))
        return self.ledger._command(AuditAction.ANCHOR, body, reason=reason)

    def compare(self, name: str, data: bytes) -> Compared:
        """Compare the actor's tenant's runs with an anchor (viewer; audited as a verify of
        mode ``anchor``, as ``Ledger.verified`` records the others). An anchor that does
        not verify raises AnchorRefused, nothing compared, audited as a verify done that
        found that one problem: what ``onward verify --anchor`` reports (exit 3)."""
        def body(conn: Connection) -> Compared | AnchorRefused:
            found: Compared | AnchorRefused
            try:
                found = check_against(self.ledger.engine, self.ledger.keys, name, data,
                                      self.ledger.actor.tenant_id)
            except AnchorRefused as exc:
                found = exc
            counts = ({"checked": 0, "problems": 1, "error": str(found)}
                      if isinstance(found, AnchorRefused)
                      else {"checked": found.compared, "problems": len(found.problems)})
            record_txn(conn, self.ledger.keys, self.ledger.actor, AuditRecord(
                AuditAction.VERIFY, AuditOutcome.DONE,
                details={"mode": "anchor", "anchor": name, **counts}))
            return found

        found = self.ledger._command(AuditAction.VERIFY, body)
        if isinstance(found, AnchorRefused):
            raise found
        return found

