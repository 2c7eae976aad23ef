"""Checkpoint MACs: any edit to any covered field changes the MAC; verify_checkpoint catches it."""

from __future__ import annotations

import dataclasses
from typing import Any
from uuid import UUID

import pytest
import rfc8785
from hypothesis import given
from hypothesis import strategies as st

from ledger.checkpoints import CheckpointBody, CheckpointKeys, canonical_json, verify_checkpoint
from ledger.exceptions import IntegrityViolation, InvalidInput

KEYS = CheckpointKeys(current="k1", keys={"k1": b"unit-test-key", "k0": b"older-key"})

names = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
safe_ints = st.integers(-(2**53) + 1, 2**53 - 1)  # RFC 8785: integers exact as doubles
# No NUL character: canonical_json refuses it (PostgreSQL cannot store it; see below).
json_scalars = (st.none() | st.booleans() | safe_ints
                | st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=8,
)
states = st.dictionaries(names, json_values, max_size=4)
bodies = st.builds(
    CheckpointBody,
    run_id=st.uuids(),
    seq=st.integers(0, 10_000),
    parent_hash=st.none() | st.text("0123456789abcdef", min_size=64, max_size=64),
    step=st.none() | names,
    next_step=st.none() | names,
    outcome=st.sampled_from(["start", "goto", "finish", "fail"]),
    state=states,
    workflow_version=st.none() | st.integers(1, 1000),
)


def _changed(body: CheckpointBody, field: str, data: st.DataObject) -> CheckpointBody:
    """The same body with ``field`` set to a different value."""
    current = getattr(body, field)
    alternatives: dict[str, st.SearchStrategy[Any]] = {
        "run_id": st.uuids(),
        "seq": st.integers(0, 10_000),
        "parent_hash": st.none() | st.text("0123456789abcdef", min_size=64, max_size=64),
        "step": st.none() | names,
        "next_step": st.none() | names,
        "outcome": st.sampled_from(["start", "goto", "finish", "fail"]),
        "state": states,
        "workflow_version": st.none() | st.integers(1, 1000),
        "control": st.none() | st.fixed_dictionaries({"kind": st.sampled_from(["timer", "signal"]),
                                                      "then": names}),
        "state_schema_version": st.none() | st.integers(1, 50),
        "refs": st.none() | st.dictionaries(names, json_values, min_size=1, max_size=3),
        "workflow": st.none() | names,
        "envelope_version": st.sampled_from([1, 2]),
    }
    # A field added later without an entry above still gets changed (to other JSON), so the
    # property keeps covering every field of the envelope.
    strategy = alternatives.get(field, st.none() | json_values)
    value = data.draw(strategy.filter(lambda v: v != current), label=field)
    return dataclasses.replace(body, **{field: value})


FIELDS = [f.name for f in dataclasses.fields(CheckpointBody)]


@given(body=bodies, field=st.sampled_from(FIELDS), data=st.data())
def test_checkpoint_mac__changes_when_any_field_changes(body: CheckpointBody, field: str,
                                                        data: st.DataObject) -> None:
    """Every field of the envelope is covered: changing one changes the MAC, and verify_checkpoint()
    refuses the edited body against the original MAC."""
    edited = _changed(body, field, data)
    original_mac = KEYS.mac(body.as_dict())
    assert KEYS.mac(edited.as_dict()) != original_mac
    with pytest.raises(IntegrityViolation, match="does not match its MAC"):
        verify_checkpoint(KEYS, edited, original_mac, "k1", head_hash=original_mac)
    verify_checkpoint(KEYS, body, original_mac, "k1", head_hash=original_mac)


def test_checkpoint_mac__covers_every_dataclass_field() -> None:
    """A field added to CheckpointBody but left out of as_dict() would not be protected."""
    body = CheckpointBody(UUID(int=1), 1, None, "a", "b", "goto", {}, 1)
    assert set(FIELDS) <= set(body.as_dict())


@given(body=bodies)
def test_checkpoint_mac__depends_on_the_key(body: CheckpointBody) -> None:
    """A database-level edit cannot recompute the MAC without the server's secret: another
    key (or another key id) gives another MAC."""
    other = CheckpointKeys(current="k1", keys={"k1": b"attacker-guess"})
    assert KEYS.mac(body.as_dict()) != other.mac(body.as_dict())
    assert KEYS.mac(body.as_dict(), "k0") != KEYS.mac(body.as_dict(), "k1")


