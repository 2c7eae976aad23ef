"""The reference provider (examples/provider.py) for one test (harness/provider.py): in a
thread of the test process for integration tests, which start no processes; as a real
subprocess for acceptance tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.processes import Processes
from harness.provider import ReferenceProvider

__all__ = ["Provider", "provider_fixture", "provider_in_thread", "running_provider"]

Provider = ReferenceProvider


@contextmanager
def provider_in_thread(tmp: Path) -> Iterator[Provider]:
    """The provider in a daemon thread of this process until the block ends, its store in
    ``tmp``."""
    provider = ReferenceProvider.in_thread(tmp)
    try:
        yield provider
    finally:
        provider.stop()


@contextmanager
def running_provider(tmp: Path) -> Iterator[Provider]:
    processes = Processes(env={}, log_dir=tmp)
    provider = ReferenceProvider.start(processes, tmp, timeout=20)
    try:
        yield provider
    finally:
        provider.stop()


def provider_fixture() -> Callable[..., Iterator[Provider]]:
    """An acceptance module's ``provider`` fixture: the provider as a real subprocess for
    one test, its store and log in ``tmp_path / "provider"``. A module writes
    ``provider = provider_fixture()``, not its own copy of the four lines."""
    @pytest.fixture()
    def provider(tmp_path: Path) -> Iterator[Provider]:
        with running_provider(tmp_path / "provider") as running:
            yield running

    return provider
