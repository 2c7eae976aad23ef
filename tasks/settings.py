"""Settings of the worker-side library, read from the environment (prefix ``ONWARD_``).

Each class is small and read where it is needed, so a check of one setting reads only its
own variables (docs/configuration.md lists them all)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["CredentialSettings", "FaultSettings"]

_CONFIG = SettingsConfigDict(env_prefix="ONWARD_", extra="forbid", env_ignore_empty=True)


class FaultSettings(BaseSettings):
    """Named fault points armed in this process (``tasks/faults.py``; tests and chaos runs)."""

    model_config = _CONFIG

    faults: str = Field(
        default="",
        description="Fault points to arm, comma-separated: ``point[:step]=action[:arg]`` "
        "(``kill``, ``raise``, ``sleep=S``; ``once`` fires once across processes). Tests only.",
    )
    faults_dir: Path | None = Field(
        default=None,
        description="Where ``once`` faults leave their markers; unset: ``faults`` under home.",
    )
    home: Path = Field(default=Path(".onward"), description="Where embedded servers keep data.")

    @property
    def marker_dir(self) -> Path:
        return (self.faults_dir or self.home / "faults").resolve()


class CredentialSettings(BaseSettings):
    """Where tools' credentials are read from besides ``ONWARD_SECRET_<NAME>`` variables
    (``tasks/credentials.py``, docs/security.md)."""

    model_config = _CONFIG

    secrets_dir: Path | None = Field(
        default=None,
        description="A directory of credential files, one per name (a mounted secret); "
        "read when ``ONWARD_SECRET_<NAME>`` is unset.",
    )
