"""A worker keeps the memory it frees for its next step (``workers/allocator.py``): restoring
a large state then reuses the heap's pages instead of having the kernel map and zero new
ones. ``ONWARD_MALLOC_KEEP_FREED=false`` leaves glibc's allocator alone. Each case runs in a
process of its own, whose allocator no other test has touched."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_ROUNDS = """
    import resource

    def rounds(count):  # what a restore of a 2 MB state allocates and frees, three blocks
        for _ in range(count):
            blocks = [b"x" * (2 << 20) for _ in range(3)]
            del blocks

    rounds(2)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    rounds(20)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(setup: str) -> int:
    """Minor page faults of 20 rounds of large allocations after ``setup``, in a new process."""
    code = textwrap.dedent(setup) + textwrap.dedent(_ROUNDS)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    return int(done.stdout.split()[-1])


_WORKER = """
    from celery import signals
    from tasks.workflow import Registry
    from workers.app import create_app
    from workers.settings import WorkerSettings

    create_app(WorkerSettings(malloc_keep_freed={keep}), registry=Registry())
    signals.worker_init.send(sender=None)
"""


def test_a_started_worker__reuses_the_memory_it_freed() -> None:
    """Given a worker started with its default settings, if it allocates and frees three
    2 MB blocks twenty times, expect no page fault for them (the first rounds mapped the
    pages); glibc as it is faults every round (each block's 512 pages, again and again)."""
    assert _page_faults(_WORKER.format(keep=True)) < 200
    assert _page_faults(_WORKER.format(keep=False)) > 20 * 512
