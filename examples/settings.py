"""The examples' own settings, read from the environment (prefix ``ONWARD_``); they are not
onward's (docs/configuration.md lists them apart)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["ExampleSettings"]


class ExampleSettings(BaseSettings):
    """Read where an example needs one, at that moment (a test may set one before a call)."""

    model_config = SettingsConfigDict(env_prefix="ONWARD_", extra="forbid",
                                      env_ignore_empty=True)

    model_url: str = Field(
        default="http://127.0.0.1:8780/v1",
        description="The research example's OpenAI-compatible endpoint (default: the loopback "
        "model server, examples/model_server.py).",
    )
    model_api_key: str = Field(default="onward-local",
                               description="The research example's API key for model_url.")
    model_name: str = Field(default="gpt-4o-mini",
                            description="The model the research example asks for.")
    research_model_timeout_s: float = Field(
        default=60.0, gt=0,
        description="The research example's time limit for one model call, which the "
        "step's lease covers: a worker killed during a call leaves its run to the reaper "
        "once this has passed (the demo sets 5 s).",
    )
    example_provider_url: str | None = Field(
        default=None,
        description="Where the sales example's tools reach the reference provider "
        "(examples/provider.py); required by those tools.",
    )
    example_provider_token: str | None = Field(
        default=None,
        description="When set, the reference provider requires this bearer token on /v1.",
    )
    fake_llm_log: Path | None = Field(
        default=None,
        description="A file the offline model client (examples/fake_llm.py) appends a line "
        "to per call, so tests count paid calls.",
    )
