"""Fixtures for the placement tests (``state_dir`` and the leak checks come from the root
conftest)."""

from __future__ import annotations

import pytest

from jupyter_cloudtik.core.store import Store


@pytest.fixture
def store(state_dir):
    s = Store(state_dir)
    yield s
    s.close()
