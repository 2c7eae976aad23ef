"""A worker freezes what its startup built (``workers/gcfreeze.py``) when it is ready: the
cyclic collector then skips those objects at every full collection. ``ONWARD_GC_FREEZE=false``
leaves the collector alone."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from celery import signals

from tasks.workflow import Registry
from workers.app import create_app
from workers.gcfreeze import freeze_startup_objects
from workers.settings import WorkerSettings


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    """Each test starts with nothing frozen and no freeze connected, and leaves it so."""
    for signal in (signals.worker_init, signals.worker_ready):
        signal.disconnect(freeze_startup_objects)
    gc.unfreeze()
    yield
    for signal in (signals.worker_init, signals.worker_ready):
        signal.disconnect(freeze_startup_objects)
    gc.unfreeze()


@pytest.mark.parametrize("signal", [signals.worker_init, signals.worker_ready],
                         ids=["before-the-pool-forks", "ready"])
def test_a_ready_worker__freezes_what_its_startup_built(signal: signals.Signal) -> None:
    create_app(WorkerSettings(gc_freeze=True), registry=Registry())
    assert gc.get_freeze_count() == 0
    signal.send(sender=None)
    assert gc.get_freeze_count() > 10_000  # the interpreter, Celery, pydantic, onward...


def test_gc_freeze_off__leaves_the_collector_alone() -> None:
    create_app(WorkerSettings(gc_freeze=False), registry=Registry())
    signals.worker_ready.send(sender=None)
    signals.worker_init.send(sender=None)
    assert gc.get_freeze_count() == 0
