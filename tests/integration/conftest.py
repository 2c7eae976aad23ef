"""Integration tests start no processes (acceptance tests do): a test fails when a process
it started (a server, a worker, a pool of replay processes) is still running as its body
ends. Servers the outside world stands for run in a thread of the test (harness's
``ModelServer.in_thread``, ``ReferenceProvider.in_thread``)."""

from __future__ import annotations

from collections.abc import Generator

import psutil
import pytest

_BEFORE = pytest.StashKey[set[int]]()


def _children() -> list[psutil.Process]:
    """This process's live descendants (an exited, unreaped one is not running)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.fixture(autouse=True)
def _starts_no_processes(request: pytest.FixtureRequest) -> None:
    """Note the processes running before the test's other fixtures start."""
    request.node.stash[_BEFORE] = {child.pid for child in _children()}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    result = yield
    before = item.stash.get(_BEFORE, None)
    started = [child for child in _children() if before is not None and child.pid not in before]
    if started:
        described = []
        for child in started:
            try:
                described.append(f"{child.pid}: {' '.join(child.cmdline())[:160]}")
            except psutil.Error:
                described.append(str(child.pid))
        pytest.fail("integration tests start no processes (move the test to tests/acceptance,"
                    " or run the server in a thread); still running: "
                    + "; ".join(described), pytrace=False)
    return result
