"""`%cluster up` in a kernel under a real JupyterLab makes three HTTP requests: the POST
that starts it (its answer names the cluster), the event stream (its end event is the
final state), and the GET of the cluster the notebook then shows."""

from __future__ import annotations

import json
import re

from .conftest import unique
from .kernels import running_kernel

# every request the kernel's REST backend sends, counted by requests' own response hook
COUNT = """
from jupyter_cloudtik.clusters.client import get_backend
calls = []
get_backend().session.hooks["response"].append(
    lambda r, *a, **k: calls.append(r.request.method + " " + r.request.path_url))
"""


def test_cluster_up_makes_three_requests(lab):
    name = unique("count")
    with running_kernel(lab, "count.ipynb") as k:
        k.run("%load_ext jupyter_cloudtik")
        k.run(COUNT)
        shown = k.run(f"c = %cluster up --name {name} --workers 0\nc")
        assert name in shown
        calls = json.loads(k.run("import json; print(json.dumps(calls))"))
        # "METHOD path" below the API root, without the query, the operation id as {op}
        api = "/cloudtik/api/"
        paths = [re.sub(r"operations/[0-9a-f]+", "operations/{op}",
                        c.split(" ", 1)[0] + " " + c.split(api, 1)[1].split("?")[0])
                 for c in calls]
        print("requests of %cluster up:", len(paths), paths)
        assert paths == ["POST clusters", "GET operations/{op}/events",
                         f"GET clusters/{name}"], calls
        k.run(f"%cluster down {name}")
