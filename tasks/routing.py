"""Which broker queue a step message goes to.

Every worker consumes the base queue, one queue per workflow it has code for (for runs not
yet bound to a version: their first step) and one per workflow version.
A run bound to a version goes to that version's queue while some worker advertises it, so a
deploy lets in-flight runs finish on the code they started with; otherwise it goes to the
base queue, where newer code continues it if it declares compatibility or a migration path,
and parks it for review if not.
"""

from __future__ import annotations

from typing import Any

from tasks.workflow import Registry

__all__ = ["ANY_VERSION", "route", "version_queue", "worker_queues", "workflow_queue"]


def version_queue(base: str, workflow: str, version: int) -> str:
    return f"{base}.{workflow}.v{version}"


def workflow_queue(base: str, workflow: str) -> str:
    """Where a run not yet bound to a version goes: any worker with that workflow."""
    return f"{base}.{workflow}"


ANY_VERSION = 0


def worker_queues(base: str, registry: Registry) -> list[tuple[str, str, int]]:
    """(queue, workflow, version) for every workflow version this worker can run, plus one
    queue per workflow for its runs' first step (version ``ANY_VERSION``)."""
    queues = [(version_queue(base, w.name, w.version), w.name, w.version)
              for w in registry.all()]
    queues += [(workflow_queue(base, name), name, ANY_VERSION) for name in registry.names()]
    return queues


def route(base: str, workflow: str, version: int | None, live: set[str] | Any) -> str:
    """The queue served by code for this run, if a worker advertises one; else the base."""
    if version is None:
        queue = workflow_queue(base, workflow)
    else:
        queue = version_queue(base, workflow, version)
    return queue if queue in live else base
