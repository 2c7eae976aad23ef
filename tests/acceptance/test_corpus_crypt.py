"""Offline corpus replay of encrypted runs in replay processes (docs/corpus.md#encrypted-runs):
``onward corpus replay --jobs`` runs replays in processes of its own, which get the master
keys. The recorded run is driven in-process (tests/support/driver.py); the cases that need
no process are in tests/integration/test_corpus_crypt.py."""

from __future__ import annotations

import secrets

import psutil
import pytest

from ledger import OnwardSettings
from tests.support.crypt import MODULES, record, replayed, settings_env  # noqa: F401 - a fixture
from tests.support.driver import Driver, driver_fixture

pytest.importorskip("cryptography")

pytestmark = pytest.mark.acceptance


drv = driver_fixture(MODULES)


def test_replay__encrypted_runs_replayed_in_replay_processes_are_identical(
        drv: Driver, settings: OnwardSettings) -> None:
    """Invariant: a corpus of encrypted runs replayed by two replay processes (which get
    the master keys from the replaying one: without them no sealed value opens) is
    reported identical, run by run, every checkpoint compared, with the same effect keys;
    the replays ran in processes other than this one."""
    runs = {str(record(drv, f"CANARY{secrets.token_hex(6)}")) for _ in range(2)}
    outcomes = replayed(drv, settings, jobs=2)
    assert {o.run_id for o in outcomes} == runs
    for outcome in outcomes:
        assert outcome.identical, outcome.finding
        assert outcome.steps_replayed == outcome.steps_recorded == 8
        assert outcome.same_effect_keys
    assert any("multiprocessing" in " ".join(child.cmdline())
               for child in psutil.Process().children(recursive=True)), "no replay process"
