"""How the suite itself runs: the scheduling `make test` asks of pytest-xdist, and how a
test process ends. Both cost CI minutes when they regress, and nothing else would notice."""

from __future__ import annotations

import gc
import re

import pytest

from tests import conftest
from tests.support.cluster import ROOT


def _recipe(target: str) -> str:
    """The recipe of ``target`` in the Makefile, continuation lines joined."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    found = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n?)+)", text, re.MULTILINE)
    assert found, f"no {target} target in the Makefile"
    return found.group(1)


@pytest.mark.parametrize("target", ["test", "test-fast"])
def test_make_test__workers_steal_from_each_other(target: str) -> None:
    """Invariant: the suite's runs let an idle xdist worker take tests queued on another.
    Under xdist's default (--dist load) the first worker is handed the first eighth of the
    collection up front, which is every acceptance test, and keeps it: the other worker ran
    everything else, then idled ~400 s of each CI pass. Failed before: no --dist option."""
    assert "--dist worksteal" in _recipe(target)


def test_unconfigure__leaves_the_heap_to_the_operating_system() -> None:
    """Invariant: a test process ends with its objects frozen out of garbage collection, so
    Python's finalization does not collect the whole heap once per module cleared (seconds
    per process; xdist waited 10 s for each worker, then killed it). Failed before: no
    pytest_unconfigure in tests/conftest.py."""
    gc.unfreeze()
    try:
        conftest.pytest_unconfigure(pytest.Config.__new__(pytest.Config))
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
