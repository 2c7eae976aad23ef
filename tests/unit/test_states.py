"""Checkpoint deltas (ledger/states.py): a delta turns the parent's state into the new one,
checked against the ``jsonpatch`` library; applying one leaves the parent's state as it was;
the snapshot rule keeps storage linear for a state that grows every step."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import states
from ledger.checkpoints import canonical_json
from ledger.exceptions import IntegrityViolation

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10),
                     st.sampled_from(["", "a", "b/c", "~x", "-"]))
_json = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.sampled_from(["a", "b", "c/d", "~", "-", "0"]), inner, max_size=4)),
    max_leaves=20)
_states = st.dictionaries(st.sampled_from(["x", "y", "messages", "a/b"]), _json, max_size=4)


@settings(max_examples=300, deadline=None)
@given(_states, _states)
def test_diff__is_a_patch_jsonpatch_applies_and_apply_agrees(old: Any, new: Any) -> None:
    """Invariant: diff(old, new) applied to old gives new exactly (JSON types included), by
    jsonpatch and by states.apply; old itself is unchanged."""
    before = copy.deepcopy(old)
    delta = states.diff(old, new)
    assert canonical_json(jsonpatch.apply_patch(copy.deepcopy(old), delta)) == canonical_json(new)
    rebuilt = states.apply(old, delta)
    assert states._same(rebuilt, new)
    assert states._same(old, before)


@settings(max_examples=200, deadline=None)
@given(st.lists(_states, min_size=1, max_size=5))
def test_rebuild__a_chain_gives_what_applying_each_delta_gives(chain: list[Any]) -> None:
    """Invariant: rebuilding a chain (which changes in place the containers it copied
    itself) ends at the chain's last state exactly, leaves the snapshot and the deltas as
    they were, and its digest is the one ``chain_states`` gives the last row."""
    base = chain[0]
    deltas = [states.diff(a, b) for a, b in itertools.pairwise(chain)]
    before = copy.deepcopy((base, deltas))
    rebuilt, digest = states.rebuild(base, deltas)
    assert states._same(rebuilt, chain[-1])
    assert states._same(base, before[0]) and states._same(deltas, before[1])
    rows = [{"seq": 0, "state": base, "state_delta": None}] + [
        {"seq": i + 1, "state": None, "state_delta": d} for i, d in enumerate(deltas)]
    assert digest == states.chain_states(rows, {})[-1]["state_chain"]


def test_rebuild__copies_a_growing_list_once_per_chain_not_once_per_delta() -> None:
    """A chain of appends copies the list it grows once (then appends in place), where
    path copying alone copied it for every delta: a restore at the end of a chain of N
    appends to a list of L items cost N times L. ``apply`` without ``owned`` still copies."""
    base = {"messages": [{"text": "m"}] * 100, "n": 0}
    owned: dict[int, Any] = {}
    first = states.apply(base, [{"op": "add", "path": "/messages/-", "value": {"text": "a"}}],
                         owned=owned)
    second = states.apply(first, [{"op": "add", "path": "/messages/-", "value": {"text": "b"}},
                                  {"op": "replace", "path": "/n", "value": 2}], owned=owned)
    assert second is first and second["messages"] is first["messages"]
    assert second["messages"][-2:] == [{"text": "a"}, {"text": "b"}] and second["n"] == 2
    assert len(base["messages"]) == 100 and base["n"] == 0
    plain = states.apply(second, [{"op": "remove", "path": "/messages/0"}])
    assert plain is not second and plain["messages"] is not second["messages"]
    assert len(second["messages"]) == 102


def test_diff__json_types_differ_where_python_equality_does_not() -> None:
    assert states.diff({"a": 1}, {"a": True}) == [{"op": "replace", "path": "/a", "value": True}]
    assert states.diff({"a": [1]}, {"a": [1.0]}) == [
        {"op": "replace", "path": "/a/0", "value": 1.0}]


def test_diff__a_grown_list_gains_appends_only() -> None:
    old = {"messages": [{"text": "a" * 100}] * 3}
    new = {"messages": old["messages"] + [{"text": "b"}]}
    assert states.diff(old, new) == [{"op": "add", "path": "/messages/-", "value": {"text": "b"}}]


@pytest.mark.parametrize("delta", [
    {"op": "add"}, [{"op": "move", "from": "/a", "path": "/b"}], [{"op": "remove", "path": "/z"}],
    [{"op": "replace", "path": "/a/7", "value": 1}], [{"path": "/a"}], [{"op": "add", "path": "a"}],
])
def test_apply__a_patch_that_does_not_apply_is_an_integrity_violation(delta: Any) -> None:
    with pytest.raises(IntegrityViolation):
        states.apply({"a": [1]}, delta)


def _stored_bytes(steps: int, every: int) -> tuple[int, int, int]:
    """Grow a state by one 200-byte message per step; return (stored bytes, content bytes,
    longest chain in rows)."""
    state: dict[str, Any] = {"messages": []}
    snapshot_seq, chain_bytes, stored, longest = 0, 0, 0, 0
    for seq in range(1, steps + 1):
        new = {"messages": [*state["messages"], {"seq": seq, "text": "m" * 200}]}
        size = len(canonical_json(new))
        how = states.store_as(state, new, size, snapshot_seq=snapshot_seq,
                              chain_bytes=chain_bytes, seq=seq, snapshot_every=every)
        if how.is_delta:
            stored += len(canonical_json(how.delta))
            chain_bytes = how.chain_bytes or 0
        else:
            stored += size
            snapshot_seq, chain_bytes = seq, 0
        longest = max(longest, seq - snapshot_seq)
        state = new
    return stored, len(canonical_json(state)), longest


def test_store_as__a_growing_state_stores_about_twice_its_content() -> None:
    """Invariant: storage stays linear in content (at most 3 times) for a state gaining a
    message per step, while every state is in full with snapshot_every=1."""
    stored, content, longest = _stored_bytes(1000, 16)
    assert stored <= 3 * content
    assert longest < 1000
    full, _, _ = _stored_bytes(100, 1)
    assert full > 40 * _stored_bytes(100, 1)[1]


def test_store_as__a_state_of_steady_size_snapshots_every_n_steps() -> None:
    state: dict[str, Any] = {"counter": 0, "notes": "n" * 50}
    snapshot_seq, chain_bytes, snapshots = 0, 0, []
    for seq in range(1, 65):
        new = {**state, "counter": seq}
        how = states.store_as(state, new, len(canonical_json(new)), snapshot_seq=snapshot_seq,
                              chain_bytes=chain_bytes, seq=seq, snapshot_every=16)
        if how.is_delta:
            chain_bytes = how.chain_bytes or 0
        else:
            snapshots.append(seq)
            snapshot_seq, chain_bytes = seq, 0
        state = new
    assert snapshots == [16, 32, 48, 64]


def test_chain_states__rebuilds_each_row_and_names_a_broken_chain() -> None:
    s0 = {"m": []}
    s1 = {"m": [1]}
    s2 = {"m": [1, 2]}
    rows = [{"seq": 0, "state": s0, "state_delta": None},
            {"seq": 1, "state": None, "state_delta": states.diff(s0, s1)},
            {"seq": 2, "state": None, "state_delta": states.diff(s1, s2)}]
    out = states.chain_states(rows, {})
    assert [r["state"] for r in out] == [s0, s1, s2]
    broken = states.chain_states([rows[0], rows[2]], {})
    assert broken[1]["state"] is None and "missing" in broken[1]["state_problem"]


def test_chain_states__each_delta_gets_the_digest_of_its_chain() -> None:
    """A delta row's ``state_chain`` (what an envelope 3 checkpoint signs) is the digest of
    its snapshot's canonical JSON and the deltas since, in order: a snapshot edited, a delta
    edited (even into one that rebuilds the same state at the end), or the deltas swapped
    give another digest; the digest of a chain from an artifact snapshot is the same as
    from the same state inline; ``rebuild`` (the claim's path) agrees with ``chain_states``."""
    s0, s1, s2 = {"m": [], "n": 0}, {"m": [1], "n": 1}, {"m": [1, 2], "n": 2}
    d1, d2 = states.diff(s0, s1), states.diff(s1, s2)
    rows = [{"seq": 0, "state": s0, "state_delta": None},
            {"seq": 1, "state": None, "state_delta": d1},
            {"seq": 2, "state": None, "state_delta": d2}]
    out = states.chain_states(rows, {})
    first = states.chain_digest(states.sha256_hex(canonical_json(s0)), d1)
    assert [r["state_chain"] for r in out] == [None, first, states.chain_digest(first, d2)]
    assert states.rebuild(s0, [d1, d2]) == (s2, out[2]["state_chain"])
    assert states.rebuild(s0, []) == (s0, None)
    body = canonical_json(s0)
    ref = {"$artifact": {"sha256": states.sha256_hex(body), "size": len(body)}}
    assert states.rebuild(ref, [d1, d2], artifact_body=body) == (s2, out[2]["state_chain"])
    snapshot_edited = states.chain_states(
        [{**rows[0], "state": {"m": [], "n": 5}}, rows[1], rows[2]], {})
    assert snapshot_edited[2]["state_chain"] != out[2]["state_chain"]
    same_end = [{"op": "replace", "path": "/n", "value": 7}, *d1[:1]]  # n is set again by d2
    delta_edited = states.chain_states([rows[0], {**rows[1], "state_delta": same_end}, rows[2]],
                                       {})
    assert delta_edited[2]["state"] == s2
    assert delta_edited[2]["state_chain"] != out[2]["state_chain"]
    swapped = states.rebuild(s0, [[{"op": "replace", "path": "/n", "value": 1}], d1])
    assert swapped[1] != states.rebuild(s0, [d1, [{"op": "replace", "path": "/n", "value": 1}]])[1]


def test_parse_json__reads_what_json_loads_reads() -> None:
    """The artifact parser (pydantic's) gives what ``json.loads`` gives for canonical JSON
    of every kind of value; ``copy_json`` copies every container and shares none."""
    import json

    value = {"s": "é\u2028\"\\/\t", "i": [0, -1, 2**53 - 1, 10**30], "f": [0.5, 1e-7, 1.5e300],
             "b": [True, False, None], "nested": [{"a": [[]]}, {}], "emoji": "\U0001F600"}
    body = json.dumps(value, sort_keys=True).encode()  # 10**30 is past what canonical takes
    assert states.parse_json(body) == json.loads(body)
    assert states.parse_json(canonical_json(value["nested"])) == value["nested"]
    with pytest.raises(IntegrityViolation):
        states.parse_json(b'{"a": NaN}')
    copied = states.copy_json(value)
    assert copied == value and copied is not value
    assert copied["nested"][0]["a"] is not value["nested"][0]["a"]


def test_parse_json__reads_a_state_nested_as_deep_as_the_settings_allow() -> None:
    """pydantic's parser stops at 200 levels; ONWARD_MAX_JSON_DEPTH allows up to 500, and a
    large state that deep is stored as an artifact, which a restore must read (it parked
    integrity: 'a stored state is not JSON'). Not JSON is still refused at any depth."""
    deep: Any = [1.5]
    for _ in range(450):
        deep = [deep]
    value = {"deep": deep, "pad": "p" * 70_000}
    body = canonical_json(value, max_depth=500)
    assert states.parse_json(body) == value
    with pytest.raises(IntegrityViolation):
        states.parse_json(body.replace(b"1.5", b"NaN"))
    with pytest.raises(IntegrityViolation):
        states.parse_json(body[:-1])
