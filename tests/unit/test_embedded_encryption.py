"""The embedded default is encrypted at rest (docs/security.md, encryption at rest): with
no database or broker URL and no keys configured, every process of the home uses one
master key kept in ``ONWARD_HOME/encryption.keys`` (mode 0600, made on first use); an
empty ``ONWARD_ENCRYPTION_KEYS`` turns it off; a deployment with URLs is unchanged."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from ledger.checkpoints import CheckpointKeys
from ledger.crypto import LOCAL_KEY_FILE, parse_master_keys
from ledger.settings import OnwardSettings

pytest.importorskip("cryptography")


@pytest.fixture()
def embedded_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("ONWARD_DATABASE_URL", "ONWARD_BROKER_URL", "ONWARD_ENCRYPTION_KEYS",
                 "ONWARD_ENCRYPTION_KEY_FILE", "ONWARD_ENCRYPTION_KEY_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ONWARD_HOME", str(tmp_path))
    return tmp_path


def test_the_embedded_default_makes_one_key_file_and_every_process_uses_it(
        embedded_env: Path) -> None:
    first = CheckpointKeys.from_settings(OnwardSettings()).crypt
    again = CheckpointKeys.from_settings(OnwardSettings()).crypt
    assert first is not None and again is not None
    path = embedded_env / LOCAL_KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    [key_id] = parse_master_keys(path.read_text())
    assert key_id.startswith("local-")
    assert first.masters == again.masters and first.active == key_id


def test_an_empty_key_setting_turns_the_embedded_encryption_off(
        embedded_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONWARD_ENCRYPTION_KEYS", "")
    assert CheckpointKeys.from_settings(OnwardSettings()).crypt is None
    assert not (embedded_env / LOCAL_KEY_FILE).exists()


def test_a_deployment_with_urls_is_not_encrypted_unless_configured(
        embedded_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONWARD_DATABASE_URL", "postgresql://onward@db.invalid/onward")
    monkeypatch.setenv("ONWARD_BROKER_URL", "redis://127.0.0.1:1/0")
    assert CheckpointKeys.from_settings(OnwardSettings()).crypt is None
    assert not (embedded_env / LOCAL_KEY_FILE).exists()


def test_a_corpus_replay_of_the_embedded_default_gets_its_key(embedded_env: Path) -> None:
    """A replay's scratch ledger has a URL of its own, so it is not the embedded default
    and would not read the home's key file: the replay (its processes, from the payload's
    settings, and this process's scratch ledger) is given the home's master key."""
    from tasks.corpus.runner import _settings_json
    from tasks.corpus.worker import ledger_for

    settings = OnwardSettings()
    home = CheckpointKeys.from_settings(settings).crypt
    assert home is not None
    url = "postgresql://onward@db.invalid/scratch"
    scratch = ledger_for(settings, url)
    try:
        assert scratch.keys.crypt is not None and scratch.keys.crypt.masters == home.masters
    finally:
        scratch.engine.dispose()
    replaying = OnwardSettings(**{**_settings_json(settings), "database_url": url})
    crypt = CheckpointKeys.from_settings(replaying).crypt
    assert crypt is not None and crypt.masters == home.masters
