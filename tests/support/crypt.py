"""What the encryption-at-rest tests share: a master key, and the test environment with it
(tests/integration/test_crypt.py, test_corpus_crypt.py)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from tests.conftest import make_settings_env

__all__ = ["MASTER", "settings_env"]

MASTER = secrets.token_hex(32)


@pytest.fixture()
def settings_env(database: str, server_urls: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The environment every process of one test shares (tests/conftest.py), with the
    master key ``m1`` = ``MASTER``: a module that imports this fixture encrypts at rest."""
    env = make_settings_env(database, server_urls, tmp_path / "faults")
    env["ONWARD_ENCRYPTION_KEYS"] = f"m1={MASTER}"
    return env
