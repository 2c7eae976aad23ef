"""Which workflows exist, as workers advertise them: ``start_run`` checks a new run against it.

Each worker writes a row per workflow version it can run into ``worker_queues``, with the
JSON Schema of that version's state model (workers/advertise.py). A workflow some worker
has ever advertised is known (rows outlive the workers; routing, not this check, cares
whether one is alive now). A new run's input must be valid for at least one advertised
version's state model: its first step restores that input as the state. The JSON Schema
is strict about JSON types (``"5"`` is not an integer) where pydantic would coerce.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import psycopg
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from psycopg.rows import tuple_row

from ledger import sql
from ledger.exceptions import InvalidInput, UnknownWorkflow

__all__ = ["ADVERTISED", "CACHE_S", "Catalog", "catalog_of", "check_start", "check_start_async"]


ADVERTISED = sql.statement("advertised_workflows")
CACHE_S = 5.0
"""How long a process trusts what it read (a name not found is always read again)."""


@dataclass(frozen=True)
class Catalog:
    schemas: dict[str, list[str]]  # workflow -> state schemas (canonical JSON), any version

    def check(self, workflow: str, input: dict[str, Any]) -> None:
        """Refuse an unknown name (listing the known ones) or an input no version accepts."""
        if workflow not in self.schemas:
            known = ", ".join(sorted(self.schemas)) or "(none yet)"
            raise UnknownWorkflow(
                f"no worker has advertised workflow {workflow!r}; known workflows: {known}. "
                "Check the name, or, to start runs before the first worker of a new workflow "
                "is deployed, pass allow_unadvertised=True (ONWARD_START_UNADVERTISED=true)")
        problems = [_problem(schema, input) for schema in self.schemas[workflow]]
        if problems and all(problems):
            raise InvalidInput(f"input refused by the state model of workflow {workflow!r}: "
                               f"{problems[-1]}")


def _problem(schema: str, input: dict[str, Any]) -> str | None:
    error = best_match(_validator(schema).iter_errors(input))
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path) or "(the input)"
    return f"{where}: {error.message}"


@lru_cache(maxsize=256)
def _validator(schema: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads(schema))


_cache: dict[tuple[str, ...], tuple[float, Catalog]] = {}
_lock = threading.Lock()


def catalog_of(rows: list[tuple[Any, ...]]) -> Catalog:
    """The catalog from ``ADVERTISED`` rows (workflow, version, state_schema)."""
    schemas: dict[str, list[str]] = {}
    for workflow, _version, schema in rows:
        found = schemas.setdefault(workflow, [])
        if schema is not None:
            text = json.dumps(schema, sort_keys=True)
            if text not in found:
                found.append(text)
    return Catalog(schemas)


def _key(info: Any) -> tuple[str, ...]:
    return (str(info.host), str(info.port), str(info.dbname))


def _cached(key: tuple[str, ...], workflow: str) -> Catalog | None:
    with _lock:
        cached = _cache.get(key)
    if cached is None or time.monotonic() - cached[0] > CACHE_S \
            or workflow not in cached[1].schemas:
        return None
    return cached[1]


def _remember(key: tuple[str, ...], catalog: Catalog) -> Catalog:
    with _lock:
        _cache[key] = (time.monotonic(), catalog)
    return catalog


def check_start(raw: psycopg.Connection[Any], workflow: str, input: dict[str, Any]) -> None:
    """``Catalog.check`` against what this database's workers advertise (cached briefly)."""
    key = _key(raw.info)
    catalog = _cached(key, workflow) or _remember(
        key, catalog_of(raw.cursor(row_factory=tuple_row).execute(ADVERTISED).fetchall()))
    catalog.check(workflow, input)


SENSITIVE_MARK = "x-onward-sensitive"
"""What the JSON Schema of a state field marked sensitive says (tasks/sensitive.py)."""


def sensitive_fields(raw: psycopg.Connection[Any], workflow: str) -> frozenset[str] | None:
    """The state fields any advertised version of ``workflow`` marks sensitive: what a new
    run's input has sealed (ledger/crypto.py); None when no worker advertised its state
    schema (nothing is known: ``runs.input_sealed`` then seals every field)."""
    key = _key(raw.info)
    catalog = _cached(key, workflow) or _remember(
        key, catalog_of(raw.cursor(row_factory=tuple_row).execute(ADVERTISED).fetchall()))
    return _sensitive_of(catalog, workflow)


async def sensitive_fields_async(conn: psycopg.AsyncConnection[Any],
                                 workflow: str) -> frozenset[str] | None:
    """``sensitive_fields`` on an asyncio connection."""
    key = _key(conn.info)
    catalog = _cached(key, workflow)
    if catalog is None:
        cursor = await conn.cursor(row_factory=tuple_row).execute(ADVERTISED)
        catalog = _remember(key, catalog_of(await cursor.fetchall()))
    return _sensitive_of(catalog, workflow)


def _sensitive_of(catalog: Catalog, workflow: str) -> frozenset[str] | None:
    if not catalog.schemas.get(workflow):
        return None
    found: set[str] = set()
    for text in catalog.schemas.get(workflow, []):
        properties = json.loads(text).get("properties") or {}
        found.update(name for name, prop in properties.items()
                     if isinstance(prop, dict) and prop.get(SENSITIVE_MARK))
    return frozenset(found)


async def check_start_async(conn: psycopg.AsyncConnection[Any], workflow: str,
                            input: dict[str, Any]) -> None:
    """``check_start`` on an asyncio connection."""
    key = _key(conn.info)
    catalog = _cached(key, workflow)
    if catalog is None:
        cursor = await conn.cursor(row_factory=tuple_row).execute(ADVERTISED)
        catalog = _remember(key, catalog_of(await cursor.fetchall()))
    catalog.check(workflow, input)
