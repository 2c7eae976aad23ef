"""The reference provider (examples/provider.py) as a real subprocess for one test
(harness/provider.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.processes import Processes
from harness.provider import ReferenceProvider

Provider = ReferenceProvider


@contextmanager
def running_provider(tmp: Path) -> Iterator[Provider]:
    processes = Processes(env={}, log_dir=tmp)
    provider = ReferenceProvider.start(processes, tmp, timeout=20)
    try:
        yield provider
    finally:
        provider.stop()
