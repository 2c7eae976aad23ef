"""Shared fixtures: a fresh, migrated PostgreSQL database for the session, a real Redis,
a unique broker queue per test, and real onward processes (``cluster``).

With ONWARD_DATABASE_URL / ONWARD_BROKER_URL set, those servers are used; otherwise the
embedded PostgreSQL and Redis under .onward/. Nothing is skipped when a service is missing:
the fixture fails, loudly.
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import settings as hypothesis_settings
from sqlalchemy.engine import make_url

from ledger import Ledger, OnwardSettings
from ledger.db import database_url
from ledger.migrate import upgrade
from tests.support.cluster import ROOT, Cluster
from tests.support.messages import Publisher
from workers.broker import broker_url

TEST_WORKFLOWS = "examples.research,tests.workflows"

# The machine running the suite may be busy (benchmarks, other suites): no per-example
# deadline, fewer examples; properties here are cheap to state, not to search.
hypothesis_settings.register_profile("onward", deadline=None, max_examples=60)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "onward"))


def _admin_settings() -> OnwardSettings:
    home = Path(os.environ.get("ONWARD_HOME", ROOT / ".onward"))
    return OnwardSettings(home=home)


@pytest.fixture(scope="session")
def server_urls() -> dict[str, str]:
    settings = _admin_settings()
    return {"database": database_url(settings), "broker": broker_url(settings),
            "home": str(settings.home_dir)}


@pytest.fixture(scope="session")
def database(server_urls: dict[str, str]) -> Iterator[str]:
    """A new database with the onward schema, dropped at the end of the session."""
    admin_url = make_url(server_urls["database"])
    name = f"onward_test_{secrets.token_hex(4)}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = admin_url.set(database=name).render_as_string(hide_password=False)
    engine = sa.create_engine(url)
    upgrade(engine)
    engine.dispose()
    yield url
    with admin.connect() as conn:
        conn.execute(sa.text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
            {"n": name})
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()


def make_settings_env(database: str, server_urls: dict[str, str],
                      faults_dir: Path) -> dict[str, str]:
    """The environment every process of one test shares (fast timings for tests)."""
    return {
        "ONWARD_DATABASE_URL": database,
        "ONWARD_BROKER_URL": server_urls["broker"],
        "ONWARD_HOME": server_urls["home"],
        "ONWARD_QUEUE": f"test.{secrets.token_hex(6)}",
        "ONWARD_WORKFLOWS": TEST_WORKFLOWS,
        "ONWARD_CHECKPOINT_KEY": "test-checkpoint-key",
        "ONWARD_LEASE_TTL_S": "3",
        "ONWARD_REAPER_INTERVAL_S": "0.5",
        "ONWARD_OUTBOX_GRACE_S": "1",
        "ONWARD_OUTBOX_REPUBLISH_S": "5",
        "ONWARD_STALL_AFTER_S": "5",
        "ONWARD_DISPATCHER_POLL_S": "0.5",
        "ONWARD_RETRY_BASE_S": "0.1",
        "ONWARD_RETRY_MAX_S": "1",
        "ONWARD_FAULTS_DIR": str(faults_dir),
        "ONWARD_EXAMPLE_STEP_MS": "5",
    }


@pytest.fixture()
def settings_env(database: str, server_urls: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The environment every process of one test shares (fast timings for tests)."""
    return make_settings_env(database, server_urls, tmp_path / "faults")


@pytest.fixture()
def settings(settings_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> OnwardSettings:
    for key, value in settings_env.items():
        monkeypatch.setenv(key, value)
    return OnwardSettings()


@pytest.fixture()
def ledger(settings: OnwardSettings) -> Ledger:
    return Ledger.from_env(settings)


def pytest_configure(config: pytest.Config) -> None:
    """Turn SIGTERM (e.g. from ``timeout``) into KeyboardInterrupt, so fixtures still stop
    the worker processes they started (those run in their own sessions and would be left
    running against the test database otherwise)."""

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"received signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture()
def cluster(settings_env: dict[str, str], tmp_path: Path,
            request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """Real onward processes; their logs are printed when the test fails."""
    running = Cluster(env=settings_env, log_dir=tmp_path)
    yield running
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        print(running.logs())
    running.stop_all()


@pytest.fixture(autouse=True)
def _no_leftover_runs(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used the ledger, cancel the runs it left unfinished and empty the
    outbox: tests share one database, and a later test's dispatcher would otherwise publish
    an earlier test's leftovers to its own workers (and provider)."""
    yield
    if "database" not in request.fixturenames:
        return
    url = request.getfixturevalue("database")
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(
            "UPDATE onward.runs SET status = 'cancelled', lease_owner = NULL, "
            "lease_expires_at = NULL, finished_at = now() "
            "WHERE status IN ('running', 'waiting')"))
        conn.execute(sa.text("DELETE FROM onward.outbox"))
    engine.dispose()


# -- processes shared by the tests of one module ----------------------------------------
# Starting a celery worker costs seconds; tests that need no fault armed and no special
# environment share one set of processes per module. Such a module overrides
# ``settings_env`` with ``module_env`` and uses ``shared_cluster``; each test asserts on
# its own runs only.
@pytest.fixture(scope="module")
def module_env(database: str, server_urls: dict[str, str],
               tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_settings_env(database, server_urls, tmp_path_factory.mktemp("faults"))


@pytest.fixture(scope="module")
def module_cluster(module_env: dict[str, str],
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(env=module_env, log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    running.stop_all()


@pytest.fixture()
def shared_cluster(module_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The module's processes; their logs are printed when the test fails."""
    yield module_cluster
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        print(module_cluster.logs())


@pytest.fixture()
def publisher(settings: OnwardSettings) -> Iterator[Publisher]:
    """Publishes step messages (and hostile ones) to the test's queue."""
    sender = Publisher(settings)
    yield sender
    sender.close()


@pytest.fixture()
def empty_database(server_urls: dict[str, str]) -> Iterator[str]:
    """A new database with no onward schema at all, dropped after the test."""
    admin_url = make_url(server_urls["database"])
    name = f"onward_empty_{secrets.token_hex(4)}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield admin_url.set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(sa.text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
            {"n": name})
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()
