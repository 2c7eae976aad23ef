"""``make demo`` still works (it broke twice without a test noticing): examples/demo.py's
main job, run small (``--runs``, ``--sales-runs``) as ``make demo`` runs it when
ONWARD_DATABASE_URL / ONWARD_BROKER_URL are set, on this test's own database and the test
broker, with its real processes (provider, model server, dispatcher, reaper, workers, one
SIGKILLed mid-step, one killed by a fault after the CRM's answer). Its exit status and the
JSON line it prints are checked for what the demo claims. It runs with a master encryption
key, as ``make demo`` on the embedded default does (its home's key file): what the demo
reads back from the ledger (answers, effects, approvals) is sealed at rest."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from ledger.db import libpq_conninfo
from tests.support.cluster import ROOT

pytestmark = pytest.mark.acceptance

RUNS, SALES_RUNS = 6, 1


def _demo_env(settings_env: dict[str, str], home: Path) -> dict[str, str]:
    """The caller's environment without the suite's ONWARD_* tuning, plus the servers: what
    ``ONWARD_DATABASE_URL=… ONWARD_BROKER_URL=… make demo`` sees."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONWARD_")}
    env.update({"ONWARD_DATABASE_URL": settings_env["ONWARD_DATABASE_URL"],
                "ONWARD_BROKER_URL": settings_env["ONWARD_BROKER_URL"],
                "ONWARD_CHECKPOINT_KEY": settings_env["ONWARD_CHECKPOINT_KEY"],
                # sealed at rest, as on the embedded default (its home's encryption.keys)
                "ONWARD_ENCRYPTION_KEYS": f"demo={secrets.token_hex(32)}",
                "ONWARD_HOME": str(home)})  # the demo's logs and fault markers
    return env


def test_demo__every_run_completes_and_the_crm_holds_each_write_once(
        settings_env: dict[str, str], tmp_path: Path) -> None:
    """Invariant (README, examples/README.md#make-demo): the demo exits 0, and what it
    reports holds: every research run completed though a worker was SIGKILLed mid-step
    (no step committed twice or re-executed after its commit); every sales run completed
    though its worker died right after the CRM's answer (one effect reconciled by lookup),
    the CRM holds one offer and one email per run and no duplicate, and the approval of an
    edited draft was refused."""
    done = subprocess.run(
        [sys.executable, "-m", "examples.demo", "--runs", str(RUNS),
         "--sales-runs", str(SALES_RUNS)],
        cwd=ROOT, env=_demo_env(settings_env, tmp_path), capture_output=True, text=True,
        timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"the demo failed:\n{done.stderr[-6000:]}"
    lines = done.stdout.splitlines()
    assert len(lines) == 1, f"stdout must be one JSON line: {done.stdout!r}"
    out = json.loads(lines[0])

    assert out["runs"] == out["completed"] == RUNS, out
    assert out["steps_committed"] == 5 * RUNS, out  # five steps each, none twice
    assert out["duplicate_commits"] == 0 and out["completed_steps_reexecuted"] == 0, out
    assert out["workers_killed"] == 1 and out["restores"] >= 1, out
    assert out["sales_runs"] == out["sales_completed"] == SALES_RUNS, out
    assert out["provider_objects"] == 2 * SALES_RUNS, out  # an offer and an email each
    assert out["duplicate_provider_objects"] == 0, out
    assert out["effects_reconciled"] >= 1 and out["approvals_refused"] == 1, out
    with psycopg.connect(libpq_conninfo(settings_env["ONWARD_DATABASE_URL"])) as conn:
        sealed, effects = conn.execute(
            "SELECT count(*) FILTER (WHERE payload ? '$sealed'), count(*) "
            "FROM onward.effects").fetchone()  # type: ignore[misc]
    assert sealed == effects == 2 * SALES_RUNS  # every CRM payload sealed at rest
