"""Move what a worker process built at startup out of the cyclic garbage collector's reach.

A worker imports Celery, kombu, SQLAlchemy, pydantic, the workflows' modules and the SDKs
they use (``openai`` alone is tens of thousands of objects): about 235,000 tracked objects
before it runs a step, none of which is ever garbage. Every full collection walks them all
again, holding the interpreter: ~120 ms of CPU each in a threads ``-c 100`` worker of
bench/agents.py, during which none of its steps runs. ``gc.freeze()`` puts them in the
permanent generation, which collections skip; what steps allocate is collected as before.

It is called twice: at ``worker_init``, in the main process before the pool starts, so a
prefork child inherits the frozen objects and its collections never write to their pages
(which the fork shares with the parent until written), and at ``worker_ready``, once the
pool and the consumer are up (a threads, gevent or solo worker's steps run in that one
process; handlers of that signal connected before, such as a workflow module's building its
model client, have run). ``ONWARD_GC_FREEZE=false`` leaves the collector as Python set it.
"""

from __future__ import annotations

import gc
from typing import Any

from celery import signals

__all__ = ["connect_freeze", "freeze_startup_objects"]


def freeze_startup_objects(**_signal: Any) -> None:
    """Collect what startup left as garbage, then freeze every object still alive."""
    gc.collect()
    gc.freeze()


def connect_freeze(enabled: bool) -> None:
    """Freeze at the worker's startup signals when ``enabled`` (``ONWARD_GC_FREEZE``).
    Connected after the workflows' modules are loaded, so their own handlers of those
    signals run first and what they build is frozen too."""
    if not enabled:
        return
    signals.worker_init.connect(freeze_startup_objects, weak=False)
    signals.worker_ready.connect(freeze_startup_objects, weak=False)
