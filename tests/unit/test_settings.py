"""Settings live in settings classes (docs/configuration.md): no module outside a
``settings.py`` reads an ``ONWARD_`` variable from ``os.environ``, and the configuration
page lists every field of every settings class, with the default the code has. Each class
refuses a field it does not have when given one by name, yet reads the environment beside
the others' variables (they share the prefix); a variable no class reads is reported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from pydantic import ValidationError
from pydantic_settings import BaseSettings
from structlog.testing import capture_logs

from console.common import warn_unknown_variables
from console.settings import ONWARD_SETTINGS, ConsoleSettings, unknown_variables
from examples.settings import ExampleSettings
from ledger.settings import OnwardSettings
from workers.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ledger", "tasks", "workers", "console", "examples")
SETTINGS: tuple[type[BaseSettings], ...] = (*ONWARD_SETTINGS, ExampleSettings)


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


def test_each_class__refuses_a_field_it_does_not_have() -> None:
    """A worker's or the CLI's field given to the ledger's class (code written before they
    moved) is refused, not silently dropped; the class that has it takes it."""
    for settings, field in ((OnwardSettings, "queue"), (OnwardSettings, "token"),
                            (ConsoleSettings, "lease_ttl_s"), (WorkerSettings, "auth")):
        with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
            settings(**{field: "1"})
    assert WorkerSettings(queue="q").queue == "q"


def test_each_class__reads_its_own_variables_beside_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The classes share the prefix: one ignores the others' variables, and the variables
    (names and defaults) are those of before the split."""
    for variable, value in {"ONWARD_QUEUE": "q", "ONWARD_TOKEN": "onw_x", "ONWARD_AUTH": "off",
                            "ONWARD_TENANT_ID": "acme", "ONWARD_LEASE_TTL_S": "3"}.items():
        monkeypatch.setenv(variable, value)
    assert OnwardSettings().tenant_id == "acme"
    worker = WorkerSettings()
    assert (worker.tenant_id, worker.queue, worker.lease_ttl_s) == ("acme", "q", 3.0)
    cli = ConsoleSettings()
    assert (cli.tenant_id, cli.auth, cli.token is not None) == ("acme", False, True)
    assert WorkerSettings.of(OnwardSettings(tenant_id="t")).queue == "q"


def test_a_variable__has_one_default_in_every_class_that_reads_it() -> None:
    """The subclasses inherit the ledger's fields rather than declare them again; a class
    that does read another's variable itself (``FaultSettings.home``, so a fault check reads
    only its own) gives it the same default."""
    seen: dict[str, tuple[str, object]] = {}
    for settings in SETTINGS:
        for name in settings.__annotations__:
            if name not in settings.model_fields:
                continue
            default = settings.model_fields[name].get_default(call_default_factory=True)
            owner, first = seen.setdefault(name, (settings.__name__, default))
            assert first == default, f"{name}: {owner} and {settings.__name__} differ"
    assert "queue" not in OnwardSettings.model_fields  # a worker's: moved, not copied


def test_unknown_variables__name_the_typo_and_the_nearest_setting() -> None:
    """A variable no settings class reads is reported with the nearest known name; known
    variables, tools' credentials and other variables are not."""
    notes = unknown_variables({"ONWARD_QUEUEE": "q", "onward_lease_ttl": "3",
                               "ONWARD_QUEUE": "q", "ONWARD_AUTH": "off", "ONWARD_LOG_JSON": "1",
                               "ONWARD_SECRET_CRM": "x", "HOME": "/root"})
    assert notes == [
        "ONWARD_QUEUEE is set but no onward setting has that name; did you mean ONWARD_QUEUE?",
        "onward_lease_ttl is set but no onward setting has that name; did you mean "
        "ONWARD_LEASE_TTL_S?",
    ]


def test_unknown_variables__know_every_variable_the_test_suite_sets() -> None:
    """The suite gives its workflows' ``ONWARD_TEST_`` variables to the processes it starts
    (workers, dispatchers, reapers), which warn about unknown ones: every such name used
    under tests/ is a field of tests/settings.py, known to the check in a checkout as the
    examples' settings are."""
    names = {name for path in (ROOT / "tests").rglob("*.py")
             for name in re.findall(r"\bONWARD_TEST_[A-Z0-9_]+", path.read_text())}
    assert len(names) >= 10  # the scan finds them (ten when this test was written)
    assert unknown_variables(dict.fromkeys(names, "1")) == []


def test_a_process_start__logs_a_warning_naming_the_typo(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``onward worker``, ``dispatcher``, ``reaper``, ``metrics`` and ``console`` call
    when they start: one warning per unknown variable, none for known ones."""
    monkeypatch.setenv("ONWARD_REAPER_INTERVAL", "0.5")
    monkeypatch.setenv("ONWARD_REAPER_INTERVAL_S", "0.5")
    with capture_logs() as logs:
        warn_unknown_variables()
    assert [(entry["log_level"], entry["event"]) for entry in logs
            if "REAPER" in entry["event"]] == [
        ("warning", "ONWARD_REAPER_INTERVAL is set but no onward setting has that name; "
                    "did you mean ONWARD_REAPER_INTERVAL_S?")]
