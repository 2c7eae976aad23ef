"""Printing data literally: never as terminal markup, never with raw control characters.

Everything the CLI prints that came from a run (model output, artifacts, payloads, results,
errors, names typed by other people) goes through these helpers. Rich markup is never parsed
from data (``Text`` pieces, consoles built with ``markup=False``), and characters a terminal
would act on or hide (C0/C1 controls such as ESC, DEL, bidirectional overrides, zero-width
and other format characters, line and paragraph separators) are shown as escapes
(``\\x1b``, ``\\u202e``) so a person sees exactly what is there.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

__all__ = ["add_row", "cell", "console", "id_column", "json_text", "line", "visible"]


# Unicode categories a terminal acts on or does not show: controls, format characters
# (bidi overrides, zero-width), surrogates, unassigned, line and paragraph separators.
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Cn", "Zl", "Zp"})


def console(*, stderr: bool = False) -> Console:
    """A console that never reads markup, emoji codes or highlighting out of strings."""
    return Console(stderr=stderr, markup=False, emoji=False, highlight=False)


def _hidden(char: str) -> bool:
    return unicodedata.category(char) in _HIDDEN


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(value: Any, *, newlines: bool = False) -> str:
    """``value`` as text with every hidden or control character escaped (``newlines=True``
    keeps line breaks and tabs, for multi-line messages)."""
    text = "" if value is None else str(value)
    keep = "\n\t" if newlines else ""
    return "".join(_escape(c) if _hidden(c) and c not in keep else c for c in text)


def json_text(value: Any, *, indent: int | None = None) -> str:
    """JSON of ``value`` that is still valid JSON for the same value, with hidden characters
    written as JSON escapes (``\\u202e``): what is shown parses back to what is stored."""
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    # json.dumps already escapes C0 controls inside strings: a raw line break is indentation
    return "".join(_json_escape(c) if _hidden(c) and c != "\n" else c for c in text)


def _json_escape(char: str) -> str:
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def line(*parts: str | tuple[str, str] | Text) -> Text:
    """One message: plain strings are data (shown literally, on this line), ``(text, style)``
    pairs are styled labels; nothing is parsed as markup."""
    text = Text()
    for part in parts:
        if isinstance(part, Text):
            text.append_text(part)
        elif isinstance(part, tuple):
            text.append(visible(part[0], newlines=True), style=part[1])
        else:
            text.append(visible(part))
    return text


def cell(value: Any) -> Text:
    """A table cell: data, shown literally on one line."""
    return value if isinstance(value, Text) else Text(visible(value))


def id_column(header: str) -> Column:
    """A column of the ids a person pastes into the next command: never wrapped or cut
    while the other columns can give up room. Rich shortens the widest column first, which
    in ``runs ls`` below 160 columns was the run id (``01a23147-…`` at 80: a prefix every
    run of that minute shares)."""
    return Column(header, no_wrap=True)


def add_row(table: Table, *values: Any) -> None:
    table.add_row(*(cell(v) for v in values))