@given(state=states)
def test_checkpoint_mac__ignores_key_order(state: dict[str, Any]) -> None:
    """The MAC is over canonical JSON: the order PostgreSQL's JSONB returns keys in does not
    matter."""
    reordered = dict(reversed(list(state.items())))
    first = CheckpointBody(UUID(int=7), 3, None, "s", None, "finish", state, 2)
    second = dataclasses.replace(first, state=reordered)
    assert KEYS.mac(first.as_dict()) == KEYS.mac(second.as_dict())


def test_checkpoint_verify__head_mismatch_is_reported() -> None:
    """A checkpoint that verifies alone but is not the run's head means history was
    rewritten or truncated."""
    body = CheckpointBody(UUID(int=2), 4, "ab" * 32, "s", "t", "goto", {"n": 1}, 1)
    mac = KEYS.mac(body.as_dict())
    with pytest.raises(IntegrityViolation, match="not the run's recorded head"):
        verify_checkpoint(KEYS, body, mac, "k1", head_hash="0" * 64)


def test_checkpoint_verify__unknown_key_id_is_an_integrity_error() -> None:
    """A checkpoint signed with a key id this process does not have cannot be trusted."""
    body = CheckpointBody(UUID(int=3), 0, None, None, None, "start", {}, None)
    mac = KEYS.mac(body.as_dict())
    with pytest.raises(IntegrityViolation, match="'k9' is not configured"):
        verify_checkpoint(KEYS, body, mac, "k9", head_hash=mac)


@pytest.mark.parametrize("value", [{"x": float("nan")}, {"x": object()}, {1: "int key"},
                                   {"x": b"bytes"}])
def test_canonical_json__refuses_what_is_not_plain_json(value: Any) -> None:
    """Only plain JSON can be hashed, stored and compared; anything else is InvalidInput."""
    with pytest.raises(InvalidInput, match="not plain JSON"):
        canonical_json(value)


any_json = st.recursive(
    st.none() | st.booleans() | st.text()
    | st.integers(min_value=-(2**54), max_value=2**54)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30)


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    return isinstance(value, list) and any(_holds_nul(v) for v in value)


def _rfc8785_or_error(value: Any) -> bytes | type[Exception]:
    """What rfc8785 writes, or refuses; onward also refuses a NUL character anywhere (which
    PostgreSQL cannot store), on either path."""
    try:
        written = rfc8785.dumps(value)
    except Exception:
        return InvalidInput
    return InvalidInput if _holds_nul(value) else written


def _ours_or_error(value: Any) -> bytes | type[Exception]:
    try:
        return canonical_json(value)
    except InvalidInput:
        return InvalidInput


@given(value=any_json)
def test_canonical_json__same_bytes_as_rfc8785(value: Any) -> None:
    """The json.dumps fast path writes exactly what the rfc8785 package writes, for any JSON
    value (any Unicode text and keys, floats, integers past the I-JSON range), or refuses
    exactly what it refuses: a MAC written by one path verifies on the other."""
    assert _ours_or_error(value) == _rfc8785_or_error(value)


@pytest.mark.parametrize("value", [
    {"ctl": "\x00\x01\x08\x09\x0a\x0c\x0d\x1f\x7f", "quote": "\"\\/", "seps": "\u2028\u2029"},
    {"ctl": "\x01\x08\x09\x0a\x0c\x0d\x1f\x7f", "quote": "\"\\/", "seps": "\u2028\u2029"},
    {"\ue000": 1, "\U0001f600": 2, "a": 3},  # UTF-16 order differs from code point order
    {"n": [2**53 - 1, -(2**53) + 1, 0, True, False, None]},
    {"big": 2**53}, {"lone": "\ud800"}, {"f": 1.0}, {"e": 1e21},
])
def test_canonical_json__edge_cases_match_rfc8785(value: Any) -> None:
    """Escapes, key order outside the BMP, the I-JSON integer bounds, lone surrogates and
    ECMAScript number formatting come out as rfc8785 writes them (or are refused alike)."""
    assert _ours_or_error(value) == _rfc8785_or_error(value)


_FLOAT_EDGES = [0.0, -0.0, 1.0, -3.0, 0.5, 0.1 + 0.2, 1e-4, 9.999999999999999e-05, 1.5e-4,
                1e-5, 1e-7, 5e-324, 1e15 + 0.5, 9999999999999998.0, 1e16, 1e16 + 2.0, 1e20, 1e21,
                float(2**53 - 1), float(2**53), -float(2**53 - 1), 2.0**60, 123456.789, -0.001,
                1.7976931348623157e308]


@pytest.mark.parametrize("number", _FLOAT_EDGES)
def test_canonical_json__floats_match_rfc8785(number: float) -> None:
    """Floats at the edges of the fast path (plain notation from 1e-4 to 1e16, whole
    numbers up to 2**53 written as integers, -0.0 as 0) are written as rfc8785 writes them."""
    assert _ours_or_error({"x": number, "l": [number]}) == _rfc8785_or_error({"x": number,
                                                                            "l": [number]})


