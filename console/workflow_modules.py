"""The user's workflow modules (``ONWARD_WORKFLOWS``), as the CLI finds and imports them.

``onward`` is a console script: Python puts its directory (``.venv/bin``) on ``sys.path``,
not the folder it is run from, so a module beside the operator (``myapp/agents.py``) would
not be found. ``cwd_on_path`` puts the current directory first, as ``celery -A proj worker``
(and ``python -m``) do; it stays there, so a prefork worker's pool children, forked from
the worker, inherit it. A module that cannot be imported ends the command with one
paragraph saying which and why (exit 2); the traceback is printed too at the debug log
level (``--loglevel debug`` or ``ONWARD_LOG_LEVEL=debug``).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import TYPE_CHECKING

from console.common import EXIT_REFUSED, fail

if TYPE_CHECKING:
    from tasks.workflow import Registry

__all__ = ["cwd_on_path", "load_workflows"]


def cwd_on_path() -> None:
    """Put the current directory first on ``sys.path`` unless it is there already (as
    itself, or as ``''``, which Python reads as the current directory)."""
    try:
        cwd = os.getcwd()
    except OSError:  # the directory was removed under us: nothing to add
        return
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def load_workflows(modules: list[str], *, debug: bool) -> Registry:
    """A registry of the workflows in ``modules``; exit 2 with a one-paragraph reason if one
    cannot be imported (its traceback first when ``debug``) or declares its workflows
    wrongly."""
    from tasks.exceptions import WorkflowDefinitionError
    from tasks.workflow import Registry

    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # an error of the user's code at import, whatever it is
            if debug:
                traceback.print_exception(exc, file=sys.stderr)
            fail(_cannot_import(module, exc, debug=debug), EXIT_REFUSED)
    registry = Registry()
    try:
        registry.load_modules(modules)  # imported above: registers what they define
    except WorkflowDefinitionError as exc:
        fail(str(exc), EXIT_REFUSED)
    return registry


def _cannot_import(module: str, exc: Exception, *, debug: bool) -> str:
    """Which module, why (tasks/workflow_modules.py), and how to see the traceback."""
    from tasks.workflow_modules import cannot_import

    more = "" if debug else "; --loglevel debug (or ONWARD_LOG_LEVEL=debug) prints the traceback"
    return cannot_import(module, exc) + more
