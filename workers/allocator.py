"""Keep the memory a worker frees for its next step instead of handing it back at once.

glibc's malloc serves a block over its mmap threshold (128 KB at first, raised up to 32 MB
as such blocks are freed) with a mapping of its own, and gives the free memory at the top
of its heap back to the kernel once there is more than its trim threshold (twice the other)
of it. A restore of a large state allocates a few blocks of the state's size at once
(libpq's copy of the row, the ``bytes`` psycopg makes of the state's artifact) and frees
them when the step is done, so every restore had the kernel map and zero those pages
again: for a 2 MB state, about 500 page faults per block, which cost more CPU than
receiving the bytes (docs/scaling.md#checkpoint-storage-deltas). Fixing both thresholds
(``mallopt``) keeps blocks up to 32 MB in the heap and up to 64 MB of freed memory in the
process for the next restore; memory is still given back beyond that. Applied at
``worker_init``, in the main process before the pool starts, so a prefork child inherits
it. Elsewhere than glibc (no ``mallopt``) it does nothing. ``ONWARD_MALLOC_KEEP_FREED=false``
leaves the allocator as glibc set it.
"""

from __future__ import annotations

import ctypes
from typing import Any

from celery import signals

__all__ = ["KEEP_FREED_BYTES", "connect_keep_freed", "keep_freed_memory"]


KEEP_FREED_BYTES = 64 << 20
"""Free memory the heap keeps (``M_TRIM_THRESHOLD``); blocks up to 32 MB, glibc's largest
mmap threshold on 64 bits, come from the heap (``M_MMAP_THRESHOLD``)."""

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 32 << 20


def keep_freed_memory(**_signal: Any) -> bool:
    """Set glibc's thresholds (module docstring); False where there is no ``mallopt``."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
                and mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES))


def connect_keep_freed(enabled: bool) -> None:
    """Keep freed memory from the worker's start when ``enabled`` (``ONWARD_MALLOC_KEEP_FREED``)."""
    if enabled:
        signals.worker_init.connect(keep_freed_memory, weak=False)
