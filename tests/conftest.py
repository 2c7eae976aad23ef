"""Shared fixtures: a fresh, migrated PostgreSQL database per test (a copy of a template
migrated once per session), a real Redis, a unique broker queue per test, and real onward
processes (``cluster``). Tests share no ledger state, so ``pytest -n 2`` runs them in
parallel (pytest-xdist).

With ONWARD_DATABASE_URL / ONWARD_BROKER_URL set, those servers are used; otherwise the
embedded PostgreSQL and Redis under .onward/. Nothing is skipped when a service is missing:
the fixture fails, loudly.
"""

from __future__ import annotations

import gc
import logging
import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import structlog
from hypothesis import settings as hypothesis_settings

from harness.databases import create_database
from ledger import Ledger
from ledger.db import database_url
from tests.support.cluster import ROOT, Cluster
from tests.support.dropper import Dropper
from tests.support.messages import Publisher, remove_amqp_queues
from workers.broker import broker_url
from workers.settings import WorkerSettings

# pytest-xdist workers inherit COLUMNS=80/LINES=24; rich would fix every console's width
# at import from them, so the CLI would render differently under -n than serially.
for _variable in ("COLUMNS", "LINES"):
    os.environ.pop(_variable, None)

TEST_WORKFLOWS = "examples.research,tests.workflows"

# The machine running the suite may be busy (benchmarks, other suites): no per-example
# deadline, fewer examples; properties here are cheap to state, not to search.
hypothesis_settings.register_profile("onward", deadline=None, max_examples=60)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "onward"))


def _admin_settings() -> WorkerSettings:
    home = Path(os.environ.get("ONWARD_HOME", ROOT / ".onward"))
    return WorkerSettings(home=home)


@pytest.fixture(scope="session")
def server_urls() -> dict[str, str]:
    settings = _admin_settings()
    return {"database": database_url(settings), "broker": broker_url(settings),
            "home": str(settings.home_dir)}


@pytest.fixture(scope="session")
def dropper(server_urls: dict[str, str]) -> Iterator[Dropper]:
    """Drops the tests' databases in the background (a drop waits for a checkpoint: seconds
    on a busy machine); the session ends once every drop is done."""
    dropping = Dropper(server_urls["database"])
    yield dropping
    dropping.close()


@pytest.fixture(scope="session")
def template_database(server_urls: dict[str, str], dropper: Dropper) -> Iterator[str]:
    """A database migrated once per session; every test's database is a copy of it."""
    name, _url = create_database(server_urls["database"], "onward_tpl")
    yield name
    dropper.drop(name)  # with the last tests' databases: their drops share checkpoints


@pytest.fixture()
def database(server_urls: dict[str, str], template_database: str,
             dropper: Dropper) -> Iterator[str]:
    """A fresh, migrated database of this test's own (cloned from the template), dropped
    afterwards (in the background): tests share no ledger state, so they can run in
    parallel."""
    name, url = create_database(server_urls["database"], "onward_test",
                                template=template_database)
    yield url
    dropper.drop(name)


@pytest.fixture(scope="module")
def module_database(server_urls: dict[str, str], template_database: str,
                    dropper: Dropper) -> Iterator[str]:
    """One database for the tests of a module that share processes (``shared_cluster``)."""
    name, url = create_database(server_urls["database"], "onward_mod",
                                template=template_database)
    yield url
    dropper.drop(name)


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
        # a provider call's lease covers this (and ONWARD_TOOL_LEASE_MARGIN_S, 5 s): a worker
        # killed mid-call leaves its run for that long; loopback calls take milliseconds
        "ONWARD_TOOL_TIMEOUT_S": "10",
        "ONWARD_FAULTS_DIR": str(faults_dir),
        # Most tests start runs with no worker running (the in-process driver) or of
        # workflows made up for the test; tests/integration/test_client.py checks the refusal.
        "ONWARD_START_UNADVERTISED": "true",
    }


