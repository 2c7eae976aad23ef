"""Readable differences for a reviewer: JSON documents with ignored fields taken out, JSON
diffs as lines, and requests (model prompts, tool parameters, effect payloads) as a unified
diff of their text."""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Callable
from typing import Any

import jsonpatch

__all__ = ["HIDDEN", "MAX_VALUE", "json_diff", "request_diff", "request_text", "without"]


MAX_VALUE = 160  # characters of a value shown on one diff line
HIDDEN = "differs (stored sealed: not shown)"
"""A diff line's text for a value stored sealed: a report names what changed, never what
a sensitive value was (reports end up in CI logs and JUnit files)."""


def without(doc: Any, patterns: tuple[str, ...]) -> Any:
    """``doc`` with every field a pattern names removed. A pattern is a JSON pointer
    (``/draft``, ``/items/0/price``) in which ``*`` matches any key or index."""
    if not patterns:
        return doc
    doc = copy.deepcopy(doc)
    for pattern in patterns:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in pattern.strip("/").split("/")]
        if parts and parts != [""]:
            _remove(doc, parts)
    return doc


def _remove(node: Any, parts: list[str]) -> None:
    head, rest = parts[0], parts[1:]
    if isinstance(node, dict):
        keys = list(node) if head == "*" else [head] if head in node else []
        for key in keys:
            if rest:
                _remove(node[key], rest)
            else:
                del node[key]
    elif isinstance(node, list):
        indexes = range(len(node)) if head == "*" else \
            [int(head)] if head.isdigit() and int(head) < len(node) else []
        for index in sorted(indexes, reverse=True):
            if rest:
                _remove(node[index], rest)
            else:
                del node[index]


def json_diff(recorded: Any, replayed: Any, *,
              hidden: Callable[[str], bool] | None = None) -> list[str]:
    """How ``replayed`` differs from ``recorded``, one change per line (long strings as a
    unified diff under their path); empty when they are equal. A change at a path
    ``hidden`` selects (a value stored sealed) is named, its values are not shown."""
    if recorded == replayed:
        return []
    if not isinstance(recorded, dict | list) or not isinstance(replayed, dict | list):
        if hidden is not None and hidden("/"):
            return [f"~ (whole value): {HIDDEN}"]
        return [f"~ (whole value): {_short(recorded)} → {_short(replayed)}"]
    lines: list[str] = []
    for op in jsonpatch.make_patch(recorded, replayed).patch:
        path = op["path"] or "/"
        if hidden is not None and hidden(path):
            lines.append(f"~ {path}: {HIDDEN}")
        elif op["op"] == "add":
            lines.append(f"+ {path}: {_short(op['value'])}")
        elif op["op"] == "remove":
            lines.append(f"- {path}: {_short(_at(recorded, path))}")
        elif op["op"] == "replace":
            lines.extend(_replaced(path, _at(recorded, path), op["value"]))
        else:  # move, copy
            lines.append(f"~ {path}: {op['op']} from {op.get('from')}")
    return lines


def _replaced(path: str, before: Any, after: Any) -> list[str]:
    if isinstance(before, str) and isinstance(after, str) and (
            "\n" in before or "\n" in after or max(len(before), len(after)) > MAX_VALUE):
        body = difflib.unified_diff(before.splitlines(), after.splitlines(), "recorded",
                                    "replay", n=1, lineterm="")
        return [f"~ {path}:", *(f"    {line}" for line in body)]
    return [f"~ {path}: {_short(before)} → {_short(after)}"]


def _at(doc: Any, pointer: str) -> Any:
    import jsonpointer

    return jsonpointer.resolve_pointer(doc, pointer, None)


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= MAX_VALUE else text[:MAX_VALUE - 1] + "…"


def request_text(request: Any) -> list[str]:
    """A request as lines a person reads: a model call as its model, parameters and each
    message's role and content; anything else as indented JSON."""
    if isinstance(request, dict) and isinstance(request.get("messages"), list):
        lines = [f"model: {request.get('model')}",
                 f"params: {json.dumps(request.get('params') or {}, sort_keys=True)}"]
        for message in request["messages"]:
            if not isinstance(message, dict):
                lines.append(json.dumps(message, sort_keys=True))
                continue
            lines.append(f"[{message.get('role', '?')}]")
            content = message.get("content")
            text = content if isinstance(content, str) else json.dumps(content, indent=2,
                                                                       sort_keys=True)
            lines.extend(text.splitlines() or [""])
        return lines
    return json.dumps(request, indent=2, sort_keys=True, ensure_ascii=False).splitlines()


def request_diff(recorded: Any, replayed: Any) -> list[str]:
    """A unified diff of two requests' text (recorded first)."""
    return list(difflib.unified_diff(request_text(recorded), request_text(replayed),
                                     "recorded", "replay", n=2, lineterm=""))
