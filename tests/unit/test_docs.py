"""The repository explains itself: every relative link in its Markdown resolves (file and
heading anchor), every ``docs/…`` path named in code exists, and nothing points to a
design document outside the repository. What the README and docs/ name exists: each
``onward`` command with its options, each ``ONWARD_`` variable, each dotted code name."""

from __future__ import annotations

import functools
import re
import subprocess
import unicodedata
from pathlib import Path
from typing import Any

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


# What the README and docs/ name must exist: the `onward` commands and their options, the
# ONWARD_ variables, and the code they cite by name (a renamed statement constant, say).
_PROSE = ("README.md", "docs", "examples/README.md")
_PACKAGES = ("ledger", "tasks", "workers", "console")
_SPAN = re.compile(r"`([^`\n]+)`")
_CALL = re.compile(r"(?:^|[\s(;|&])onward((?:[ \t]+[^\s`#;|&)]+)*)")
_VARIABLE = re.compile(r"\bONWARD_[A-Z0-9_]+")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_TYPO_EXAMPLES = {"ONWARD_QUEUEE"}  # docs/configuration.md: what a misspelt variable gets
_FILE_TYPES = (".py", ".md", ".sql", ".json", ".yaml", ".toml", ".html")


def _prose() -> list[Path]:
    return [p for p in _tracked(".md")
            if str(p.relative_to(ROOT)).startswith(_PROSE)]


