"""Only ``ledger/`` talks to the database driver: tasks, workers, console and the examples
call ledger functions and never import SQLAlchemy or psycopg (docs/design.md, "Where SQL
lives"); nor does the process harness, which creates and drops databases through
ledger/admin.py. Tests and the benchmarks may, where they inspect databases directly."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_harness_boundary import ROOT, _imported_modules

DRIVERS = ("sqlalchemy", "psycopg", "psycopg_pool", "alembic")
OUTSIDE_LEDGER = ("tasks", "workers", "console", "examples", "harness")


def _imports_a_driver(path: Path) -> list[str]:
    return sorted(m for m in _imported_modules(path)
                  if any(m == d or m.startswith(f"{d}.") for d in DRIVERS))


def test_packages_outside_ledger__never_import_the_database_driver() -> None:
    """No module of tasks, workers, console, examples or harness imports sqlalchemy,
    psycopg, psycopg_pool or alembic (at any depth of the file, lazily or not)."""
    offenders = {str(path.relative_to(ROOT)): found for package in OUTSIDE_LEDGER
                 for path in sorted((ROOT / package).rglob("*.py"))
                 if (found := _imports_a_driver(path))}
    assert offenders == {}


def test_the_check__sees_a_driver_import(tmp_path: Path) -> None:
    """The rule above can fail: a lazy import inside a function is found."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from psycopg.types.json import Jsonb\n    return Jsonb\n")
    assert _imports_a_driver(module) == ["psycopg.types.json"]


LOWER = {"ledger": ("tasks", "workers", "console"), "tasks": ("workers", "console")}


def _imports_above(path: Path, above: tuple[str, ...]) -> list[str]:
    return sorted(m for m in _imported_modules(path)
                  if any(m == p or m.startswith(f"{p}.") for p in above))


def test_dependencies__flow_one_way() -> None:
    """console, workers -> tasks -> ledger (docs/design.md, "Packages"): the ledger imports
    none of the others (not ``workers.settings`` either: a worker's settings are not the
    ledger's business), and tasks neither workers nor console."""
    offenders = {str(path.relative_to(ROOT)): found for package, above in LOWER.items()
                 for path in sorted((ROOT / package).rglob("*.py"))
                 if (found := _imports_above(path, above))}
    assert offenders == {}


def test_the_direction_check__sees_an_upward_import(tmp_path: Path) -> None:
    """The rule above can fail: a lazy import of a worker's settings is found."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from workers.settings import WorkerSettings\n")
    assert _imports_above(module, LOWER["ledger"]) == ["workers.settings"]
