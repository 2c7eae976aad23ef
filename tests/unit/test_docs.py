"""The repository explains itself: every relative link in its Markdown resolves (file and
heading anchor), every ``docs/…`` path named in code exists, and nothing points to a
design document outside the repository."""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_DOCS_PATH = re.compile(r"\bdocs/[\w./-]+\.md\b")
_CODE_DIRS = ("ledger", "tasks", "workers", "console", "examples", "bench", "tests", "deploy")


def _tracked(*suffixes: str) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / name for name in listed.split() if name.endswith(suffixes)
            and (ROOT / name).exists()]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = unicodedata.normalize("NFKC", heading.strip().lower())
    text = re.sub(r"[`*_]", "", text)
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"\s", "-", text)


def _anchors(markdown: Path) -> set[str]:
    found: set[str] = set()
    in_code = False
    for line in markdown.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(_slug(line.lstrip("#")))
    return found


def _links(markdown: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", markdown.read_text(), flags=re.DOTALL)
    return [m for m in _LINK.findall(text) if not re.match(r"^[a-z]+:", m)]


@pytest.mark.parametrize("markdown", _tracked(".md"), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs__every_relative_link_resolves(markdown: Path) -> None:
    """Each relative link of a Markdown file names a file or directory that exists, and its
    ``#anchor`` (if any) a heading of that file."""
    broken = []
    for link in _links(markdown):
        target, _, anchor = link.partition("#")
        path = (markdown.parent / target).resolve() if target else markdown
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading #{anchor} in {path.name}")
    assert not broken, f"{markdown.relative_to(ROOT)}: {broken}"


def test_docs__paths_named_in_code_exist() -> None:
    """Every ``docs/….md`` a docstring or comment cites exists, and no file points to a
    design document that is not in the repository (the contract is docs/design.md)."""
    missing, outside = [], []
    for source in _tracked(".py", ".toml", ".yaml", ".yml", "Makefile", ".md"):
        relative = source.relative_to(ROOT)
        if relative.parts[0] not in (*_CODE_DIRS, "docs") and len(relative.parts) > 1:
            continue
        text = source.read_text(errors="replace")
        missing += [f"{relative}: {p}" for p in set(_DOCS_PATH.findall(text))
                    if not (ROOT / p).exists()]
        if re.search(r"\bDESIGN" r"\.md\b", text):
            outside.append(str(relative))
    assert not missing, missing
    assert not outside, f"cite docs/design.md, not a design document outside the repo: {outside}"
