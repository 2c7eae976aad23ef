"""``onward corpus`` in-process against a real PostgreSQL: pin, list, show, export to a
file, import it back, remove; exit codes (2 refused) and --json output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from console.cli import app
from ledger import Ledger
from tests.support.corpus import record_note
from tests.support.driver import Driver, driver

MODULES = ["tests.workflows_ops"]


@pytest.fixture()
def drv(settings_env: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    env = {**settings_env, "ONWARD_WORKFLOWS": ",".join(MODULES), "ONWARD_AUTH": "off",
           "ONWARD_TEST_OPS_CALLS": str(tmp_path / "tool.log")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("ONWARD_TOKEN", raising=False)
    monkeypatch.delenv("ONWARD_TEST_OPS_VARIANT", raising=False)
    with driver(Ledger.from_env(), MODULES) as running:
        yield running


def onward(*args: str, code: int = 0, input: str | None = None) -> str:
    """Run the CLI; returns stdout (with --json, only the JSON), or all output on refusal."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "220"}, input=input)
    assert result.exit_code == code, (result.exit_code, result.output)
    return result.stdout if code == 0 else result.output


def test_corpus_cli__pin_list_export_import_remove(drv: Driver, tmp_path: Path) -> None:
    """Invariant: the CLI pins what the filter names, exports a bundle whose digest it
    prints, imports it back (nothing new: the runs are here), refuses a bundle edited after
    export (exit 2), and removes the corpus with its pins."""
    runs = [record_note(drv, f"cli{i}") for i in range(2)]
    pinned = json.loads(onward("corpus", "add", "cli", "--workflow", "test_ops_notes",
                               "--json"))
    assert pinned["added"] == 2
    assert "cli" in onward("corpus", "ls")
    shown = json.loads(onward("corpus", "show", "cli", "--json"))
    assert sorted(r["run_id"] for r in shown["runs"]) == sorted(map(str, runs))
    bundle = tmp_path / "cli.jsonl.gz"
    exported = json.loads(onward("corpus", "export", "cli", str(bundle), "--json"))
    assert bundle.is_file() and len(exported["digest"]) == 64
    imported = json.loads(onward("corpus", "import", str(bundle), "--name", "copy", "--json"))
    assert (imported["added"], len(imported["present"])) == ([], 2)
    plain = tmp_path / "cli.jsonl"
    onward("corpus", "export", "cli", str(plain))
    plain.write_text(plain.read_text().replace("cli0", "CLI0", 1))
    assert "changed after export" in onward("corpus", "import", str(plain), code=2)
    onward("corpus", "add", "cli", "--run", str(runs[0])[:8], "--status", "running", code=2)
    onward("corpus", "rm", "copy", "--yes")
    assert "copy" not in onward("corpus", "ls")


def test_corpus_cli_rm__refused_before_the_question(drv: Driver) -> None:
    """Given a corpus that does not exist, corpus rm refuses before it asks, with the
    ledger's words and exit 2, the refusal audited once; it asked "delete corpus …?" and
    refused only after a "y". A corpus that exists is still asked about."""
    record_note(drv, "rm")
    onward("corpus", "add", "kept", "--workflow", "test_ops_notes")
    refused = onward("corpus", "rm", "gone", "--reason", "tidy", input="y\n", code=2)
    assert "delete corpus gone?" not in refused
    assert "refused: no corpus 'gone' in tenant 'default' (onward corpus ls)" in refused
    assert "delete corpus kept?" in onward("corpus", "rm", "kept", input="n\n", code=1)
    assert "kept" in onward("corpus", "ls")
    audit = json.loads(onward("audit", "ls", "--action", "corpus_remove", "--json"))
    assert [(a["outcome"], a["details"]["type"]) for a in audit] == [
        ("refused", "UnknownCorpus")]


def test_corpus_cli_replay__reports_passes_fails_and_opens_divergent_runs(
        drv: Driver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: ``corpus replay`` exits 0 when every run is identical and 1 when a run
    diverges beyond what is allowed (``--allow`` lets a kind pass); it writes the same
    report as JSON, Markdown and JUnit XML; the replay by name writes nothing to the ledger,
    and ``--open-branches`` (with a reason) opens each divergent replay under its recorded
    run: stopped, verifying, audited."""
    from tests.support.corpus import table_digest
    runs = [record_note(drv, f"r{i}") for i in range(2)]
    onward("corpus", "add", "c", "--workflow", "test_ops_notes")
    before = table_digest(drv.ledger.engine)
    same = onward("corpus", "replay", "c", "--code", "tests.workflows_ops", "--jobs", "1")
    assert "passed" in same and "2 identical" in same
    assert table_digest(drv.ledger.engine) == before
    monkeypatch.setenv("ONWARD_TEST_OPS_VARIANT", "reworded")
    files = {kind: tmp_path / f"report.{kind}" for kind in ("md", "xml", "json")}
    failed = onward("corpus", "replay", "c", "--code", "tests.workflows_ops", "--jobs", "1",
                    "--markdown", str(files["md"]), "--junit", str(files["xml"]), "--json",
                    str(files["json"]), code=1)
    assert "FAILED" in failed and "request_differs" in failed and "+Give me a summary" in failed
    report = json.loads(files["json"].read_text())
    assert (report["passed"], report["summary"]["divergent"]) == (False, 2)
    assert "## Corpus replay: FAILED" in files["md"].read_text()
    assert files["xml"].read_text().count("<failure") == 2
    onward("corpus", "replay", "c", "--code", "tests.workflows_ops", "--jobs", "1",
           "--allow", "request_differs", "--format", "json")
    assert table_digest(drv.ledger.engine) == before
    onward("corpus", "replay", "c", "--code", "tests.workflows_ops", "--open-branches",
           code=2)  # a write to the ledger needs a reason
    onward("corpus", "replay", "c", "--code", "tests.workflows_ops", "--jobs", "1",
           "--open-branches", "--reason", "review the reworded prompt", code=1)
    for run_id in runs:
        children = drv.ledger.children(run_id)
        assert [(c.status.value, c.mode) for c in children] == [("diverged", "evidence")]
        assert drv.ledger.verify_run(children[0].id) == []
    opened = [a for a in drv.ledger.audit(action="replay") if a.outcome == "done"]
    assert sorted(str(a.run_id) for a in opened) == sorted(map(str, runs))
    assert opened[0].reason == "review the reworded prompt"
    assert "cannot load" in onward("corpus", "replay", "c", "--code", "no.such.module",
                                   code=2)
