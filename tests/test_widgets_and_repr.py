"""The notebook views of a cluster: HTML table and the interactive widget."""

from __future__ import annotations

from jupyter_cloudtik import Cluster
from jupyter_cloudtik.clusters.widgets import ClusterWidget


def test_repr_and_widget_drive_the_real_cluster(backend):
    c = Cluster.up(workers=1, name="view", progress=False, backend=backend)
    html = c._repr_html_()
    for text in ("view", "local", "running", "1/1", "http://127.0.0.1:"):
        assert text in html
    assert "running" in repr(c) and "workers=1/1" in repr(c)
    listing = Cluster.list(backend=backend)
    assert "view" in listing._repr_html_() and "view" in repr(listing)

    w = ClusterWidget(c)
    assert "running" in w.table.value and w.workers.value == 1
    w.workers.value = 2
    w.scale_button.click()
    assert c.refresh().running_workers == 2
    assert "scaled to 2 workers" in w.message.value

    w.workers.value = 500  # beyond max_workers: the message says why, nothing changes
    w.scale_button.click()
    assert "more than max_workers" in w.message.value
    assert c.refresh().wanted_workers == 2

    w.down_button.click()  # first click only asks for confirmation
    assert c.refresh().state == "running" and "click again" in w.message.value
    w.down_button.click()
    assert c.refresh().state == "stopped"
    assert w.down_button.disabled and "stopped" in w.table.value


def test_empty_list_says_how_to_start(backend):
    assert "%cluster up" in Cluster.list(backend=backend)._repr_html_()
