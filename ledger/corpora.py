"""``Corpora``: the corpus commands of one ``Ledger``, acting as its actor (docs/corpus.md).

Every command checks the actor's role first; those that change something or let data leave
the ledger (add, remove, export, import) write one audit row, refusals included. Reading a
corpus for a replay (``snapshot``) writes nothing at all: it runs in a READ ONLY
transaction, so the ledger refuses any write it would attempt.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, TypeVar
from uuid import UUID

from sqlalchemy.engine import Connection

from ledger import corpus
from ledger.audit import Actor, AuditRecord, record_txn
from ledger.bundle import Bundle, DropPolicy
from ledger.corpus_bundle import Exported, export_txn, load_txn, verify_loaded_txn
from ledger.db import snapshot, wrap_driver_errors
from ledger.vocabulary import AuditAction, AuditOutcome

if TYPE_CHECKING:
    from ledger.api import Ledger

__all__ = ["Corpora", "Imported"]


T = TypeVar("T")


@dataclass(frozen=True)
class Imported:
    corpus: str
    digest: str
    added: list[UUID]
    present: list[UUID]
    pinned: int
    keys_dropped: int = 0  # data keys the bundle carried and the import left out


class Corpora:
    """Pin, list, export and import corpora of recorded runs."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    @property
    def actor(self) -> Actor:
        return self.ledger.actor

    def add(self, name: str, selection: corpus.Selection,
            description: str | None = None) -> corpus.Pinned:
        """Pin the runs ``selection`` names into corpus ``name`` (created if new)."""
        return self.ledger._command(
            AuditAction.CORPUS_ADD,
            lambda c: corpus.pin_txn(c, self.ledger.keys, self.actor, name, selection, description),
            reason=description)

    def remove(self, name: str, run_ids: tuple[UUID, ...] = (),
               reason: str | None = None, *, dry_run: bool = False) -> int:
        """Unpin ``run_ids``, or delete the corpus when none are given. ``dry_run``: refuse
        (audited) as it would, removing nothing (``Ledger._command``)."""
        return self.ledger._command(
            AuditAction.CORPUS_REMOVE,
            lambda c: corpus.remove_txn(c, self.ledger.keys, self.actor, name, run_ids, reason),
            reason=reason, dry_run=dry_run)

    def all(self) -> list[corpus.CorpusSummary]:
        with wrap_driver_errors("listing corpora"), self.ledger.engine.connect() as conn:
            return corpus.list_corpora_txn(conn, self.actor.tenant_id)

    def get(self, name: str) -> corpus.CorpusSummary:
        with wrap_driver_errors("reading a corpus"), self.ledger.engine.connect() as conn:
            return corpus.get_corpus_txn(conn, self.actor.tenant_id, name)

    def runs(self, name: str) -> list[corpus.PinnedRun]:
        with wrap_driver_errors("reading a corpus"), self.ledger.engine.connect() as conn:
            return corpus.pinned_runs_txn(conn, self.actor.tenant_id, name)

    def pinned(self, run_ids: list[UUID]) -> set[UUID]:
        """Which of ``run_ids`` a corpus pins (what retention must keep)."""
        with wrap_driver_errors("reading pins"), self.ledger.engine.connect() as conn:
            return corpus.pinned_txn(conn, run_ids)

    def export(self, name: str, out: IO[bytes], drop: DropPolicy | None = None) -> Exported:
        """Write corpus ``name`` to ``out`` as a bundle, from one snapshot (audited)."""
        return self._snapshot_command(
            AuditAction.CORPUS_EXPORT,
            lambda c: export_txn(c, self.ledger.keys, self.actor, name, out,
                                 drop or DropPolicy()), read_only=False)

    def snapshot(self, name: str) -> bytes:
        """Corpus ``name`` as bundle bytes, read in a READ ONLY transaction: what a replay by
        name uses. Needs the role an export needs; writes nothing (no audit row either)."""
        out = io.BytesIO()
        self.actor.require(AuditAction.CORPUS_EXPORT)
        with wrap_driver_errors("reading a corpus"), snapshot(self.ledger.engine) as conn:
            export_txn(conn, self.ledger.keys, self.actor, name, out, DropPolicy(),
                       audit=False)
        return out.getvalue()

    def import_bundle(self, bundle: Bundle, name: str | None = None, *,
                      without_keys: bool = False) -> Imported:
        """Load a verified bundle's runs into this ledger and pin them as corpus ``name``
        (default: the bundle's); refused, with nothing written, unless every run it adds
        verifies with the keys configured here (audited). A bundle carrying data keys of a
        tenant whose keys were erased here is refused too (erasure is permanent), unless
        ``without_keys``: the runs load without the bundle's data keys, their sealed values
        unreadable."""
        target = corpus.check_name(name or str(bundle.header.get("corpus") or ""))

        def body(conn: Connection) -> Imported:
            loaded = load_txn(conn, bundle, self.actor.tenant_id, with_keys=not without_keys)
            verify_loaded_txn(conn, self.ledger.keys, loaded.added)
            pinned = corpus.pin_ids_txn(
                conn, self.actor, target, bundle.run_ids,
                {"bundle": bundle.digest, "corpus": bundle.header.get("corpus")},
                bundle.header.get("description"))
            record_txn(conn, self.ledger.keys, self.actor, AuditRecord(
                AuditAction.CORPUS_IMPORT, AuditOutcome.DONE,
                details={"corpus": target, "digest": bundle.digest,
                         "from": {k: bundle.header.get(k) for k in
                                  ("corpus", "tenant_id", "exported_by", "exported_at")},
                         "added": len(loaded.added), "present": len(loaded.present),
                         "dropped": bundle.header.get("dropped"),
                         "keys_dropped": loaded.keys_dropped}))
            return Imported(target, bundle.digest, loaded.added, loaded.present, len(pinned),
                            loaded.keys_dropped)

        return self.ledger._command(AuditAction.CORPUS_IMPORT, body)

    def _snapshot_command(self, action: AuditAction, body: Callable[[Connection], T], *,
                          read_only: bool) -> T:
        """Like ``Ledger._command``, in one REPEATABLE READ transaction (one snapshot)."""
        from ledger.api import REFUSALS

        try:
            self.actor.require(action)
            with wrap_driver_errors(action.value), \
                    snapshot(self.ledger.engine, read_only=read_only) as conn:
                return body(conn)
        except REFUSALS as exc:
            raise self.ledger.refuse(action, exc) from None
