"""JSON that ``json.loads`` reads but onward cannot store, and the words onward refuses it
with (ledger/json_input.py): one table for the tests of every way in that reads a person's
JSON (the CLI's options, the API's bodies)."""

from __future__ import annotations

__all__ = ["NOT_PLAIN"]

# each case: the JSON value as text, and what the refusal says
NOT_PLAIN = {
    "nested": ("[" * 100_000 + "]" * 100_000, "nests objects and arrays too deeply"),
    "nan": ("NaN", "holds NaN, which is not JSON"),
    "infinity": ("1e400", "a number too large to be finite"),
    "nul": ('"a\\u0000b"', "holds a NUL character"),
    "lone_surrogate": ('"\\ud800"', "holds a lone surrogate (\\ud800)"),
    "giant_integer": ("1" + "0" * 5000, "an integer of thousands of digits"),
}
