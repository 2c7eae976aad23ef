"""The in-process outside world of tests/workflows_async_local (``LOCAL``: its model and
provider) for the integration tests that drive its async workflows in the test process."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.workflows_async_local import LOCAL

__all__ = ["LOCAL", "MODULES", "local_fixture"]

MODULES = ["tests.workflows_async_local"]


def local_fixture() -> Callable[..., Iterator[None]]:
    """A test module's ``local`` fixture: ``LOCAL`` emptied before and after each test
    (objects, calls counted, a held answer). A module writes ``local = local_fixture()``,
    not its own copy of the five lines."""
    @pytest.fixture()
    def local() -> Iterator[None]:
        LOCAL.reset()
        yield
        LOCAL.reset()

    return local
