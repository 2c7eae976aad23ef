"""The test workflows' own settings, read from the environment (prefix ``ONWARD_``, names
``ONWARD_TEST_*``): not onward's, and not the examples'. The suite gives them to the
processes it starts (workers, dispatchers, reapers), so the unknown-variable check
(console/settings.py) knows them in a checkout, as it knows the examples' settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["WorkflowTestSettings"]


class WorkflowTestSettings(BaseSettings):
    """Read where a test workflow needs one, at that moment (a test sets one before a call,
    in its own process or for the workers it starts)."""

    model_config = SettingsConfigDict(env_prefix="ONWARD_", extra="forbid",
                                      env_ignore_empty=True)

    test_marks: Path | None = Field(
        default=None, description="tests/workflows_async.py: a folder where bodies append a "
        "line per named point to the file of their run.")
    test_model_timeout_s: float = Field(
        default=5.0, description="tests/workflows_limits.py: the limited model's call limit.")
    test_model_concurrency: int = Field(
        default=1, description="tests/workflows_limits.py: the fleet-wide concurrency of "
        "the test model's limit.")
    test_ops_variant: str = Field(
        default="", description="tests/workflows_ops.py: the code change deployed between "
        "a run and its replay.")
    test_ops_calls: Path | None = Field(
        default=None, description="tests/workflows_ops.py: a file the local tool appends a "
        "line to per call.")
    test_ops_broken: str = Field(
        default="", description="tests/workflows_ops.py: while set, a step fails for good.")
    test_corpus_variant: str = Field(
        default="", description="tests/workflows_corpus.py: the candidate code of a replay.")
    test_crypt_variant: str = Field(
        default="", description="tests/workflows_crypt.py: ``echo`` keeps another echo, "
        "``amount`` asks for another amount, ``prompt`` asks the model something else.")
    test_crm_refuses: str = Field(
        default="", description="tests/workflows_credentials.py: while set, the CRM refuses "
        "the token.")
    test_crm_calls: Path | None = Field(
        default=None, description="tests/versions/migrating.py: the file where the CRM "
        "appends a line per object created.")
