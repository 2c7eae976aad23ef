"""Whether validating plain JSON as a state model builds every container of the result anew.

A restore hands the step a state validated from the claim's state, and the claim's state is
what the next checkpoint's delta is computed from (ledger/states.py): the step must not be
able to change it in place. pydantic builds new lists, dicts and models for fields typed
with them, but passes the input's own objects through where a field is ``Any`` (or a list
or dict of ``Any``, or an extra field of a model that allows them), and a wrap or plain
validator may return its input as it is. Where the model's validation can do neither, the
validated state shares no container with its input and the restore need not copy the
input first (tasks/restore.py); the walk below allows only the schema kinds known to
build their result, and answers "shares" for anything else, so a kind it does not know
costs a copy, never a shared container."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

from pydantic import BaseModel

__all__ = ["validation_copies"]


_IMMUTABLE = frozenset({
    "none", "bool", "int", "float", "decimal", "str", "bytes", "date", "time", "datetime",
    "timedelta", "uuid", "url", "multi-host-url", "complex", "literal", "enum",
})
"""Schema kinds whose result is a value no step can change in place."""

_WRAPPING = frozenset({"default", "nullable", "function-after", "function-before"})
"""Kinds whose result is their inner ``schema``'s (a before-validator's output is validated
by it; an after-validator sees only what it built)."""

_SEQUENCES = frozenset({"list", "set", "frozenset"})


def validation_copies(model: type[BaseModel]) -> bool:
    """True when validating plain JSON as ``model`` can return no container of its input
    inside the result (every list, dict and model in it is built by the validation)."""
    return _copies(model)


@cache
def _copies(model: Any) -> bool:
    schema = model.__pydantic_core_schema__
    return _Walk(schema).fresh(schema)


class _Walk:
    """One model's core schema walked once; ``definition-ref`` resolved against its
    definitions (a recursive model refers to itself)."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.definitions: dict[str, Mapping[str, Any]] = {}
        self.seen: set[str] = set()
        self._collect(root)

    def _collect(self, schema: Any) -> None:
        if isinstance(schema, Mapping):
            if schema.get("type") == "definitions":
                for definition in schema.get("definitions", ()):
                    self.definitions[definition["ref"]] = definition
            for value in schema.values():
                self._collect(value)
        elif isinstance(schema, list | tuple):
            for value in schema:
                self._collect(value)

    def fresh(self, schema: Mapping[str, Any] | None) -> bool:
        """Whether ``schema``'s result holds only containers it built."""
        if schema is None:  # an items or values schema left out: Any
            return False
        ref = schema.get("ref")
        if ref is not None:
            if ref in self.seen:
                return True  # being checked further up this walk
            self.seen.add(ref)
        kind = schema.get("type")
        if kind in _IMMUTABLE:
            return True
        if kind in _WRAPPING or kind == "definitions":
            return self.fresh(schema.get("schema"))
        if kind == "definition-ref":
            target = self.definitions.get(schema["schema_ref"])
            return target is not None and self.fresh(target)
        if kind in _SEQUENCES:
            return self.fresh(schema.get("items_schema"))
        if kind == "dict":
            return self.fresh(schema.get("keys_schema")) and self.fresh(
                schema.get("values_schema"))
        if kind == "tuple":
            return self._all(schema.get("items_schema", ()))
        if kind == "union":
            return self._all(c[0] if isinstance(c, tuple) else c for c in schema["choices"])
        if kind == "tagged-union":
            return self._all(schema["choices"].values())
        if kind == "model":
            extra = (schema.get("config") or {}).get("extra_fields_behavior")
            return not schema.get("custom_init") and extra != "allow" \
                and self.fresh(schema.get("schema"))
        if kind in ("model-fields", "typed-dict"):
            if schema.get("extra_behavior") == "allow":
                return False
            return self._all(field["schema"] for field in schema["fields"].values())
        return False  # any, a wrap or plain validator, is-instance, a kind not known here

    def _all(self, schemas: Iterable[Mapping[str, Any]]) -> bool:
        return all(self.fresh(schema) for schema in schemas)
