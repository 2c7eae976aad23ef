"""What retention leaves of a payload whose MAC covers the value (ledger/compacted.py): a
digest under a seal that verifies only for what it was sealed with."""

from __future__ import annotations

from ledger import compacted
from ledger.checkpoints import CheckpointKeys, canonical_json, sha256_hex

KEYS = CheckpointKeys(current="k1", keys={"k1": b"secret-one"})
WHO = {"run_id": "r", "seq": 3, "result_mac": "k1:abc"}


def test_sealed__verifies_for_its_identity_only_and_an_edit_fails() -> None:
    value = {"offer": "10% off", "n": [1, 2]}
    marker = compacted.sealed(KEYS, "run_result", WHO, value)
    assert marker["$compacted"]["sha256"] == sha256_hex(canonical_json(value))
    assert compacted.digest_of(marker) == marker["$compacted"]["sha256"]
    assert compacted.is_sealed(KEYS, "run_result", WHO, marker)
    assert not compacted.is_sealed(KEYS, "signal_payload", WHO, marker)
    assert not compacted.is_sealed(KEYS, "run_result", {**WHO, "seq": 4}, marker)
    edited = {"$compacted": {**marker["$compacted"], "sha256": "0" * 64}}
    assert not compacted.is_sealed(KEYS, "run_result", WHO, edited)
    unsealed = compacted.marker(marker["$compacted"]["sha256"])
    assert not compacted.is_sealed(KEYS, "run_result", WHO, unsealed)
    for ordinary in (value, None, "text", {"$compacted": "x"}, {"$compacted": {}, "b": 1}):
        assert not compacted.is_sealed(KEYS, "run_result", WHO, ordinary)
        assert compacted.digest_of(ordinary) is None
