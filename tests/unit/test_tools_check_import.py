"""``onward tools check MODULE:TOOL`` with a module that cannot be imported ends in one
paragraph and exit 2, as a workflow module does (tasks/workflow_modules.py): which module,
the exception's type and message, whether the module itself raised; no traceback. Nothing
is called: the tool is never found."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from console.cli import app

BROKEN = {
    "raises_at_import": ("raise RuntimeError('the CRM client needs CRM_URL')\n",
                         "RuntimeError: the CRM client needs CRM_URL (raised while the "
                         "module was imported)"),
    "does_not_parse": ("def tool(:\n", "SyntaxError: "),
    "imports_a_missing_package": ("import no_such_crm_sdk\n",
                                  "ModuleNotFoundError: No module named 'no_such_crm_sdk' "
                                  "(raised by an import inside the module)"),
}


@pytest.mark.parametrize("module", sorted(BROKEN))
def test_tools_check__a_module_that_cannot_be_imported_is_one_paragraph(
        module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source, said = BROKEN[module]
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(app, ["tools", "check", f"{module}:create", "--yes"],
                                env={"COLUMNS": "200"})
    out = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert f"cannot import tool module {module!r}: {said}" in out, out
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit), result.exception  # not a crash


def test_tools_check__a_module_not_found_says_where_it_was_looked_for() -> None:
    result = CliRunner().invoke(app, ["tools", "check", "no_such_tools:create", "--yes"],
                                env={"COLUMNS": "200"})
    out = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert ("cannot import tool module 'no_such_tools': ModuleNotFoundError: No module "
            "named 'no_such_tools' (imported from the current directory or sys.path") in out
