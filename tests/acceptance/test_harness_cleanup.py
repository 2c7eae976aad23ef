"""The processes a test run starts end with it: a pytest run interrupted or killed before its
teardown leaves no dispatcher or reaper running against its test database
(harness/processes.py arms PR_SET_PDEATHSIG in each child)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from harness.processes import ROOT
from harness.waiting import wait_for

pytestmark = pytest.mark.acceptance

__all__: list[str] = []

# Run by an inner pytest with tests/conftest.py as a plugin (its ``cluster`` fixture). The
# teardown that outlasts pytest-xdist's 10 s grace after Ctrl-C stands for any teardown that
# never gets to stop the processes: xdist then kills its worker, as a crash would.
INNER = '''
import json
import os
import threading
from pathlib import Path

import pytest


@pytest.fixture()
def slow_teardown():
    yield
    threading.Event().wait(60)


def test_holds_a_dispatcher_and_a_reaper(cluster, slow_teardown):
    procs = [cluster.dispatcher(), cluster.reaper()]
    Path(os.environ["INNER_PIDS"]).write_text(json.dumps([p.pid for p in procs]))
    threading.Event().wait(240)
'''


@pytest.mark.parametrize(("how", "options"), [("interrupted", ["-n", "1"]),
                                              ("killed", ["-p", "no:xdist"])])
def test_harness__a_dead_test_run_leaves_no_process_running(
        how: str, options: list[str], tmp_path: Path) -> None:
    """Invariant: once a pytest run that started a dispatcher and a reaper has ended, by
    Ctrl-C (SIGINT to its process group) with a teardown that did not finish, or by SIGKILL,
    neither process is alive (psutil) within seconds."""
    (tmp_path / "test_inner.py").write_text(INNER)
    pids_file = tmp_path / "pids.json"
    env = {**os.environ, "INNER_PIDS": str(pids_file),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
               "-p", "tests.conftest", "-q", *options, str(tmp_path / "test_inner.py")]
    with open(tmp_path / "inner.log", "wb") as log:  # its own session: a terminal's Ctrl-C
        run = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True,
                               preexec_fn=_ctrl_c_as_at_a_terminal)
    started: list[psutil.Process] = []
    try:
        wait_for(lambda: pids_file.exists() and pids_file.read_text(), timeout=120,
                 what="the inner run to start its processes",
                 seen=lambda: (tmp_path / "inner.log").read_text(errors="replace")[-2000:])
        started = [psutil.Process(pid) for pid in json.loads(pids_file.read_text())]
        assert len(started) == 2 and all(p.is_running() for p in started)
        if how == "interrupted":
            os.killpg(run.pid, signal.SIGINT)
        else:
            run.kill()
        run.wait(timeout=60)
        wait_for(lambda: not _alive(started), timeout=30,
                 what="the dispatcher and the reaper to end with the run",
                 seen=lambda: [p.cmdline() for p in _alive(started)])
    finally:
        for proc in [*_alive(started), *([psutil.Process(run.pid)] if run.poll() is None
                                         else [])]:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        run.wait(timeout=30)


def _ctrl_c_as_at_a_terminal() -> None:
    """SIGINT back to its default in the inner run, as at a terminal: a suite started in the
    background by a non-interactive shell (``ci-fresh > log &``, a CI runner's job) inherits
    SIGINT ignored, every process below it too, and a Python started so installs no
    KeyboardInterrupt handler: the interrupted run then never ended."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (a zombie has ended; ``is_running`` sees a reused pid)."""
    alive = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
    return alive
