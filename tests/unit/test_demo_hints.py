"""What ``make demo`` tells a newcomer to type next works in their shell: ``make demo``
builds ``.venv`` without activating it, so ``onward`` is not on their PATH."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from examples import demo


def test_demo__hints_name_the_venv_script_when_onward_is_not_on_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: the closing hints say ``.venv/bin/onward`` when the venv's ``bin`` is not
    on PATH (they said ``onward``: 'command not found'), and ``onward`` when it is."""
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "onward").write_text("#!/bin/sh\n")
    (bin_dir / "onward").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert demo.onward_command() == ".venv/bin/onward"
    settings = demo.OnwardSettings(database_url=None, broker_url=None)
    assert "console: .venv/bin/onward console" in demo.console_hint(settings)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    assert demo.onward_command() == "onward"
