"""In-process server tests: pytest-jupyter's ``jp_serverapp``/``jp_fetch`` run a real
jupyter_server with the extension inside the test process (no subprocess, no port to find),
so a handler's validation, auth and error paths are checked per test in milliseconds.

The plugin is imported here rather than declared in ``pytest_plugins``: its autouse
fixtures (a fresh event loop and a ``ServerApp`` cleanup per test) then apply to this
folder only, not to the end-to-end tests beside it.
"""

from __future__ import annotations

import pytest
from pytest_jupyter.jupyter_core import *  # noqa: F403
from pytest_jupyter.jupyter_server import *  # noqa: F403
from pytest_jupyter.pytest_tornasync import *  # noqa: F403


@pytest.fixture
def jp_server_config(state_dir):
    """The extension on, with this test's own state folder; no launcher pre-start at the
    server's start (a daemon per test that few of them need; test_launcher.py covers it)."""
    return {"ServerApp": {"jpserver_extensions": {"jupyter_cloudtik": True}},
            "CloudTik": {"state_dir": str(state_dir)},
            "LocalProvider": {"prewarm": False}}


@pytest.fixture
def cloudtik(jp_serverapp):
    """The extension's ``ServerContext`` in the running server."""
    return jp_serverapp.web_app.settings["cloudtik"]
