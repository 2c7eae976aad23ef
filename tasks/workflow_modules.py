"""Importing the user's workflow modules (``ONWARD_WORKFLOWS``) with one clear error.

A module that cannot be imported (not found, raising at import, not parsing) is a
``WorkflowModuleUnimportable`` whose message is one paragraph: which module, the
exception's type and message, and, for a module not found, where it was looked for. The
original exception is its ``__cause__``. ``onward worker`` (console/workflow_modules.py),
the state check of ``runs branch`` and the tool lookup of ``effects repeat``
(tasks/operator.py) use it, so each says the same thing instead of a traceback.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from tasks.exceptions import WorkflowModuleUnimportable

__all__ = ["cannot_import", "import_workflow_module"]


def import_workflow_module(module: str) -> ModuleType:
    """Import ``module``; any exception at import is a ``WorkflowModuleUnimportable``."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # an error of the user's code at import, whatever it is
        raise WorkflowModuleUnimportable(cannot_import(module, exc)) from exc


def cannot_import(module: str, exc: BaseException) -> str:
    """Which module, why, and (for a module not found) where it was looked for."""
    why = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ModuleNotFoundError) and _is_part_of(exc.name, module):
        why += (f". ONWARD_WORKFLOWS names modules as package.module (e.g. myapp.agents for "
                f"myapp/agents.py), imported from the current directory "
                f"({_cwd()}) or sys.path (PYTHONPATH, installed packages); run the command "
                f"from the folder that holds the package, or install it")
    elif isinstance(exc, ImportError):
        why += " (raised by an import inside the module)"
    else:
        why += " (raised while the module was imported)"
    return (f"cannot import workflow module {module!r} (named in ONWARD_WORKFLOWS or "
            f"--workflows): {why}")


def _is_part_of(missing: str | None, module: str) -> bool:
    """``missing`` is ``module`` or one of its parent packages (not a module it imports)."""
    return missing is not None and (module == missing or module.startswith(missing + "."))


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:
        return "removed"
