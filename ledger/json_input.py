"""JSON that comes from outside onward, read strictly: a person's option (``--input``,
``--payload``, ``--result``, a patch), a file an operator names (a bundle, an anchor), a
client's request body or cursor, a model's tool-call arguments.

``json.loads`` reads more than onward can store or sign: ``NaN`` and ``Infinity`` (and a
float such as ``1e400``, which it reads as infinity), a NUL character (PostgreSQL stores
none), a lone surrogate (not Unicode text: it cannot be encoded as UTF-8), and it ends with
a RecursionError on a value nested past the parser, or with Python's int-string limit on an
integer of thousands of digits, in words meant for a programmer. ``read_json`` refuses
each with a ``NotPlainJson`` (a ``ValueError``, as for any bad JSON) that says what is
wrong and where, so every caller refuses it the way it refuses bad JSON: exit 2 at the
CLI, 4xx over HTTP, never a traceback or a value that fails later, deep in a write.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ledger.exceptions import NotPlainJson

__all__ = ["NotPlainJson", "read_json", "unstorable"]


# a lone surrogate can only come from a \uXXXX escape or from a str that already holds one
# (an argument decoded with surrogateescape); a NUL only from an escape: JSON text refuses
# a raw control character. Text without either needs no walk after the parse.
_MAY_HOLD = re.compile(r"\\u|[\ud800-\udfff]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def read_json(text: str | bytes) -> Any:
    """``json.loads(text)``, refusing (``NotPlainJson``, a ``ValueError``) what onward
    cannot store: nesting past the parser, ``NaN``/``Infinity`` or a float too large to be
    finite, an integer past Python's int-string limit, a NUL character or a lone
    surrogate in a string or a key. Bad JSON raises json's own ``ValueError``."""
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_finite)
    except RecursionError:
        raise NotPlainJson("it nests objects and arrays too deeply to parse") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):
            raise NotPlainJson("it holds an integer of thousands of digits, more than onward "
                               "reads (write a long number as a string)") from None
        raise
    if isinstance(text, bytes):  # as json.loads decoded it: a lone surrogate's bytes are read
        text = text.decode(json.detect_encoding(text), "surrogatepass")
    if _MAY_HOLD.search(text):
        problem = unstorable(value)
        if problem is not None:
            raise NotPlainJson(problem)
    return value


def _constant(name: str) -> Any:
    raise NotPlainJson(f"it holds {name}, which is not JSON (no NaN or Infinity)")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise NotPlainJson(f"it holds {text[:40]}, a number too large to be finite")
    return number


def unstorable(value: Any, where: str = "$") -> str | None:
    """What in ``value`` (parsed JSON; walked without recursion, as it may nest deeply)
    onward cannot store, and where: a NUL character or a lone surrogate in a string or a
    key. None when there is nothing."""
    pending: list[tuple[Any, str]] = [(value, where)]
    while pending:
        item, place = pending.pop()
        if isinstance(item, str):
            problem = _bad_text(item, place)
            if problem is not None:
                return problem
        elif isinstance(item, dict):
            for key, inner in item.items():
                problem = _bad_text(key, f"{place}: a key")
                if problem is not None:
                    return problem
                pending.append((inner, f"{place}.{_shown(key)}"))
        elif isinstance(item, list):
            pending.extend((inner, f"{place}[{n}]") for n, inner in enumerate(item))
    return None


def _shown(key: str) -> str:
    """A key as a place names it: its first 40 characters, a NUL or lone surrogate escaped
    (the message must itself be text onward can print and store)."""
    return _UNSHOWN.sub(lambda m: f"\\u{ord(m[0]):04x}", key[:40])


_UNSHOWN = re.compile(r"[\x00\ud800-\udfff]")


def _bad_text(text: str, place: str) -> str | None:
    if "\x00" in text:
        return (f"it holds a NUL character (\\u0000) at {place}, which onward cannot store; "
                "remove or replace it")
    surrogate = _SURROGATE.search(text)
    if surrogate is not None:
        return (f"it holds a lone surrogate (\\u{ord(surrogate[0]):04x}) at {place}, which "
                "is not Unicode text; send the character itself or its surrogate pair")
    return None
