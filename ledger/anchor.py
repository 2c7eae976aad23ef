"""An anchor: every run's head at one moment, signed, to be kept outside the ledger.

The keys make an edit of the database detectable, but not a restore of a whole older copy
of it: that history really was signed. An anchor remembers where every run was, so a later
look finds runs that moved backwards (docs/guarantees.md, "Rollback of the whole database").

The file is gzip'd JSON lines. The first line is the header and its MAC::

    {"anchor": {"format": "onward-anchor/1", "taken_at": …, "taken_at_us": …, "runs": N,
                "root": …, "not_anchored": K, "previous": …, "accepted": A},
     "mac": "k1:…"}

then one line per run, sorted by run id: ``[run_id, tenant_id, seq, head_hash]``. ``root``
is the RFC 6962 Merkle tree hash (SHA-256) over those lines' canonical JSON, so the header's
MAC covers every line; the lines themselves say which runs moved. An anchor needs only each
run's head (its id, seq and head hash), so it does not care how payloads are stored.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import itertools
import json
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from ledger import signed
from ledger.checkpoints import CheckpointKeys, canonical_json
from ledger.exceptions import AnchorRefused, IntegrityViolation, InvalidInput
from ledger.json_input import read_json

__all__ = ["FORMAT", "Anchor", "Head", "decode", "encode", "merkle_root"]


FORMAT = "onward-anchor/1"


@dataclass(frozen=True)
class Head:
    """Where one run was: what an anchor keeps of it."""

    run_id: UUID
    tenant_id: str
    seq: int
    head_hash: str

    def line(self) -> bytes:
        """The head's line in the file: RFC 8785 canonical JSON of a list of strings and an
        int, which ``json.dumps`` writes exactly so (tests/unit/test_anchor.py checks it)."""
        return _LINE.encode([str(self.run_id), self.tenant_id, self.seq,
                             self.head_hash]).encode()


_LINE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Anchor:
    """A verified anchor."""

    name: str
    taken_at: datetime
    root: str
    heads: list[Head]
    not_anchored: int  # heads whose MAC did not verify when it was taken (left out)
    previous: str | None  # the anchor it was compared with before it was written
    accepted: int  # problems found in that comparison and accepted by an operator


def merkle_root(leaves: Iterable[bytes]) -> str:
    """RFC 6962's Merkle tree hash: leaves hashed with a 0x00 prefix, nodes with 0x01, the
    last node of an odd level carried up; the hash of nothing for no leaves."""
    level = [hashlib.sha256(b"\x00" + leaf).digest() for leaf in leaves]
    if not level:
        return hashlib.sha256(b"").hexdigest()
    while len(level) > 1:
        paired = [hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest()
                  for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0].hex()


def encode(keys: CheckpointKeys, taken_at: datetime, heads: Sequence[Head], *,
           not_anchored: int = 0, previous: str | None = None,
           accepted: int = 0) -> tuple[str, bytes]:
    """The signed anchor of ``heads`` (sorted by run id), as (root, file bytes)."""
    lines = [head.line() for head in heads]
    root = merkle_root(lines)
    header = {"format": FORMAT, "taken_at": taken_at.isoformat(),
              "taken_at_us": signed.micros(taken_at), "runs": len(lines), "root": root,
              "not_anchored": not_anchored, "previous": previous, "accepted": accepted}
    first = canonical_json({"anchor": header, "mac": keys.sign(signed.anchor(header))})
    body = io.BytesIO()
    with gzip.GzipFile(fileobj=body, mode="wb", compresslevel=6, mtime=0) as out:
        out.write(first + b"\n")
        out.write(b"\n".join(lines))
        out.write(b"\n" if lines else b"")
    return root, body.getvalue()


def decode(keys: CheckpointKeys, name: str, data: bytes) -> Anchor:
    """The anchor in ``data``; raises AnchorRefused unless it is whole and its MAC, root and
    order verify (an edited, truncated or foreign file)."""
    try:
        text = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:
        raise _refused(name, f"it is not a whole gzip file ({exc})") from None
    first, *rest = text.split(b"\n")
    header = _header(keys, name, first)
    lines = rest[:-1] if rest and rest[-1] == b"" else rest
    if len(lines) != header["runs"]:
        raise _refused(name, f"it holds {len(lines)} runs, its header says {header['runs']}")
    if merkle_root(lines) != header["root"]:
        raise _refused(name, "its runs do not hash to the root its MAC covers (a line was "
                             "edited, added or removed)")
    heads = [_head(name, number, line) for number, line in enumerate(lines, start=2)]
    for before, after in itertools.pairwise(heads):
        if before.run_id >= after.run_id:
            raise _refused(name, f"run {after.run_id} is out of order")
    return Anchor(name, datetime.fromisoformat(header["taken_at"]), header["root"], heads,
                  header["not_anchored"], header["previous"], header["accepted"])


_HEADER_TYPES: dict[str, type | tuple[type, ...]] = {
    "format": str, "taken_at": str, "taken_at_us": int, "runs": int, "root": str,
    "not_anchored": int, "previous": (str, type(None)), "accepted": int}


def _header(keys: CheckpointKeys, name: str, first: bytes) -> dict[str, Any]:
    try:
        found = read_json(first)
        header, mac = found["anchor"], found["mac"]
    except (ValueError, TypeError, KeyError):
        raise _refused(name, "its first line is not an anchor's header") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise _refused(name, f"its header is not {FORMAT}")
    if set(header) != set(_HEADER_TYPES) or any(
            not isinstance(header[key], kind) or isinstance(header[key], bool)
            for key, kind in _HEADER_TYPES.items()):
        raise _refused(name, "its header does not have the fields of an anchor")
    try:
        keys.check(signed.anchor(header), mac if isinstance(mac, str) else None,
                   "its header")
        taken_at = datetime.fromisoformat(header["taken_at"])
    except (IntegrityViolation, InvalidInput, ValueError) as exc:
        raise _refused(name, str(exc)) from None
    if taken_at.tzinfo is None or signed.micros(taken_at) != header["taken_at_us"]:
        raise _refused(name, "its time is not the time its MAC covers")
    return header


def _head(name: str, number: int, line: bytes) -> Head:
    try:
        run_id, tenant_id, seq, head_hash = read_json(line)
        head = Head(UUID(run_id), tenant_id, seq, head_hash)
    except (ValueError, TypeError, AttributeError):
        raise _refused(name, f"line {number} is not a run's head") from None
    if not (isinstance(tenant_id, str) and type(seq) is int and isinstance(head_hash, str)
            and head.line() == line):
        raise _refused(name, f"line {number} is not a run's head in canonical form")
    return head


def _refused(name: str, why: str) -> AnchorRefused:
    return AnchorRefused(
        f"anchor {name} does not verify: {why}. It was edited, damaged or written with "
        "another key: compare with an earlier anchor (onward verify --anchor PATH) and find "
        "out who could write to the anchor location")