def _code_of(markdown: Path, fenced_too: bool = True) -> list[tuple[int, str]]:
    """(line number, text) of each inline code span and each line of a fenced block."""
    found, fenced = [], False
    for number, line in enumerate(markdown.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif fenced:
            found += [(number, line)] if fenced_too else []
        else:
            found += [(number, span) for span in _SPAN.findall(line)]
    return found


@functools.cache
def _cli() -> Any:
    import typer

    from console.cli import app

    return typer.main.get_command(app)


def _command_problem(words: list[str]) -> str | None:
    command, path = _cli(), ["onward"]
    while hasattr(command, "commands") and words and not words[0].startswith("-"):
        name = words.pop(0)
        if name not in command.commands:
            return f"{' '.join(path)} has no command {name!r}"
        command, path = command.commands[name], [*path, name]
    known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    unknown = [w.partition("=")[0] for w in words if w.startswith("-") and not w[1:2].isdigit()
               and w.partition("=")[0] not in known]
    return f"{' '.join(path)} has no option {unknown}" if unknown else None


def test_docs__every_onward_command_named_exists() -> None:
    """Each ``onward …`` in a code span or block is a command of the CLI, with options it
    has (a command word that is not a lower-case name, e.g. prose, is not checked)."""
    wrong = []
    for markdown in _prose():
        for number, code in _code_of(markdown):
            for call in _CALL.finditer(code):
                words = call.group(1).split()
                if words and re.fullmatch(r"[a-z][a-z-]*", words[0]):
                    problem = _command_problem(words)
                    if problem:
                        wrong.append(f"{markdown.relative_to(ROOT)}:{number}: {problem}")
    assert not wrong, wrong


def test_docs__every_onward_variable_named_exists() -> None:
    """Each ``ONWARD_…`` variable the docs name is read by a settings class, or named in
    the code, compose file or scripts that read it (a prefix such as ``ONWARD_SECRET_``
    matches the variables it begins)."""
    from console.settings import known_variables

    sources = [s for s in _tracked(".py", ".yaml", ".yml", ".sh", "Makefile", "Dockerfile",
                                   ".toml") if "tests/unit" not in str(s)]  # typos on purpose
    named = set(known_variables()) | _TYPO_EXAMPLES | {
        v for source in sources for v in _VARIABLE.findall(source.read_text())}
    unknown = sorted({f"{markdown.relative_to(ROOT)}: {variable}" for markdown in _prose()
                      for variable in _VARIABLE.findall(markdown.read_text())
                      if variable not in named and not (variable.endswith("_") and any(
                          n.startswith(variable) for n in named))})
    assert not unknown, unknown


def _module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent is a module, not a package
        return False


def _resolves(name: str, modules: dict[str, list[str]]) -> bool | None:
    """Whether ``name`` (``ledger.db.snapshot``, ``steps._COMMIT``) names something in the
    code; None when it is not one of ours to check (``runs.status``, a column)."""
    import importlib

    parts = name.split(".")
    if parts[0] in _PACKAGES:
        head = next(i for i in range(len(parts), 0, -1) if _module(".".join(parts[:i])))
        target: object = importlib.import_module(".".join(parts[:head]))
    elif re.fullmatch(r"_[A-Z][A-Z0-9_]*", parts[-1]) and len(modules.get(parts[0], ())) == 1:
        target, head = importlib.import_module(modules[parts[0]][0]), 1
    else:
        return None
    for part in parts[head:]:
        if not hasattr(target, part):
            return False
        target = getattr(target, part)
    return True


def test_docs__code_named_by_its_dotted_name_exists() -> None:
    """A dotted name in an inline code span that starts with a package
    (``ledger.db.snapshot``) or names a module's statement constant
    (``evidence._FIND_OR_COVER``) exists. Fenced blocks are examples: their names are
    local variables (``ledger.wait`` of ``ledger = Ledger.from_env()``)."""
    modules: dict[str, list[str]] = {}
    for package in _PACKAGES:
        for module in sorted((ROOT / package).glob("*.py")):
            modules.setdefault(module.stem, []).append(f"{package}.{module.stem}")
    missing = [f"{markdown.relative_to(ROOT)}:{number}: {name}"
               for markdown in _prose() for number, code in _code_of(markdown, False)
               for name in _DOTTED.findall(code)
               if not name.endswith(_FILE_TYPES) and _resolves(name, modules) is False]
    assert not missing, missing


_SHELL_BLOCK = re.compile(r"^```(?:sh|bash|shell|console)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _unquoted_globs(script: str) -> list[str]:
    """Words of a shell script with ``?`` or ``*`` outside quotes and comments: the shell
    expands them as file patterns (zsh, macOS's shell, refuses the command when nothing
    matches: ``no matches found: http://…/runs?status=…``)."""
    found, word, quote, comment = [], "", "", False
    for char in script + "\n":
        if comment:
            comment = char != "\n"
        elif quote:
            quote = "" if char == quote else quote
            word += char
        elif char in "'\"":
            quote, word = char, word + char
        elif char == "#" and not word:
            comment = True
        elif char.isspace():
            if re.search(r"[?*]", re.sub(r"'[^']*'|\"[^\"]*\"", "", word)):
                found.append(word)
            word = ""
        else:
            word += char
    return found


def test_docs__shell_commands_quote_their_patterns() -> None:
    """A command in a shell block can be pasted as it is: a URL with a query string or any
    other word with ``?`` or ``*`` is quoted."""
    unquoted = [f"{markdown.relative_to(ROOT)}: {word}" for markdown in _prose()
                for block in _SHELL_BLOCK.findall(markdown.read_text())
                for word in _unquoted_globs(block)]
    assert not unquoted, unquoted


def _commands_with(option: str) -> set[str]:
    found: set[str] = set()

    def walk(command: Any, path: list[str]) -> None:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                walk(sub, [*path, name])
        elif any(option in p.opts for p in command.params):
            found.add(" ".join(path))

    walk(_cli(), [])
    return found


def test_docs__the_commands_that_ask_first_are_the_ones_named() -> None:
    """docs/operating.md names the commands that ask before acting; they are exactly the
    CLI's commands with ``--yes`` (it said every command that changes something asks:
    tokens, retention and others act at once)."""
    text = " ".join((ROOT / "docs/operating.md").read_text().split())
    found = re.search(r"The commands that act on [^(]*\(([^)]*)\) print what they will do and "
                      r"ask first", text)
    assert found, "docs/operating.md no longer says which commands ask first"
    named = {" ".join([*words[:-1], last]) for span in _SPAN.findall(found.group(1))
             for words in [span.split()] for last in words[-1].split("|")}
    assert named == _commands_with("--yes")
