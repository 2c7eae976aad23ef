"""JSON from outside onward (ledger/json_input.py): what ``json.loads`` reads but onward
cannot store or sign is refused with a ValueError that says what and where, and the files
an operator names (a corpus bundle, an anchor) are refused, not a traceback, when a line
nests past the parser."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime

import pytest

from ledger.anchor import decode, encode
from ledger.bundle import read_bundle
from ledger.checkpoints import CheckpointKeys
from ledger.exceptions import AnchorRefused, InvalidInput
from ledger.json_input import NotPlainJson, read_json
from tasks.llm import parse_arguments

KEYS = CheckpointKeys(current="k", keys={"k": b"key"})
DEEP = "[" * 100_000 + "]" * 100_000

# each value json.loads reads, and the words read_json refuses it with
NOT_PLAIN = {
    "nested": (DEEP, "nests objects and arrays too deeply to parse"),
    "nan": ('{"n": NaN}', "holds NaN, which is not JSON"),
    "infinity": ('[-Infinity]', "holds -Infinity, which is not JSON"),
    "overflowing_float": ('{"n": 1e400}', "holds 1e400, a number too large to be finite"),
    "nul": ('{"a": {"b": ["x\\u0000"]}}', "NUL character (\\u0000) at $.a.b[0]"),
    "nul_in_a_key": ('{"k\\u0000": 1}', "NUL character (\\u0000) at $: a key"),
    "lone_surrogate": ('{"s": "\\udc80"}', "lone surrogate (\\udc80) at $.s"),
    "lone_surrogate_in_the_text": ('["\udcff"]', "lone surrogate (\\udcff) at $[0]"),
    "giant_integer": ("1" + "0" * 5000, "an integer of thousands of digits"),
}


@pytest.mark.parametrize("case", NOT_PLAIN)
def test_read_json__refuses_what_onward_cannot_store(case: str) -> None:
    text, said = NOT_PLAIN[case]
    with pytest.raises(NotPlainJson) as refused:
        read_json(text)
    assert said in str(refused.value)
    assert isinstance(refused.value, ValueError)  # refused wherever bad JSON is
    str(refused.value).encode()  # the message itself is printable text
    with pytest.raises(NotPlainJson):
        read_json(text.encode("utf-8", "surrogatepass"))


def test_read_json__reads_plain_json_as_json_loads_does() -> None:
    text = ('{"emoji": "\\ud83d\\ude00", "tab": "\\t", "n": -1.5e300, "big": '
            '123456789012345678901234567890, "deep": ' + "[" * 200 + "]" * 200 + "}")
    assert read_json(text) == read_json(text.encode()) == __import__("json").loads(text)
    with pytest.raises(ValueError) as bad:
        read_json("{not json")
    assert not isinstance(bad.value, NotPlainJson)


def test_parse_arguments__a_models_arguments_that_are_not_plain_json_are_kept_as_text() -> None:
    """A tool call's arguments nesting past the parser, or holding NaN, are kept as the raw
    text the model sent (as any arguments that are not JSON), not a RecursionError in the
    step or a NaN the ledger refuses to record."""
    for raw in (DEEP, '{"n": NaN}'):
        assert parse_arguments(raw) == {"arguments": {}, "arguments_raw": raw}


def test_read_bundle__a_line_nested_past_the_parser_is_refused() -> None:
    """A bundle an operator names (onward corpus import) whose trailer nests past the
    parser is refused as not JSON, not a RecursionError traceback."""
    with pytest.raises(InvalidInput, match="nests objects and arrays too deeply"):
        read_bundle(b'{"header": true}\n' + DEEP.encode() + b"\n", KEYS)


def test_anchor_decode__a_line_nested_past_the_parser_is_refused() -> None:
    """An anchor file (onward verify --anchor) whose header or a head line nests past the
    parser is refused (AnchorRefused), not a RecursionError traceback."""
    _, data = encode(KEYS, datetime(2026, 12, 1, tzinfo=UTC), [])
    header = gzip.decompress(data).split(b"\n")[0]
    for lines in ([DEEP.encode()], [header, DEEP.encode()]):
        with pytest.raises(AnchorRefused):
            decode(KEYS, "a", gzip.compress(b"\n".join(lines)))
