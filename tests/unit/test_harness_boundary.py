"""The process harness (harness/) serves tests, benchmarks and examples; the product
packages never import it, so an installed onward does not depend on it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("ledger", "tasks", "workers", "console")


def _imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_product_packages__never_import_the_harness() -> None:
    """No module of ledger, tasks, workers or console imports harness (at any depth of
    the file, lazily or not)."""
    offenders = [str(path.relative_to(ROOT)) for package in PRODUCT
                 for path in sorted((ROOT / package).rglob("*.py"))
                 if any(m == "harness" or m.startswith("harness.")
                        for m in _imported_modules(path))]
    assert offenders == []


def test_harness__is_what_tests_benchmarks_and_the_demo_use() -> None:
    """The one copy of the process helpers: the tests' cluster, the benchmarks and the demo
    import it, and no second Proc or wait_for is defined outside it."""
    users = {"tests/support/cluster.py", "bench/steps.py", "bench/waiting.py",
             "bench/chaos/fleet.py", "examples/demo.py"}
    for name in users:
        assert any(m.startswith("harness") for m in _imported_modules(ROOT / name)), name
    copies = []
    for folder in ("tests", "bench", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            copies += [f"{path.relative_to(ROOT)}:{node.name}" for node in ast.walk(tree)
                       if isinstance(node, ast.ClassDef | ast.FunctionDef)
                       and node.name in ("Proc", "wait_for", "create_database")]
    assert copies == []
