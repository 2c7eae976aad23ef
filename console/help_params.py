"""How ``onward … --help`` names the parameters: the words a person reads, not typer's
placeholders.

Typer 0.29's rich help shows each option's type as a Python annotation in angle brackets
(``<str>``, ``<int range>``, ``<list[str]>``, ``<bool>`` after a flag as if it took a
value), each argument by its Python parameter name with the same type after it, and the
usage line's required arguments in braces (``onward runs show [OPTIONS] {run_id}``).
``plain_params`` gives the params of a command the names click's own help uses: ``TEXT``,
``INTEGER``, ``PATH``, choices as ``[a|b]``, flags with no type, arguments in capitals
(``WORKFLOW``, as the commands' docstrings name them) and bare in the usage line
(``[KEY_ID]`` when optional). tests/unit/test_cli_help.py walks every command's help.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperOption

__all__ = ["plain_params", "plain_type"]


_WORDS = {"str": "TEXT", "int": "INTEGER", "int range": "INTEGER", "float": "FLOAT",
          "float range": "FLOAT", "path": "PATH", "file": "FILE", "UUID": "UUID",
          "datetime": "DATETIME", "bool": ""}


def plain_type(shown: str | None) -> str | None:
    """Typer's type label (``<str>``, ``<list[int]>...``, ``<a|b>``) in click's words
    (``TEXT``, ``INTEGER...``, ``[a|b]``); a metavar a command set is kept as it is."""
    if not shown:
        return shown
    label, dots = (shown[:-3], "...") if shown.endswith("...") else (shown, "")
    if not (label.startswith("<") and label.endswith(">")):
        return shown
    label = label[1:-1]
    if label.startswith("list[") and label.endswith("]"):
        label = label[5:-1]
    word = _WORDS.get(label)
    if word is None:
        word = f"[{label}]" if "|" in label else label.upper()
    return word + dots if word else word


class _PlainOption(TyperOption):
    def display_type_rich(self, ctx: Any) -> str | None:
        if self.is_flag:
            return None  # a flag takes no value
        return plain_type(super().display_type_rich(ctx))


class _PlainArgument(TyperArgument):
    def display_type_rich(self, ctx: Any) -> str | None:
        return plain_type(super().display_type_rich(ctx))

    def _usage_display_name(self) -> str:
        name = self.display_name_raw
        if not self.required and not name.startswith("["):
            name = f"[{name}]"
        return f"{name}..." if self.nargs != 1 else name


def plain_params(params: list[Any]) -> list[Any]:
    """``params`` (a command's, as ``get_params`` gives them) shown in plain words: each
    typer option and argument becomes its subclass above (same object, same behaviour but
    for how help names it), an argument without a metavar is named in capitals, and a
    flag's metavar is empty (the plain-text help, without rich, leaves its type out)."""
    for param in params:
        if type(param) is TyperOption:
            param.__class__ = _PlainOption
        elif type(param) is TyperArgument:
            param.__class__ = _PlainArgument
            if param.metavar is None and param.name:
                param.metavar = param.name.upper()
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""
    return params
