"""canonical_json refuses what the ledger cannot keep, with a message: NUL characters
(PostgreSQL stores none in jsonb or text) and nesting deeper than a limit, or deeper than
Python can encode (an InvalidInput, never a RecursionError)."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.checkpoints import canonical_json
from ledger.exceptions import InvalidInput


def _nested(depth: int, leaf: Any = "leaf") -> Any:
    value = leaf
    for _ in range(depth):
        value = {"down": value}
    return value


@pytest.mark.parametrize(("value", "where"), [
    ({"text": "a\x00b"}, "$.text"),
    ({"items": [1, {"k": "\x00"}]}, "$.items[1].k"),
    ({"ke\x00y": 1}, "(a key)"),
    ({"price": 1.5, "note": "\x00"}, "$.note"),  # the rfc8785 path (a float)
])
def test_canonical_json__refuses_a_nul_character_and_says_where(value: Any, where: str) -> None:
    """A NUL character anywhere, in a value or a key, on either encoding path, is refused
    with its place."""
    with pytest.raises(InvalidInput, match="NUL") as raised:
        canonical_json(value)
    assert where in str(raised.value)


def test_canonical_json__a_backslash_and_u0000_as_text_is_not_a_nul() -> None:
    """The six characters \\u0000 written in a string are text, not a NUL: accepted."""
    assert canonical_json({"t": "\\u0000"}) == b'{"t":"\\\\u0000"}'


@pytest.mark.parametrize("leaf", ["leaf", 1.5])
def test_canonical_json__max_depth_counts_objects_and_arrays(leaf: Any) -> None:
    """A value nested exactly max_depth deep is accepted, one level more refused, naming the
    setting; on both encoding paths (a float leaf takes the rfc8785 one)."""
    canonical_json(_nested(8, leaf), max_depth=8)
    with pytest.raises(InvalidInput, match="ONWARD_MAX_JSON_DEPTH"):
        canonical_json(_nested(9, leaf), max_depth=8)
    with pytest.raises(InvalidInput, match="ONWARD_MAX_JSON_DEPTH"):
        canonical_json([[[["x"]]]], max_depth=3)


def test_canonical_json__nesting_deeper_than_python_can_encode_is_invalid_input() -> None:
    """Without a limit, a value nested 100,000 deep is refused as InvalidInput (before, a
    RecursionError escaped)."""
    with pytest.raises(InvalidInput, match="nests too deeply"):
        canonical_json(_nested(100_000))
