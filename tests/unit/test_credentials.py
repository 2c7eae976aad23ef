"""Tool credentials by reference (tasks/credentials.py): resolved at call time from the
environment or a secrets directory, never echoed in an error, masked in every log line."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from tasks import credentials
from tasks.exceptions import CredentialUnavailable

VALUE = "canary-Zq8v41-credential"


@pytest.fixture(autouse=True)
def _forget_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    """Values resolved here are masked in this process only while the test runs."""
    monkeypatch.setattr(credentials, "_known", set())


def test_resolve__reads_the_environment_then_the_secrets_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONWARD_SECRET_CRM_API_KEY", VALUE)
    assert credentials.resolve("secret://crm.api-key") == VALUE
    (tmp_path / "mail_token").write_text("from-a-file-123\n")
    monkeypatch.setenv("ONWARD_SECRETS_DIR", str(tmp_path))
    assert credentials.resolve(credentials.reference("mail_token")) == "from-a-file-123"
    assert credentials.lookup("secret://absent") is None


def test_resolve__errors_name_the_reference_never_a_value(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONWARD_SECRETS_DIR", str(tmp_path))
    with pytest.raises(CredentialUnavailable, match="ONWARD_SECRET_ABSENT") as missing:
        credentials.resolve("secret://absent")
    assert str(tmp_path / "absent") in str(missing.value)
    with pytest.raises(CredentialUnavailable) as not_a_reference:
        credentials.resolve(VALUE)  # a value passed where its reference belongs
    assert VALUE[:4] not in str(not_a_reference.value)
    monkeypatch.setenv("ONWARD_SECRET_SHORT", "abc")
    with pytest.raises(CredentialUnavailable, match="shorter"):
        credentials.resolve("secret://short")


def test_redaction__masks_resolved_values_in_structlog_events_and_stdlib_records(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONWARD_SECRET_PROVIDER", VALUE)
    credentials.resolve("secret://provider")
    event = credentials.redact_event(None, "info", {
        "event": f"calling with {VALUE}", "headers": {"Authorization": f"Bearer {VALUE}"},
        "args": [VALUE, 1]})
    assert VALUE not in repr(event) and "Bearer ***" in repr(event)

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(credentials.RedactingFilter())
    logger = logging.getLogger("test.credentials")
    logger.addHandler(handler)
    try:
        logger.warning("sent %s", f"Authorization: Bearer {VALUE}")
        try:
            raise RuntimeError(f"refused token {VALUE}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    assert VALUE not in stream.getvalue()
    assert "Bearer ***" in stream.getvalue() and "refused token ***" in stream.getvalue()