@pytest.fixture()
def settings_env(database: str, server_urls: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The environment every process of one test shares (fast timings for tests)."""
    return make_settings_env(database, server_urls, tmp_path / "faults")


@pytest.fixture()
def settings(settings_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> WorkerSettings:
    for key, value in settings_env.items():
        monkeypatch.setenv(key, value)
    return WorkerSettings()


@pytest.fixture()
def ledger(settings: WorkerSettings) -> Ledger:
    return Ledger.from_env(settings)


def pytest_configure(config: pytest.Config) -> None:
    """Turn SIGTERM (e.g. from ``timeout``) into KeyboardInterrupt, so fixtures still stop
    the worker processes they started (those run in their own sessions and would be left
    running against the test database otherwise)."""

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"received signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave this process's heap to the operating system at exit. Python's finalization
    garbage-collects the whole heap again as it clears each of the ~1,400 modules a test
    process imports: 1 to 12 s per process (more, the busier the machine), and pytest-xdist
    waits 10 s for a worker to exit before killing it, so every ``-n`` run ended with ~10 s
    of nothing. Frozen objects are left out of those collections. This runs after pytest's
    own last collection (which reports unraisable exceptions), so nothing goes unreported."""
    gc.freeze()


_TIERS = {"unit": "unit", "integration": "integration", "acceptance": "acceptance",
          "model": "model"}
_PROCESS_FIXTURES = {"cluster", "shared_cluster", "module_cluster"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test is marked with its tier (the directory it lives in), so ``-m`` selects a
    tier; an acceptance module must say so itself, and an integration test starts no
    processes (those are acceptance tests)."""
    for item in items:
        tier = _TIERS.get(Path(str(item.fspath)).parent.name)
        if tier is None:
            continue
        item.add_marker(getattr(pytest.mark, tier))
        module_marks = getattr(item.module, "pytestmark", [])
        if tier == "acceptance" and not any(m.name == "acceptance" for m in
                                            (module_marks if isinstance(module_marks, list)
                                             else [module_marks])):
            raise pytest.UsageError(f"{item.fspath}: an acceptance module sets "
                                    "pytestmark = pytest.mark.acceptance")
        if tier == "integration" and _PROCESS_FIXTURES & set(item.fixturenames):
            raise pytest.UsageError(f"{item.nodeid}: integration tests start no processes; "
                                    "move it to tests/acceptance")


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
    remove_amqp_queues(settings_env)


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """A command run in-process (``CliRunner``) may configure logging onto the stream it
    captures, which is closed once the command returns: later tests in this process would
    then fail writing a log line. Each test leaves structlog and the root logger as found."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**saved)
    root.handlers, root.level = handlers, level


@pytest.fixture(autouse=True)
def _no_leftover_runs(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used a module's shared database, cancel the runs it left unfinished
    and empty the outbox, so a later test's dispatcher never publishes an earlier test's
    leftovers to its own workers (and provider). A test's own database is simply dropped."""
    yield
    if "module_env" not in request.fixturenames:
        return
    engine = sa.create_engine(request.getfixturevalue("module_database"))
    with engine.begin() as conn:
        conn.execute(sa.text(
            "UPDATE onward.runs SET status = 'cancelled', lease_owner = NULL, "
            "lease_expires_at = NULL, finished_at = onward.now() "
            "WHERE status IN ('running', 'waiting')"))
        conn.execute(sa.text("DELETE FROM onward.outbox"))
    engine.dispose()


# -- processes shared by the tests of one module ----------------------------------------
# Starting a celery worker costs seconds; tests that need no fault armed and no special
# environment share one set of processes per module. Such a module overrides
# ``settings_env`` with ``module_env`` and uses ``shared_cluster``; each test asserts on
# its own runs only.
@pytest.fixture(scope="module")
def module_env(module_database: str, server_urls: dict[str, str],
               tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_settings_env(module_database, server_urls, tmp_path_factory.mktemp("faults"))


@pytest.fixture(scope="module")
def module_cluster(module_env: dict[str, str],
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(env=module_env, log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    running.stop_all()
    remove_amqp_queues(module_env)


@pytest.fixture()
def shared_cluster(module_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The module's processes; their logs are printed when the test fails."""
    yield module_cluster
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        print(module_cluster.logs())


@pytest.fixture()
def publisher(settings: WorkerSettings) -> Iterator[Publisher]:
    """Publishes step messages (and hostile ones) to the test's queue."""
    sender = Publisher(settings)
    yield sender
    sender.close()


@pytest.fixture()
def empty_database(server_urls: dict[str, str], dropper: Dropper) -> Iterator[str]:
    """A new database with no onward schema at all, dropped after the test."""
    name, url = create_database(server_urls["database"], "onward_empty", migrate=False)
    yield url
    dropper.drop(name)
