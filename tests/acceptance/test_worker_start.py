"""``onward worker`` finds the workflow modules of the folder it is run from, and says in one
paragraph (exit 2) why one of them cannot be imported.

The worker is started as the ``onward`` console script runs: ``python -P -m console`` puts
neither the current directory nor the script's on ``sys.path`` (PYTHONPATH holds only the
repository, for onward itself), so whatever finds the user's module is onward's own doing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ledger import Ledger, RunStatus
from tests.support.cluster import ROOT, Cluster, wait_for

pytestmark = pytest.mark.acceptance

AS_THE_SCRIPT = ["-P", "-m", "console"]  # no current directory on sys.path

AGENTS = '''
from pydantic import BaseModel

from tasks import StepContext, Workflow


class Ticket(BaseModel):
    text: str = ""
    label: str = ""


triage = Workflow("cwd_triage", version=1, state=Ticket)


@triage.step(start=True)
def classify(ctx: StepContext, state: Ticket):
    from cwd_app import labels  # imported at run time, in the pool child that runs the step

    return ctx.finish(label=labels.label_of(state.text))
'''

LABELS = '''
def label_of(text: str) -> str:
    return "billing" if "invoice" in text else "other"
'''


def _app_folder(root: Path, agents: str = AGENTS) -> Path:
    """``root/cwd_app/{__init__,agents,labels}.py``: a user's package, installed nowhere."""
    package = root / "cwd_app"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "agents.py").write_text(textwrap.dedent(agents))
    (package / "labels.py").write_text(textwrap.dedent(LABELS))
    return root


def test_worker__imports_workflow_modules_from_the_folder_it_runs_in(
        ledger: Ledger, cluster: Cluster, tmp_path: Path) -> None:
    """Given a package in the folder the worker starts from (no PYTHONPATH naming it), if a
    run of its workflow starts, expect it completed, by a step that imported a sibling
    module at run time in a prefork child."""
    folder = _app_folder(tmp_path / "project")
    cluster.dispatcher()
    worker = cluster.start("worker", [*AS_THE_SCRIPT, "worker", "-P", "prefork", "-c", "1",
                                      "--name", f"cwd-{tmp_path.name}@test"],
                           env={"ONWARD_WORKFLOWS": "cwd_app.agents"}, cwd=folder)
    wait_for(lambda: worker.ready() or not worker.alive(), timeout=60, what="worker ready")
    assert worker.alive(), worker.tail()

    run_id = ledger.start_run("cwd_triage", {"text": "my invoice is wrong"})
    wait_for(lambda: ledger.get_run(run_id).status is RunStatus.COMPLETED, timeout=60,
             what="the run to complete", seen=lambda: (ledger.get_run(run_id).status,
                                                       worker.tail(1500)))
    finished = ledger.get_run(run_id)
    assert finished is not None and finished.result == {"label": "billing"}


def _worker_exits(settings_env: dict[str, str], folder: Path, workflows: str,
                  *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings_env, "ONWARD_WORKFLOWS": workflows,
           "PYTHONPATH": str(ROOT)}
    env.pop("ONWARD_LOG_LEVEL", None)
    return subprocess.run([sys.executable, *AS_THE_SCRIPT, "worker", "-c", "1", *extra],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.parametrize(("agents", "module", "said"), [
    (AGENTS, "cwd_app.agent", "No module named 'cwd_app.agent'"),
    (AGENTS, "elsewhere.agents", "No module named 'elsewhere'"),
    ("raise RuntimeError('OPENAI_API_KEY is not set')\n", "cwd_app.agents",
     "RuntimeError: OPENAI_API_KEY is not set"),
    ("def classify(:\n", "cwd_app.agents", "SyntaxError"),
    ("import no_such_dependency\n", "cwd_app.agents", "No module named 'no_such_dependency'"),
], ids=["module-missing", "package-missing", "raises", "syntax-error", "dependency-missing"])
def test_worker__a_module_that_cannot_be_imported_is_one_paragraph_exit_2(
        settings_env: dict[str, str], tmp_path: Path, agents: str, module: str,
        said: str) -> None:
    """Given a workflow module that is missing, raises at import or does not parse, expect
    exit 2 and one error naming the module and why, with no traceback."""
    done = _worker_exits(settings_env, _app_folder(tmp_path, agents), module)

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"cannot import workflow module '{module}'" in done.stderr
    assert said in done.stderr
    found_nowhere = module != "cwd_app.agents"
    assert ("package.module" in done.stderr) is found_nowhere
    assert (str(tmp_path) in " ".join(done.stderr.split())) is found_nowhere


def test_worker__debug_level_prints_the_traceback_too(settings_env: dict[str, str],
                                                       tmp_path: Path) -> None:
    """Given a module that raises at import, if the worker runs at the debug log level,
    expect the traceback (through the module's line) before the same error, exit 2."""
    folder = _app_folder(tmp_path, "raise RuntimeError('OPENAI_API_KEY is not set')\n")
    done = _worker_exits(settings_env, folder, "cwd_app.agents", "--loglevel", "debug")

    assert done.returncode == 2, done.stderr
    assert "Traceback" in done.stderr
    assert 'cwd_app/agents.py", line 1' in done.stderr
    assert "cannot import workflow module 'cwd_app.agents'" in done.stderr
