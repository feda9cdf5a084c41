"""Unit tests never read or write the host's warden state (quarantine record, engine logs)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def private_state_root(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path_factory.mktemp("warden-state")
    monkeypatch.setenv("WARDEN_STATE_DIR", str(root))
    return root
