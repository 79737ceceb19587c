"""Inputs from a storage and results back to it, for every script-running backend: a real
``rclone serve webdav`` on loopback, the storage feature's StorageManager doing the copies.
"""

from __future__ import annotations

import json

import pytest

from jupyter_cloudtik.core.errors import NotFoundError, PermissionDeniedError
from jupyter_cloudtik.hpc.commands import build_spec

pytest.importorskip("jupyter_cloudtik.storage", reason="the storage feature is not installed")


@pytest.fixture(scope="module")
def webdav(tmp_path_factory):
    from jupyter_cloudtik.storage.servers import start_server

    base = tmp_path_factory.mktemp("webdav")
    srv = start_server("webdav", base / "root", workdir=base / "work")
    (srv.root / "inputs").mkdir()
    (srv.root / "inputs" / "data.txt").write_text("6\n")
    yield srv
    srv.stop()


@pytest.fixture(params=["local", "slurm", "firecrest", "arc"])
def backend(request, backend_configs):
    config, secrets = backend_configs[request.param]()
    return request.param, config, secrets


def _add_storage(client, webdav, name="mydata", read_only=False):
    from jupyter_cloudtik.storage import StorageManager

    sm = StorageManager(settings=client.manager.settings, store=client.manager.store,
                        supervise=False)
    sm.add(name, "webdav", webdav.storage_options(), read_only=read_only)
    return sm


def test_notebook_reads_from_a_storage_and_writes_its_result_back(backend, make_client,
                                                                 notebooks, webdav):
    name, config, secrets = backend
    client = make_client({name: config}, secrets)
    _add_storage(client, webdav)
    info = client.submit(build_spec(str(notebooks["param"]), parameters={"factor": 7},
                                    inputs=["mydata:inputs/data.txt"],
                                    output=f"mydata:results/{name}"), name)
    assert info.inputs[0]["mode"] == "upload"  # staged through the session
    info = client.wait(info.id, 180)
    assert info.state == "succeeded", (info.reason, client.logs(info.id).text[-1500:])
    out = webdav.root / "results" / name
    assert (out / "result.txt").read_text() == "42"
    executed = json.loads((out / "param.out.ipynb").read_text())
    assert "result 42" in json.dumps(executed)
    events = client.events(info.id)
    steps = [e.step for e in events]
    assert "stage-in" in steps and "stage-out" in steps
    blob = json.dumps(info.to_dict()) + "".join(e.message + json.dumps(e.data) for e in events)
    assert webdav.password not in blob


def test_storage_locations_are_checked_before_submitting(make_client, notebooks, webdav):
    client = make_client({"local": {"type": "local"}})
    _add_storage(client, webdav, "ro", read_only=True)
    with pytest.raises(NotFoundError, match=r"no 'inputs/absent\.txt' in storage 'ro'"):
        client.submit(build_spec(str(notebooks["param"]), inputs=["ro:inputs/absent.txt"]),
                      "local")
    with pytest.raises(PermissionDeniedError, match="storage 'ro' is read-only"):
        client.submit(build_spec(str(notebooks["param"]), inputs=["ro:inputs/data.txt"],
                                 output="ro:results"), "local")
    assert client.list() == []
