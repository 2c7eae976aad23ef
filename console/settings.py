"""The CLI's own settings, read from the environment (prefix ``ONWARD_``): who it acts as
(``console/auth.py``); docs/configuration.md lists them all. And the check that names an
``ONWARD_`` variable no settings class reads (``unknown_variables``): the classes share the
prefix, so none of them can refuse another's variables, and a typo would go unnoticed."""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
from collections.abc import Mapping
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings

from ledger.settings import OnwardSettings, TracingSettings
from tasks.settings import CredentialSettings, FaultSettings
from workers.settings import LogSettings, WorkerSettings

__all__ = ["ONWARD_SETTINGS", "ConsoleSettings", "known_variables", "unknown_variables"]


class ConsoleSettings(OnwardSettings):
    """The ledger's settings plus the CLI's token and whether it may act without one."""

    token: SecretStr | None = Field(
        default=None,
        description="The CLI's token (from `onward tokens create`); it names the actor, role, "
        "approver roles and tenant. Read from token_file when unset.",
    )
    token_file: Path | None = Field(
        default=None,
        description="A file holding the CLI's token (mode 0600); default "
        "~/.config/onward/token when it exists.",
    )
    auth: bool = Field(
        default=True,
        description="Off (ONWARD_AUTH=off) lets the CLI act as the local admin on a configured "
        "database without a token; it says so on every command. The HTTP API always needs one.",
    )


ONWARD_SETTINGS: tuple[type[BaseSettings], ...] = (
    OnwardSettings, WorkerSettings, ConsoleSettings, LogSettings, TracingSettings,
    FaultSettings, CredentialSettings,
)
"""onward's settings classes, all of prefix ``ONWARD_``."""


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A note for each ``ONWARD_`` variable of ``environ`` that no settings class reads (a
    typo, or a setting that was removed), naming the nearest known one. A tool's credential
    (``ONWARD_SECRET_<NAME>``, docs/security.md) is not a setting and is not reported."""
    known = known_variables()
    notes = []
    for name in sorted(environ):
        variable = name.upper()
        if not variable.startswith("ONWARD_") or variable in known \
                or variable.startswith("ONWARD_SECRET_"):
            continue
        nearest = difflib.get_close_matches(variable.removeprefix("ONWARD_"),
                                            [k.removeprefix("ONWARD_") for k in known], n=1)
        hint = f"; did you mean ONWARD_{nearest[0]}?" if nearest else ""
        notes.append(f"{name} is set but no onward setting has that name{hint}")
    return notes


def known_variables() -> list[str]:
    """Every variable a loaded settings class of prefix ``ONWARD_`` reads: onward's (all
    imported here), a checkout's examples' and test workflows' when they are there, and any
    other loaded one (an application's own)."""
    return sorted({f"ONWARD_{name.upper()}" for settings in _settings_classes()
                   for name in settings.model_fields})


# A checkout's own settings modules (not in the wheel): the demo gives the examples'
# variables to every process it starts, the test suite its workflows' ONWARD_TEST_* ones.
CHECKOUT_SETTINGS = ("examples.settings", "tests.settings")


def _import_checkout_settings() -> None:
    """Import ``CHECKOUT_SETTINGS`` when onward runs from its checkout and they are that
    checkout's: a package of the same name elsewhere (an application's own ``tests``, or
    one installed beside onward in site-packages) is left alone."""
    checkout = Path(__file__).resolve().parents[1]
    if not (checkout / "pyproject.toml").is_file():
        return
    for name in CHECKOUT_SETTINGS:
        with contextlib.suppress(ImportError, ValueError):
            package = importlib.util.find_spec(name.partition(".")[0])
            if package is not None and package.origin is not None \
                    and Path(package.origin).resolve().parent.parent == checkout:
                importlib.import_module(name)


def _settings_classes() -> list[type[BaseSettings]]:
    _import_checkout_settings()
    found: list[type[BaseSettings]] = []
    pending = [BaseSettings]
    while pending:
        for subclass in pending.pop().__subclasses__():
            pending.append(subclass)
            if subclass.model_config.get("env_prefix", "").upper() == "ONWARD_":
                found.append(subclass)
    return found
