"""Settings of onward's processes (worker, dispatcher, reaper, the CLI's servers), read from
the environment (prefix ``ONWARD_``); docs/configuration.md lists them all."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["LogSettings"]


class LogSettings(BaseSettings):
    """How a process logs (``workers/logs.py``, docs/observability.md)."""

    model_config = SettingsConfigDict(env_prefix="ONWARD_", extra="ignore",
                                      env_ignore_empty=True)

    log_json: bool = Field(
        default=False,
        description="Every line a process writes is one JSON object (Celery's, kombu's and "
        "uvicorn's lines, warnings, tracebacks and what step code prints included).",
    )
    log_level: str = Field(
        default="INFO",
        description="Log level when a command is given none (``--loglevel`` wins).",
    )
