"""A third-party feature registered only by its entry point serves its routes behind
the extension's auth, its startup and shutdown hooks run, and its migrations are applied
when the server starts (the CLI and magics side: tests/features)."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

from tests.features.thirdparty import installed_in_process


@pytest.fixture
def jp_server_config(state_dir, tmp_path, monkeypatch):
    forget = installed_in_process(tmp_path / "site", monkeypatch)
    yield {"ServerApp": {"jpserver_extensions": {"jupyter_cloudtik": True}},
           "CloudTik": {"state_dir": str(state_dir)},
           "LocalProvider": {"prewarm": False}}
    monkeypatch.undo()
    forget()


async def test_its_route_hooks_and_tables_are_there(jp_serverapp, jp_fetch, cloudtik):
    r = await jp_fetch("cloudtik", "api", "quota-demo", "carol")
    assert json.loads(r.body) == {"user": "carol", "quota": 3, "events": ["startup"]}
    with cloudtik.store.transaction() as conn:
        conn.execute("INSERT INTO quota_demo VALUES ('carol', 3)")
    # behind the extension's auth like every route
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("cloudtik", "api", "quota-demo", "carol",
                       headers={"Authorization": "token wrong"})
    assert e.value.code == 403
    await jp_serverapp.extension_manager.stop_all_extensions()
    import cloudtik_quota_demo.handlers as h

    assert h.EVENTS == ["startup", "shutdown"]
