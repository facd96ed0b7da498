"""goosebit's settings file holds the secret key that signs its login tokens: `server init`
writes it readable by the server's user alone, also over an existing world-readable file.
goosebit itself is not needed (a stand-in module answers the migrations lookup)."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_settings_and_secret_key_are_0600(tmp_path, monkeypatch):
    goosebit = types.ModuleType("goosebit")
    db = types.ModuleType("goosebit.db")
    db.__file__ = str(tmp_path / "goosebit/db/__init__.py")
    monkeypatch.setitem(sys.modules, "goosebit", goosebit)
    monkeypatch.setitem(sys.modules, "goosebit.db", db)
    from vla_fleet import server

    settings = tmp_path / "goosebit.yaml"
    settings.write_text("left by an older version\n")
    settings.chmod(0o644)
    server.write_settings(tmp_path, "00:00:02")
    for name in ("goosebit.yaml", "secret_key"):
        assert os.stat(tmp_path / name).st_mode & 0o777 == 0o600, name
    assert "secret_key: " in settings.read_text()
