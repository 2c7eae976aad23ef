"""What ``onward … --help`` shows a newcomer: each command's summary in its group's list is
one paragraph, reflowed to the terminal, not the source's line breaks."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import typer
from typer.testing import CliRunner

from console.cli import app

__all__: list[str] = []


def _groups() -> list[list[str]]:
    """The argument paths of the root and every command group (``[]``, ``["runs"]``, …)."""
    root = typer.main.get_command(app)
    return [[], *([name] for name, command in root.commands.items()  # type: ignore[attr-defined]
                  if hasattr(command, "commands"))]


@pytest.mark.parametrize("group", _groups(), ids=lambda g: " ".join(["onward", *g]))
def test_cli_help__each_summary_is_one_row_on_a_wide_terminal(group: list[str]) -> None:
    """At 1,000 columns every summary fits on its command's row: a row of the commands panel
    with an empty name column is a line break carried over from a docstring."""
    shown = CliRunner().invoke(app, [*group, "--help"], env={"COLUMNS": "1000"})
    assert shown.exit_code == 0, shown.output
    panel = shown.output.partition("Commands")[2]
    broken = [row.strip("│ ") for row in panel.splitlines() if re.match(r"│ {3,}\S", row)]
    assert panel and not broken, broken


def _commands() -> list[list[str]]:
    """The argument path of every command: the root, each group and each command in them,
    at any depth, as the CLI is built (no hand-kept list to forget one in)."""
    def walk(command: object, path: list[str]) -> Iterator[list[str]]:
        yield path
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    return list(walk(typer.main.get_command(app), []))


@pytest.mark.parametrize("command", _commands(), ids=lambda c: " ".join(["onward", *c]))
def test_cli_help__flags_show_no_type(command: list[str]) -> None:
    """A boolean option is a plain flag in ``--help``: no ``<bool>`` after it (typer's rich
    help printed one after every flag, ``--help`` included, as if it took a value)."""
    shown = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "--help" in shown.output and "<bool>" not in shown.output, shown.output


# what typer or Python prints when a help text leaks its source: a type in angle brackets
# (<str>, <int range>, <list[str]>), an argument's Python name in braces ({run_id}), a repr
_PLACEHOLDERS = re.compile(r"<[^<>\s]*(?:\s[^<>\s]+)*>|\{[A-Za-z_:]+\}|object at 0x|"
                           r"<function|<class|PosixPath\(|Annotated\[|NoneType|typing\.")


@pytest.mark.parametrize("command", _commands(), ids=lambda c: " ".join(["onward", *c]))
def test_cli_help__renders_with_no_placeholder(command: list[str]) -> None:
    """Every command's ``--help`` (the root, each group, each command, as the CLI is built)
    renders, exit 0, under the name a person types, with no placeholder or repr: typer 0.29
    showed each option's type as ``<str>``/``<int range>``/``<list[str]>``, each argument
    as ``run_id  <str>`` and the usage line's as ``{run_id}``; click's words now (TEXT,
    INTEGER, [a|b], RUN)."""
    shown = CliRunner().invoke(app, [*command, "--help"], prog_name="onward",
                               env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert f"Usage: {' '.join(['onward', *command])} [OPTIONS]" in shown.output, shown.output
    assert not _PLACEHOLDERS.findall(shown.output), (_PLACEHOLDERS.findall(shown.output),
                                                     shown.output)


def test_cli_help__an_argument_is_named_as_its_command_says() -> None:
    """The usage line names arguments in capitals, bare when required and in brackets when
    optional, as the commands' summaries name them ("Start a run of WORKFLOW")."""
    def usage(*command: str) -> str:
        shown = CliRunner().invoke(app, [*command, "--help"], prog_name="onward",
                                   env={"COLUMNS": "200"})
        return next(line.strip() for line in shown.output.splitlines() if "Usage:" in line)

    assert usage("start") == "Usage: onward start [OPTIONS] WORKFLOW"
    assert usage("runs", "signal") == "Usage: onward runs signal [OPTIONS] RUN NAME"
    assert usage("keys", "new") == "Usage: onward keys new [OPTIONS] [KEY_ID]"
    assert usage("verify") == "Usage: onward verify [OPTIONS] [RUN | ANCHOR]"
