"""What the encryption-at-rest tests share: a master key, the test environment with it
(tests/integration/test_crypt.py, test_corpus_crypt.py), and the recording and replay of
an encrypted run (test_corpus_crypt.py in tests/integration and tests/acceptance)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from ledger import Ledger, OnwardSettings, RunStatus
from ledger.bundle import read_bundle
from ledger.checkpoints import sealed_envelope
from ledger.corpora import Corpora
from ledger.corpus import Selection
from ledger.db import libpq_conninfo
from tasks.corpus.replayer import ReplayOptions, RunOutcome
from tasks.corpus.runner import replay_bundle
from tests.conftest import make_settings_env
from tests.support.driver import Driver, driver
from tests.support.reads import places_holding

__all__ = ["MASTER", "MODULES", "assert_error_sealed", "crypt_driver", "record", "replayed",
           "settings_env"]

MASTER = secrets.token_hex(32)
MODULES = ("tests.workflows_crypt",)


@pytest.fixture()
def settings_env(database: str, server_urls: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The environment every process of one test shares (tests/conftest.py), with the
    master key ``m1`` = ``MASTER``: a module that imports this fixture encrypts at rest."""
    env = make_settings_env(database, server_urls, tmp_path / "faults")
    env["ONWARD_ENCRYPTION_KEYS"] = f"m1={MASTER}"
    return env


def assert_error_sealed(drv: Driver, run_id: UUID, customer: str, said: str) -> dict[str, Any]:
    """The run failed with a step error whose message ``said`` quotes ``customer``: the
    value in no table, the message sealed in the run's row (type plain), ``***`` in the
    attempt's, opened for the app and masked for a viewer. The stored error."""
    url = drv.ledger.url
    assert places_holding(url, customer) == []
    with psycopg.connect(libpq_conninfo(url)) as conn:
        [(error,)] = conn.execute("SELECT last_error FROM onward.runs WHERE id = %s",
                                  (run_id,)).fetchall()
        attempts = conn.execute("SELECT error_message FROM onward.step_attempts "
                                "WHERE run_id = %s", (run_id,)).fetchall()
    assert error["type"] == "StepError" and sealed_envelope(error["message"]) is not None
    assert attempts == [("***",)]
    assert drv.ledger.get_run(run_id).last_error["message"] == said  # type: ignore[union-attr,index]
    viewer = drv.ledger.acting_as("vic", "viewer").get_run(run_id)
    assert viewer.last_error["message"] == "***"  # type: ignore[union-attr,index]
    stored: dict[str, Any] = error
    return stored


@contextmanager
def crypt_driver(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    """A driver of tests/workflows_crypt.py as it recorded its runs (no candidate variant
    set: a test sets ``ONWARD_TEST_CRYPT_VARIANT`` for its replay)."""
    monkeypatch.delenv("ONWARD_TEST_CRYPT_VARIANT", raising=False)
    with driver(ledger, list(MODULES)) as running:
        yield running


def record(drv: Driver, customer: str) -> UUID:
    """A completed ``test_crypt`` run (its customer sealed in every checkpoint after the
    first, in its model call and effect), pinned in corpus ``c``."""
    run_id = drv.ledger.start_run("test_crypt", {"customer": customer})
    run = drv.drive(run_id)
    assert run.status is RunStatus.COMPLETED and run.result == {"matched": True}, run
    Corpora(drv.ledger).add("c", Selection())
    return run_id


def replayed(drv: Driver, settings: OnwardSettings, jobs: int = 1) -> list[RunOutcome]:
    """Corpus ``c``'s runs replayed as ``onward corpus replay`` does, in ``jobs`` processes
    (1: in this one; more only when the corpus has as many runs)."""
    bundle = read_bundle(Corpora(drv.ledger).snapshot("c"), drv.ledger.keys)
    return replay_bundle(settings, bundle, ReplayOptions(MODULES, label="c"),
                         jobs=jobs).outcomes
