"""Fixtures for the placement tests: a private state folder and store."""

from __future__ import annotations

import pytest

from jupyter_cloudtik.core.store import Store


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    d = tmp_path / "state"
    d.mkdir()
    monkeypatch.setenv("CLOUDTIK_STATE_DIR", str(d))
    monkeypatch.setenv("CLOUDTIK_LAUNCHER_IDLE", "5")
    return d


@pytest.fixture
def store(state_dir):
    s = Store(state_dir)
    yield s
    s.close()
