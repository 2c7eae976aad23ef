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


def onward(*args: str, code: int = 0) -> str:
    """Run the CLI; returns stdout (with --json, only the JSON), or all output on refusal."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "220"})
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
