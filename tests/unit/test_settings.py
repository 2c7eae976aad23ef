"""Settings live in settings classes (docs/configuration.md): no module outside a
``settings.py`` reads an ``ONWARD_`` variable from ``os.environ``, and the configuration
page lists every field of every settings class, with the default the code has."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pydantic_settings import BaseSettings

from examples.settings import ExampleSettings
from ledger.settings import OnwardSettings, TracingSettings
from tasks.settings import CredentialSettings, FaultSettings
from workers.settings import LogSettings

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ledger", "tasks", "workers", "console", "examples")
SETTINGS: tuple[type[BaseSettings], ...] = (
    OnwardSettings, TracingSettings, CredentialSettings, FaultSettings, LogSettings,
    ExampleSettings,
)


def _environ_reads(source: str) -> list[str]:
    """The ``ONWARD_`` names ``source`` reads with ``os.environ.get``, ``os.environ[...]``
    or ``os.getenv`` (writes, removals and copies for a child process are not reads)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and node.args and ast.unparse(node.func) in (
                "os.environ.get", "os.getenv", "environ.get", "getenv"):
            key = node.args[0]
        elif (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
              and ast.unparse(node.value) in ("os.environ", "environ")):
            key = node.slice
        if key is None:
            continue
        text = key.value if isinstance(key, ast.Constant) else ast.unparse(key)
        if isinstance(text, str) and "ONWARD_" in text:
            found.append(text)
    return found


def test_onward_variables__are_read_by_settings_classes_only() -> None:
    """Outside a settings module, nothing reads an ONWARD_ variable from the environment
    directly. (A tool's credential value, ``ONWARD_SECRET_<NAME>``, is read by name in
    tasks/credentials.py: a secret, not a setting, and its names are the tools'.)"""
    offenders = {str(path.relative_to(ROOT)): reads for package in PACKAGES
                 for path in sorted((ROOT / package).rglob("*.py"))
                 if path.name != "settings.py" and (reads := _environ_reads(path.read_text()))}
    assert offenders == {}


def test_the_check__sees_a_direct_read() -> None:
    """The rule above can fail: each way of reading a variable is found."""
    source = ('import os\nos.environ.get("ONWARD_A", "")\nos.environ["ONWARD_B"]\n'
              'os.getenv("ONWARD_C")\nos.environ.pop("ONWARD_D", None)\n'
              'env = {**os.environ, "ONWARD_E": "1"}\nos.environ.get("HOME")\n')
    assert _environ_reads(source) == ["ONWARD_A", "ONWARD_B", "ONWARD_C"]


def test_configuration_doc__lists_every_setting_with_its_default() -> None:
    """docs/configuration.md has a row for every field of every settings class, and a
    number's default there is the code's."""
    table = (ROOT / "docs" / "configuration.md").read_text()
    for settings in SETTINGS:
        for name, field in settings.model_fields.items():
            variable = f"ONWARD_{name.upper()}"
            row = re.search(rf"^\| `{variable}` \| ([^|]*) \|", table, re.MULTILINE)
            assert row is not None, f"{variable} ({settings.__name__}) is not in the page"
            default = field.default
            shown = str(default).lower() if isinstance(default, bool) else default
            if isinstance(shown, (int, float, str)) and shown != "":
                assert row.group(1).strip() == f"`{shown}`", variable
