"""Errors are defined in each package's ``exceptions.py`` and all derive from
``OnwardError`` (issue 12 item 3), so an application can catch everything onward raises
with one ``except`` and a reader finds every error of a package in one file."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

from ledger.exceptions import OnwardError

PRODUCT = ("ledger", "tasks", "workers", "console")
# Not errors: a step's wait or park unwinds as a BaseException so that ``except Exception``
# in step code cannot swallow it; a private signal inside canonical JSON's depth walk.
NOT_ERRORS = {"tasks.control.Suspend", "ledger.checkpoints._TooDeep"}


def product_modules() -> list[ModuleType]:
    """Every module of the product packages but the migrations and ``python -m console``."""
    found = []
    for name in PRODUCT:
        package = importlib.import_module(name)
        found.append(package)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            if ".migrations" in info.name or info.name == "console.__main__":
                continue
            found.append(importlib.import_module(info.name))
    return found


def defined_exceptions() -> list[tuple[str, type[BaseException]]]:
    return [(f"{module.__name__}.{name}", value) for module in product_modules()
            for name, value in vars(module).items()
            if inspect.isclass(value) and issubclass(value, BaseException)
            and value.__module__ == module.__name__]


def test_exceptions__live_in_exceptions_modules() -> None:
    """No error class is defined outside a package's ``exceptions.py``."""
    elsewhere = [name for name, _ in defined_exceptions()
                 if not name.rsplit(".", 1)[0].endswith(".exceptions") and name not in NOT_ERRORS]
    assert elsewhere == []


def test_exceptions__all_derive_from_onward_error() -> None:
    """Every error class of ledger, tasks, workers and console is an OnwardError (ToolError
    included), and each is listed in its module's ``__all__``."""
    errors = [(name, value) for name, value in defined_exceptions() if name not in NOT_ERRORS]
    assert len(errors) >= 30
    assert [name for name, value in errors if not issubclass(value, OnwardError)] == []
    unlisted = [name for name, value in errors
                if value.__name__ not in getattr(importlib.import_module(value.__module__),
                                                 "__all__", ())]
    assert unlisted == []