@given(number=st.floats(allow_nan=False, allow_infinity=False))
def test_canonical_json__any_float_matches_rfc8785(number: float) -> None:
    assert _ours_or_error([number]) == _rfc8785_or_error([number])


def test_canonical_json__everyday_floats_take_the_fast_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint's refs carry the run's spend as a float (0.0 mostly): writing it must
    not fall back to the pure-Python rfc8785 encoder, which cost a step more CPU than
    everything else in its MAC. The value is left as it was (the fast path copies)."""
    def refused(_value: Any) -> bytes:
        raise AssertionError("rfc8785 path taken")

    monkeypatch.setattr(rfc8785, "dumps", refused)
    value = {"spent": {"attempts": 3, "tokens": 10, "cost_usd": 0.0}, "p": [0.25, 2.0]}
    assert canonical_json(value) == (b'{"p":[0.25,2],"spent":{"attempts":3,"cost_usd":0,'
                                     b'"tokens":10}}')
    assert value["spent"]["cost_usd"] == 0.0 and isinstance(value["p"][1], float)


def test_checkpoint_envelope__version_1_still_verifies_and_cannot_be_claimed() -> None:
    """Checkpoints written before envelope 2 (no workflow in the MAC'd body) still verify
    as version 1; a version 2 checkpoint relabelled as version 1 (to drop its workflow from
    the MAC) does not; a version this code does not know is refused, not guessed."""
    old = CheckpointBody(UUID(int=4), 2, None, "s", "t", "goto", {}, 1, envelope_version=1)
    assert "workflow" not in old.as_dict()
    mac = KEYS.mac(old.as_dict())
    verify_checkpoint(KEYS, dataclasses.replace(old, workflow="anything"), mac, "k1", head_hash=mac)
    new = dataclasses.replace(old, envelope_version=2, workflow="offers")
    new_mac = KEYS.mac(new.as_dict())
    with pytest.raises(IntegrityViolation, match="does not match its MAC"):
        verify_checkpoint(KEYS, dataclasses.replace(new, envelope_version=1), new_mac, "k1",
               head_hash=new_mac)
    with pytest.raises(IntegrityViolation, match="envelope version 4"):
        verify_checkpoint(KEYS, dataclasses.replace(new, envelope_version=4), new_mac, "k1",
               head_hash=new_mac)


def test_checkpoint_envelope__a_version_3_delta_signs_its_chain_digest() -> None:
    """Envelope 3: a delta checkpoint (``state_chain`` set) signs its chain digest in place
    of the reconstructed state, which it then need not write out again to be checked; a
    snapshot signs its state as before. Another chain digest, a delta relabelled as a
    snapshot or as envelope 2 (to sign a state instead) fails the MAC; an envelope 2 delta
    (no chain digest) still signs its whole state and verifies so."""
    state = {"notes": ["a", "b"]}
    delta = CheckpointBody(UUID(int=5), 3, "ab" * 32, "s", "t", "goto", state, 1,
                           workflow="w", state_chain="cd" * 32)
    assert delta.as_dict()["state"] is None and delta.as_dict()["state_chain"] == "cd" * 32
    mac = KEYS.mac(delta.as_dict())
    verify_checkpoint(KEYS, dataclasses.replace(delta, state={"other": 1}), mac, "k1",
                      head_hash=mac)  # the state is bound through the digest, not itself
    for forged in (dataclasses.replace(delta, state_chain="ce" * 32),
                   dataclasses.replace(delta, state_chain=None),
                   dataclasses.replace(delta, envelope_version=2)):
        with pytest.raises(IntegrityViolation, match="does not match its MAC"):
            verify_checkpoint(KEYS, forged, mac, "k1", head_hash=mac)
    snapshot = dataclasses.replace(delta, state_chain=None)
    assert snapshot.as_dict()["state"] == state and snapshot.as_dict()["state_chain"] is None
    old = dataclasses.replace(delta, envelope_version=2, state_chain=None)
    old_mac = KEYS.mac(old.as_dict())
    assert old.as_dict()["state"] == state and "state_chain" not in old.as_dict()
    verify_checkpoint(KEYS, dataclasses.replace(old, state_chain="cd" * 32), old_mac, "k1",
                      head_hash=old_mac)  # envelope 2 ignores a digest a reader computed
    with pytest.raises(IntegrityViolation, match="does not match its MAC"):
        verify_checkpoint(KEYS, dataclasses.replace(old, state={"notes": ["a"]}), old_mac,
                          "k1", head_hash=old_mac)
