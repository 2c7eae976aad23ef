"""The anchor file (ledger/anchor.py): its Merkle root is RFC 6962's, its lines and the head
MAC bodies it checks are the canonical JSON the keys sign, and anything but the bytes it
wrote, signed with the key, is refused."""

from __future__ import annotations

import gzip
import hashlib
from datetime import UTC, datetime
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger import signed
from ledger.anchor import Head, decode, encode, merkle_root
from ledger.anchor_store import anchor_name, taken_at_of
from ledger.anchoring import _HEAD_BODY
from ledger.checkpoints import CheckpointKeys, canonical_json
from ledger.exceptions import AnchorRefused

KEYS = CheckpointKeys(current="k2", keys={"k2": b"two", "k1": b"one"})
TAKEN = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)


def rfc6962(leaves: list[bytes]) -> bytes:
    """MTH as RFC 6962 section 2.1 defines it (recursive, split at the largest power of
    two below n)."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return hashlib.sha256(b"\x01" + rfc6962(leaves[:k]) + rfc6962(leaves[k:])).digest()


@given(st.lists(st.binary(max_size=8), max_size=40))
def test_merkle_root__is_rfc_6962(leaves: list[bytes]) -> None:
    """Invariant: the root an anchor signs is RFC 6962's Merkle tree hash, so anyone can
    recompute it (and prove one run's inclusion) with a standard implementation."""
    assert merkle_root(leaves) == rfc6962(leaves).hex()


texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                max_size=12)


@given(st.uuids(), texts, st.integers(0, 2**31 - 1), texts)
def test_head_line_and_head_mac_body__are_canonical_json(run_id: UUID, tenant: str, seq: int,
                                                         head_hash: str) -> None:
    """Invariant: the fast encoders the anchor uses write exactly the RFC 8785 bytes the keys
    sign (non-ASCII and control characters included)."""
    assert Head(run_id, tenant, seq, head_hash).line() == canonical_json(
        [str(run_id), tenant, seq, head_hash])
    body = signed.head(run_id, seq, head_hash)
    assert _HEAD_BODY.encode(body).encode() == canonical_json(body)


def heads(count: int) -> list[Head]:
    return sorted((Head(UUID(int=i * 7919 + 1), "t", i, f"{i:064x}") for i in range(count)),
                  key=lambda h: h.run_id)


def test_decode__round_trips_and_an_old_key_still_verifies() -> None:
    """Invariant: what encode writes, decode reads back as written, also after the key that
    signed it became an old key (a rotation keeps anchors verifiable)."""
    root, data = encode(KEYS, TAKEN, heads(5), previous="anchor-x", accepted=2)
    rotated = CheckpointKeys(current="k3", keys={"k3": b"three", "k2": b"two"})
    anchor = decode(rotated, "a", data)
    assert (anchor.root, anchor.heads, anchor.taken_at, anchor.previous, anchor.accepted) == (
        root, heads(5), TAKEN, "anchor-x", 2)
    with pytest.raises(AnchorRefused, match="not configured"):
        decode(CheckpointKeys(current="k9", keys={"k9": b"nine"}), "a", data)


def rewrite(data: bytes, edit: str) -> bytes:
    header, *lines = gzip.decompress(data).decode().split("\n")
    if edit == "swap":
        lines[0], lines[1] = lines[1], lines[0]
    elif edit == "spaces":
        lines[0] = lines[0].replace(",", ", ")
    elif edit == "header":
        header = header.replace('"not_anchored":0', '"not_anchored":1')
    elif edit == "extra":
        lines.insert(0, lines[0])
    return gzip.compress("\n".join([header, *lines]).encode())


@pytest.mark.parametrize("edit", ["swap", "spaces", "header", "extra"])
def test_decode__refuses_an_edited_anchor(edit: str) -> None:
    """Invariant: reordered, reformatted, added lines and an edited header are refused."""
    _, data = encode(KEYS, TAKEN, heads(4))
    with pytest.raises(AnchorRefused):
        decode(KEYS, "a", rewrite(data, edit))


def test_anchor_name__sorts_by_time_and_gives_it_back() -> None:
    """Invariant: names sort in the order anchors were taken, and carry that time."""
    later = TAKEN.replace(second=1, microsecond=0)
    assert anchor_name(TAKEN, "f" * 64) < anchor_name(later, "0" * 64)
    assert taken_at_of(anchor_name(TAKEN, "ab" * 32)) == TAKEN
