"""The corpus bundle: a self-contained, integrity-checked file of recorded runs
(docs/corpus.md#bundles).

A bundle is JSON Lines, gzip-compressed when its name ends in ``.gz``: a header line, one
line per row (``{"t": table, "r": row}``) of the runs, their artifacts, checkpoints,
evidence, effects and effect attempts, decided approvals, consumed signals and step
attempts, exactly as stored (MACs included; sealed values sealed), the tenant's wrapped
data keys that open them, and a trailer with the sha256 of every byte
before it and a keyed MAC of that digest. Reading one checks the digest and the MAC before
a row is used; loading it then verifies every run with ``ledger/verify.py``.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import IO, Any
from uuid import UUID

import jsonpointer
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import UUID as PgUUID

from ledger import signed
from ledger.checkpoints import CheckpointKeys
from ledger.exceptions import IntegrityViolation, InvalidInput
from ledger.json_input import read_json
from ledger.schema import metadata

__all__ = [
    "BUNDLE_VERSION",
    "DROPPABLE",
    "DROPPED",
    "FORMAT",
    "KEPT",
    "RUN_TABLES",
    "TABLES",
    "Bundle",
    "BundleWriter",
    "DropPolicy",
    "bundle_mac_body",
    "decode_row",
    "encode_row",
    "iter_rows",
    "open_for_write",
    "read_bundle",
]


FORMAT = "onward-corpus"
BUNDLE_VERSION = 1
TABLES = ("runs", "artifacts", "checkpoints", "evidence", "effects", "effect_attempts",
          "approvals", "signals", "step_attempts", "tenant_keys")
"""What a bundle holds, in the order rows are written and loaded (foreign keys first).
``tenant_keys`` are the tenant's data keys as stored, wrapped by a master key (useless
without it): what opens the bundle's sealed values. A bundle written before they were
carried has none, and reads as before."""

RUN_TABLES = TABLES[2:-1]
"""The tables whose every row belongs to a run of the bundle (``run_id``, or an effect's)."""

DROPPABLE = {
    "runs.last_error": "the run's last error (its message may quote data)",
    "effects.payload": "effect payloads (a replay compares their request hash only)",
    "effects.recipient": "effect recipients",
    "effects.error": "the provider's error of failed effects",
    "effect_attempts.error": "errors of effect attempts",
    "approvals.artifact": "what approvers saw (the replay follows the decision and its hash)",
    "approvals.comment": "approvers' comments (their sha256 is kept: the decision signs it)",
    "step_attempts.error_message": "step error messages",
    "requests": "recorded model and read requests (request diffs become unavailable)",
}
"""Fields a bundle may leave out (``--drop-field``): nothing a replay answers with, and
nothing a MAC needs (an effect's recipient has one, checked only while the text is there),
so the bundle still verifies and still replays."""

KEPT = {
    "checkpoints": "checkpoints are covered by their MACs and are what a replay restores",
    "evidence.response": "recorded answers are what a replay answers model calls and reads with",
    "effects.result": "effect results are what a replay answers effects with",
    "signals.payload": "a replay hands signal payloads to ctx.signal()",
    "runs.result": "a run's result is what the replay's result is compared with",
}

DROPPED = {"$dropped": True}
"""What a dropped JSON value becomes (a dropped text field becomes null)."""


@dataclass(frozen=True)
class DropPolicy:
    """Fields to leave out of a bundle: ``table.column`` or ``table.column/json/pointer``."""

    fields: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for spec in self.fields:
            column = spec.partition("/")[0]
            if column in DROPPABLE:
                continue
            kept = KEPT.get(column) or KEPT.get(column.split(".")[0])
            if kept:
                raise InvalidInput(f"--drop-field {spec}: cannot be dropped: {kept} (with "
                                   "encryption at rest, such fields stay sealed in bundles)")
            raise InvalidInput(f"--drop-field {spec}: not a droppable field; droppable: "
                               f"{', '.join(sorted(DROPPABLE))} (JSON fields also as "
                               "table.column/pointer, e.g. effects.payload/card)")

    @property
    def drops_requests(self) -> bool:
        return "requests" in self.fields

    def apply(self, table: str, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` with this policy's fields of ``table`` left out."""
        if table == "evidence" and self.drops_requests:  # a request kept sealed in its row
            row["request"] = None
        for spec in self.fields:
            column, _, pointer = spec.partition("/")
            name, _, col = column.partition(".")
            if name != table or col not in row or row[col] is None:
                continue
            row[col] = _drop(row[col], pointer, table, col)
        return row


def _drop(value: Any, pointer: str, table: str, column: str) -> Any:
    if (table, column) == ("approvals", "comment"):  # its digest, which the decision signs
        return signed.dropped_comment(value)
    if not pointer:
        return DROPPED if _is_json(table, column) else None
    if not isinstance(value, dict | list):
        return value
    missing = object()
    if jsonpointer.resolve_pointer(value, "/" + pointer, missing) is not missing:
        jsonpointer.set_pointer(value, "/" + pointer, DROPPED)
    return value


def _is_json(table: str, column: str) -> bool:
    return isinstance(metadata.tables[f"onward.{table}"].c[column].type, JSONB)


# -- rows as JSON -------------------------------------------------------------------------------
def encode_row(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row as plain JSON: uuids and times as text, decimals as text, bytes base64."""
    return {key: _encode(value) for key, value in row.items()}


def _encode(value: Any) -> Any:
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | memoryview | bytearray):
        return base64.b64encode(bytes(value)).decode()
    return value


def decode_row(table: str, row: dict[str, Any]) -> dict[str, Any]:
    """A bundle row as the table's column types want it; refuses unknown columns."""
    columns = metadata.tables[f"onward.{table}"].c
    decoded = {}
    for key, value in row.items():
        if key not in columns:
            raise InvalidInput(f"the bundle's {table} rows have a column {key!r} this onward "
                               "does not know: import it with the onward release that wrote it "
                               "(or a newer one)")
        decoded[key] = None if value is None else _decode(columns[key].type, value)
    if table == "effects" and "recipient_mac" not in row:
        # written before migration 0047 signed recipients: the display-only text comes with
        # nothing that vouches for it, so it is left out, as --drop-field would
        decoded["recipient"] = None
    return decoded


def _decode(kind: Any, value: Any) -> Any:
    if isinstance(kind, PgUUID):
        return UUID(str(value))
    if isinstance(kind, sa.DateTime):
        return datetime.fromisoformat(str(value))
    if isinstance(kind, sa.Numeric):
        return Decimal(str(value))
    if isinstance(kind, sa.LargeBinary):
        return base64.b64decode(str(value))
    return value


# -- writing and reading ---------------------------------------------------------------------------
def bundle_mac_body(digest: str) -> dict[str, Any]:
    """What the trailer's MAC signs (ledger/signed.py's convention: the kind under "mac")."""
    return {"mac": "corpus_bundle", "digest": digest}


class BundleWriter:
    """Writes lines and keeps the running sha256 of every byte written."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.digest = hashlib.sha256()
        self.counts: dict[str, int] = {}

    def line(self, value: dict[str, Any]) -> None:
        data = json.dumps(value, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False).encode() + b"\n"
        self.digest.update(data)
        self.out.write(data)

    def rows(self, table: str, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            self.line({"t": table, "r": encode_row(row)})
            self.counts[table] = self.counts.get(table, 0) + 1

    def finish(self, keys: CheckpointKeys) -> str:
        """Write the trailer (digest and its MAC) and return the digest."""
        digest = self.digest.hexdigest()
        trailer = {"trailer": True, "digest": digest, "counts": self.counts,
                   "mac": keys.sign(bundle_mac_body(digest))}
        self.out.write(json.dumps(trailer, sort_keys=True).encode() + b"\n")
        return digest


@dataclass
class Bundle:
    """A bundle whose digest and MAC verified; its rows decoded, by table."""

    header: dict[str, Any]
    digest: str
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def run_ids(self) -> list[UUID]:
        return [row["id"] for row in self.rows.get("runs", [])]


def open_for_write(path: Path) -> IO[bytes]:
    if path.name.endswith(".gz"):
        return gzip.GzipFile(path, "wb", compresslevel=6)  # type: ignore[return-value]
    return path.open("wb")


def read_bundle(source: Path | bytes, keys: CheckpointKeys) -> Bundle:
    """Read and check a bundle: the sha256 of its content, then the MAC of that digest with
    the keys configured here; raises IntegrityViolation (nothing is loaded) otherwise."""
    lines = _lines(source)
    if len(lines) < 2:
        raise IntegrityViolation("the bundle is empty or truncated (no header and trailer)")
    digest = hashlib.sha256()
    for data in lines[:-1]:
        digest.update(data)
    trailer = _json(lines[-1], "trailer")
    if not trailer.get("trailer"):
        raise IntegrityViolation("the bundle has no trailer: it was truncated")
    if trailer.get("digest") != digest.hexdigest():
        raise IntegrityViolation(
            f"the bundle's content does not match its digest (sha256 {digest.hexdigest()[:16]}…"
            f", trailer says {str(trailer.get('digest'))[:16]}…): it was changed after export")
    _check_mac(keys, digest.hexdigest(), trailer.get("mac"))
    header = _json(lines[0], "header")
    _check_header(header)
    bundle = Bundle(header, digest.hexdigest(), {table: [] for table in TABLES})
    for number, data in enumerate(lines[1:-1], start=2):
        entry = _json(data, f"line {number}")
        table = entry.get("t")
        if table not in bundle.rows or not isinstance(entry.get("r"), dict):
            raise InvalidInput(f"bundle line {number}: not a row of a table a bundle holds")
        bundle.rows[table].append(decode_row(table, entry["r"]))
    return bundle


def _lines(source: Path | bytes) -> list[bytes]:
    data = source.read_bytes() if isinstance(source, Path) else source
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise IntegrityViolation(f"the bundle is not a readable gzip file: {exc}") from exc
    return io.BytesIO(data).readlines()


def _json(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = read_json(data)
    except ValueError as exc:
        raise InvalidInput(f"the bundle's {what} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise InvalidInput(f"the bundle's {what} is not a JSON object")
    return value


def _check_mac(keys: CheckpointKeys, digest: str, mac: Any) -> None:
    key_id = str(mac or "").rpartition(":")[0]
    if key_id and key_id not in keys.keys:
        raise IntegrityViolation(
            f"the bundle was signed with MAC key {key_id!r}, which is not configured here: set "
            "ONWARD_CHECKPOINT_KEY (and ONWARD_CHECKPOINT_KEY_ID) to the key of the ledger it "
            "came from, or list it in ONWARD_CHECKPOINT_OLD_KEYS; without it nothing in the "
            "bundle can be verified")
    try:
        keys.check(bundle_mac_body(digest), str(mac) if mac else None, "the bundle's digest")
    except IntegrityViolation as exc:
        raise IntegrityViolation(
            f"{exc}: either the bundle was rewritten by someone without the key, or the key "
            f"configured here as {key_id!r} is not the one of the ledger it came from") from exc


def _check_header(header: dict[str, Any]) -> None:
    if header.get("format") != FORMAT:
        raise InvalidInput(f"not an onward corpus bundle (format {header.get('format')!r})")
    if header.get("version") != BUNDLE_VERSION:
        raise InvalidInput(f"bundle version {header.get('version')!r}: this onward reads "
                           f"version {BUNDLE_VERSION}")


def iter_rows(bundle: Bundle, table: str) -> Iterator[dict[str, Any]]:
    yield from bundle.rows.get(table, [])
