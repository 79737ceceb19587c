"""A local node's dashboard comes a moment after the node is up
(``providers/local/dashboard_later.py``): ``up`` does not wait for Bokeh, and a dashboard
page asked for before it has loaded is served once it has, never a 404.  Real cluster, real
Bokeh, real HTTP."""

from __future__ import annotations

import requests

from jupyter_cloudtik import Cluster


def test_a_page_asked_for_before_the_dashboard_loaded_is_served(backend, monkeypatch):
    monkeypatch.setenv("CLOUDTIK_DASHBOARD_DELAY", "600")  # loaded only when asked for
    c = Cluster.up(workers=1, name="later", progress=False, backend=backend)
    try:
        base = c.refresh().connect_info["http_address"]
        # Dask's plain routes answer at once: health, the JSON the manager polls
        assert requests.get(f"{base}/health", timeout=10).text == "ok"
        ident = requests.get(f"{base}/json/identity.json", timeout=10).json()
        assert ident["type"] == "Scheduler" and len(ident["workers"]) == 1
        # a dashboard page loads the dashboard, then is sent again to itself (relative:
        # the same works behind the server's /cloudtik/dashboard/NAME/ prefix)
        r = requests.get(f"{base}/status?theme=dark", allow_redirects=False, timeout=60)
        assert r.status_code == 307, (r.status_code, r.text[:300])
        assert r.headers["Location"] == "status?theme=dark"
        r = requests.get(f"{base}/individual-task-stream", timeout=60)
        assert r.status_code == 200 and "bokeh" in r.text.lower(), r.text[:300]
        # loaded: pages are Bokeh's own now, and an unknown page is a 404 again
        r = requests.get(f"{base}/status", allow_redirects=False, timeout=10)
        assert r.status_code == 200 and "Dask" in r.text
        assert requests.get(f"{base}/no-such-page", timeout=10).status_code == 404
        # the worker's own dashboard, the same way
        worker = next(iter(ident["workers"].values()))
        port = worker["services"]["dashboard"]
        r = requests.get(f"http://127.0.0.1:{port}/status", timeout=60)
        assert r.status_code == 200 and "bokeh" in r.text.lower(), r.text[:300]
    finally:
        c.down(progress=False)


def test_the_dashboard_loads_by_itself_soon_after_the_start(backend, monkeypatch):
    """Nobody asks over HTTP (the test looks through Dask's own protocol): the dashboard
    comes all the same, and the stand-in that made requests wait is gone."""
    import time

    def _apps(dask_scheduler=None):  # nested: pickled by value, run in the scheduler
        return [type(a).__name__ for a in dask_scheduler.http_application.applications]

    monkeypatch.setenv("CLOUDTIK_DASHBOARD_DELAY", "0.2")
    c = Cluster.up(workers=1, name="soon", progress=False, backend=backend)
    client = c.client()
    try:
        deadline = time.monotonic() + 60
        while "DaskBokehTornado" not in (apps := client.run_on_scheduler(_apps)):
            assert time.monotonic() < deadline, f"the dashboard never loaded: {apps}"
            time.sleep(0.2)
        assert apps == ["DaskBokehTornado"], apps  # the stand-in is gone
        base = c.refresh().connect_info["http_address"]
        r = requests.get(f"{base}/status", allow_redirects=False, timeout=10)
        assert r.status_code == 200 and "Dask" in r.text
    finally:
        client.close()
        c.down(progress=False)
