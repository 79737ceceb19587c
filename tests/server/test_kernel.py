"""A real kernel started by the real server: its magics and Cluster API go through the
server's REST API, so the server owns the operation and every face sees the cluster."""

from __future__ import annotations

import json

from .conftest import unique
from .kernels import KernelError, running_kernel


def test_kernel_magics_use_the_server(lab):
    name = unique("kernel")
    with running_kernel(lab, "magics.ipynb") as k:
        out = k.run("from jupyter_cloudtik.clusters.client import get_backend\n"
                    "b = get_backend(); print(b.kind, b.url)")
        assert out.split() == ["rest", lab.api_url]
        k.run("%load_ext jupyter_cloudtik")
        out = k.run(f"c = %cluster up --name {name} --workers 1\nprint(c.status)")
        assert out.strip().splitlines()[-1] == "running"
        # the server ran it: its operation is owned by the server process
        op = lab.get("operations", params={"cluster": name}).json()["operations"][0]
        assert op["kind"] == "cluster.up" and op["owner_pid"] == lab.proc.pid
        assert name in [c["name"] for c in lab.get("clusters").json()["clusters"]]

        out = k.run("client = c.client(); print(client.submit(sum, [1, 2, 3]).result())\n"
                    "client.close()")
        assert out.strip() == "6"
        out = k.run("%cluster list")
        assert name in out
        try:
            k.run("%cluster scale no-such 3")
            raise AssertionError("expected an error")
        except KernelError as e:
            assert "UsageError" in str(e) and "no cluster named 'no-such'" in str(e)
        # what the kernel can reach with its token: the cloudtik routes, nothing else
        out = k.run(
            "import os, json, requests\n"
            "h = {'Authorization': 'token ' + os.environ['CLOUDTIK_API_TOKEN']}\n"
            "u = os.environ['CLOUDTIK_API_URL']\n"
            "print(json.dumps([requests.get(u + 'clusters', headers=h).status_code,\n"
            "  requests.get(u.replace('cloudtik/api/', 'api/contents'), headers=h)"
            ".status_code]))")
        assert json.loads(out) == [200, 403]
        k.run(f"%cluster down {name}")
    assert lab.get(f"clusters/{name}").json()["state"] == "stopped"


def test_kernel_restart_keeps_the_cluster(lab):
    """Clusters belong to the server's store, not to a kernel: a new kernel sees it."""
    name = unique("survive")
    with running_kernel(lab, "first.ipynb") as k:
        k.run(f"from jupyter_cloudtik import Cluster\nc = Cluster.up(name={name!r}, "
              "workers=0, progress=False)")
    with running_kernel(lab, "second.ipynb") as k:
        out = k.run(f"from jupyter_cloudtik import Cluster\nprint(Cluster.get({name!r})"
                    ".status)")
        assert out.strip() == "running"
        k.run(f"Cluster.get({name!r}).down(progress=False)")
