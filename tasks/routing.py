"""Which broker queue a step message goes to.

Every worker consumes the base queue and one queue per workflow version it has code for.
A run bound to a version goes to that version's queue while some worker advertises it, so a
deploy lets in-flight runs finish on the code they started with; otherwise it goes to the
base queue, where newer code continues it if it declares compatibility or a migration path,
and parks it for review if not.
"""

from __future__ import annotations

from typing import Any

from tasks.workflow import Registry


def version_queue(base: str, workflow: str, version: int) -> str:
    return f"{base}.{workflow}.v{version}"


def worker_queues(base: str, registry: Registry) -> list[tuple[str, str, int]]:
    """(queue, workflow, version) for every workflow version this worker can run."""
    return [(version_queue(base, w.name, w.version), w.name, w.version) for w in registry.all()]


def route(base: str, workflow: str, version: int | None, live: set[str] | Any) -> str:
    if version is None:
        return base
    queue = version_queue(base, workflow, version)
    return queue if queue in live else base
