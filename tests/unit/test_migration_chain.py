"""The migrations form one line: each file's number is its revision, no two files share a
revision (Alembic keeps only one of two files with the same id, silently), each revises the
one before it, and the last is the revision the code requires (``ledger.db.HEAD_REVISION``).
Two branches landing a migration with the same number is the case this catches."""

from __future__ import annotations

import ast
from pathlib import Path

from ledger.db import HEAD_REVISION

VERSIONS = Path(__file__).resolve().parents[2] / "ledger" / "migrations" / "versions"


def _assigned(path: Path, name: str) -> str | None:
    for node in ast.parse(path.read_text()).body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            value = node.value
            return value.value if isinstance(value, ast.Constant) else None
    raise AssertionError(f"{path.name} assigns no {name}")


def test_migrations__one_numbered_line_ending_at_the_head_revision() -> None:
    files = sorted(VERSIONS.glob("[0-9][0-9][0-9][0-9]_*.py"))
    assert files, VERSIONS
    numbers = [path.name[:4] for path in files]
    assert len(set(numbers)) == len(numbers), \
        f"two migrations share a number: {sorted(n for n in numbers if numbers.count(n) > 1)}"
    previous = None
    for path in files:
        assert _assigned(path, "revision") == path.name[:4], path.name
        assert _assigned(path, "down_revision") == previous, path.name
        previous = path.name[:4]
    assert previous == HEAD_REVISION
