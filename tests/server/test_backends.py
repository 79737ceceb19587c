"""The same cases through both backends: the core in this process, and the REST API of a
real JupyterLab (what a kernel under the server uses).  Results and errors must be the
same either way; the magics are exercised through both too."""

from __future__ import annotations

import threading

import pytest
from IPython.core.error import UsageError

from jupyter_cloudtik.clusters.api import Cluster
from jupyter_cloudtik.clusters.client import CoreBackend
from jupyter_cloudtik.clusters.rest import RestBackend
from jupyter_cloudtik.core import bridge
from jupyter_cloudtik.core.errors import (
    ConfigError,
    ConflictError,
    NotFoundError,
    OperationCancelled,
)
from jupyter_cloudtik.core.models import ClusterInfo
from jupyter_cloudtik.core.operations import Event, OperationInfo

from .conftest import stop_state_processes, unique


@pytest.fixture(scope="module")
def core_backend(tmp_path_factory):
    from jupyter_cloudtik.core.settings import CloudTik

    state = tmp_path_factory.mktemp("core-state")
    backend = CoreBackend(settings=CloudTik(state_dir=str(state), start_reaper=False))
    yield backend
    for c in backend.list():
        backend.wait(backend.start_down(c.name))
    backend.runner.stop()
    problems = stop_state_processes(state)
    assert not problems, problems


@pytest.fixture(scope="module")
def rest_backend(lab):
    return RestBackend(lab.api_url, lab.token)


@pytest.fixture(params=["core", "rest"])
def backend(request):
    return request.getfixturevalue(f"{request.param}_backend")


def test_up_list_scale_client_logs_down(backend):
    name = unique(backend.kind)
    cluster = Cluster.up(name=name, workers=1, progress=False, backend=backend)
    assert cluster.name == name
    info = backend.get(name)
    assert isinstance(info, ClusterInfo)
    assert info.state == "running" and info.running_workers == 1 and info.provider == "local"
    assert name in [c.name for c in Cluster.list(backend=backend)]
    assert cluster.status == "running"

    cluster.scale(2, progress=False)
    assert backend.status(name).running_workers == 2

    client = cluster.client()
    try:
        assert client.submit(lambda x: x * 21, 2).result(timeout=30) == 42
        assert len(client.scheduler_info()["workers"]) == 2
    finally:
        client.close()

    logs = cluster.logs(tail=5)
    assert set(logs) >= {n.node_id for n in backend.get(name).nodes}
    kind, connect = backend.connect_info(name)
    assert kind == "local" and connect.scheduler_address == info.scheduler_address

    ops = backend.operations(name)
    assert [o.kind for o in ops] == ["cluster.scale", "cluster.up"]
    assert all(isinstance(o, OperationInfo) and o.state == "succeeded" for o in ops)
    events = list(backend.events(ops[1].id))
    assert all(isinstance(e, Event) for e in events)
    assert events[0].step == "start" and events[-1].step == "succeeded"
    # resuming after an event gives exactly the rest
    assert [e.id for e in backend.events(ops[1].id, after=events[2].id)] == [
        e.id for e in events[3:]]

    cluster.down(progress=False)
    assert backend.get(name).state == "stopped"
    assert name not in [c.name for c in backend.list()]
    assert name in [c.name for c in backend.list(include_stopped=True)]


@pytest.mark.parametrize(("call", "error", "field", "words"), [
    (lambda b: b.start_up({"cluster_name": "Bad_Name"}), ConfigError, "cluster_name",
     "'Bad_Name' is not allowed"),
    (lambda b: b.start_up(None, name="x", workers=-1), ConfigError, "workers", "-1"),
    (lambda b: b.start_up({"provider": {"type": "nope"}}), ConfigError, "provider.type",
     "unknown provider 'nope'"),
    (lambda b: b.start_up(None, name="huge", workers=4096), Exception, "workers",
     "not enough capacity"),
    (lambda b: b.get("no-such"), NotFoundError, "name", "no cluster named 'no-such'"),
    (lambda b: b.status("no-such"), NotFoundError, "name", "no cluster named 'no-such'"),
    (lambda b: b.start_down("no-such"), NotFoundError, "name", "no-such"),
    (lambda b: b.start_scale("no-such", 1), NotFoundError, "name", "no-such"),
    (lambda b: b.operation("no-such"), NotFoundError, "op_id", "no-such"),
    (lambda b: b.connect_info("no-such"), NotFoundError, "name", "no-such"),
], ids=["bad-name", "negative-workers", "unknown-provider", "capacity", "get", "status",
        "down", "scale", "operation", "connect"])
def test_errors_are_the_same_either_way(backend, call, error, field, words):
    with pytest.raises(error) as info:
        call(backend)
    assert info.value.field == field
    assert words in info.value.message
    if words == "not enough capacity":
        assert info.value.reason == "capacity"


def test_errors_have_identical_messages(core_backend, rest_backend):
    for call in (lambda b: b.start_up({"cluster_name": "Bad_Name"}),
                 lambda b: b.start_up({"max_workers": "x"}),
                 lambda b: b.get("no-such-cluster-at-all")):
        got = []
        for b in (core_backend, rest_backend):
            with pytest.raises(Exception) as info:
                call(b)
            got.append((type(info.value), info.value.message.split("; clusters")[0],
                        info.value.field))
        assert got[0] == got[1]


def test_cancel_is_the_same_either_way(backend):
    name = unique(f"cancel-{backend.kind}")
    op_id = backend.start_up({"setup_commands": ["sleep 30"]}, name=name, workers=0)
    steps = []
    for event in backend.events(op_id):
        steps.append(event.step)
        if event.step == "head":
            break
    op = backend.cancel(op_id)
    assert op.state == "cancelled"
    with pytest.raises(OperationCancelled):
        backend.wait(op_id)
    assert backend.get(name).state == "failed"
    with pytest.raises(ConflictError):
        backend.connect_info(name)
    backend.wait(backend.start_down(name))


def test_providers_are_the_same_either_way(core_backend, rest_backend):
    assert core_backend.providers() == rest_backend.providers()


@pytest.fixture
def shell(backend, monkeypatch, lab):
    """An IPython shell whose magics pick the backend as they would in real use: the
    environment says whether a server is there."""
    from IPython.core.interactiveshell import InteractiveShell

    if backend.kind == "rest":
        monkeypatch.setenv("CLOUDTIK_API_URL", lab.api_url)
        monkeypatch.setenv("CLOUDTIK_API_TOKEN", lab.token)
    else:
        monkeypatch.delenv("CLOUDTIK_API_URL", raising=False)
        monkeypatch.setenv("CLOUDTIK_STATE_DIR", backend.manager.settings.state_dir)
        monkeypatch.setitem(bridge._clients,
                            ("clusters", "core", str(backend.manager.settings.state_dir)),
                            backend)
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("jupyter_cloudtik")
    yield ip
    bridge._clients.pop(("clusters", "rest", lab.api_url), None)


def test_magics_either_way(shell, backend, capsys):
    name = unique(f"magic-{backend.kind}")
    c = shell.run_line_magic("cluster", f"up --name {name} --workers 1")
    assert type(c.backend) is type(backend)
    assert c.info.running_workers == 1
    listed = shell.run_line_magic("cluster", "list")
    assert name in [x.name for x in listed]
    assert name in repr(listed)
    shell.run_line_magic("cluster", f"scale {name} 0")
    status = shell.run_line_magic("cluster", f"status {name}")
    assert status.info.running_workers == 0 and status.info.state == "running"
    with pytest.raises(UsageError, match="'Bad_Name' is not allowed"):
        shell.run_line_magic("cluster", "up --name Bad_Name")
    with pytest.raises(UsageError, match="no cluster named 'no-such'"):
        shell.run_line_magic("cluster", "status no-such")
    shell.run_line_magic("cluster", f"down {name}")
    out = capsys.readouterr().out
    assert f"cluster '{name}' is stopped" in out
    assert "workers connected" in out  # the same progress text either way


def test_rest_events_survive_a_dropped_connection(lab):
    """A proxy cuts the event stream after a few events; the backend reconnects and
    resumes after the last event it saw: nothing missing, nothing twice."""
    proxy = CuttingProxy(lab.url, cut_after_events=2)
    try:
        backend = RestBackend(proxy.url + "cloudtik/api/", lab.token)
        backend.session.headers["Connection"] = "close"  # one request per proxied connection
        name = unique("drop")
        op_id = backend.start_up(None, name=name, workers=1)
        seen = [e.id for e in backend.events(op_id)]
        everything = [e["id"] for e in lab.get(f"operations/{op_id}/events").json()["events"]]
        assert seen == everything
        assert proxy.cuts >= 1 and proxy.connections >= 2
        backend.wait(backend.start_down(name))
    finally:
        proxy.close()


class CuttingProxy:
    """A loopback TCP proxy that closes the first event-stream response after N events."""

    def __init__(self, upstream: str, cut_after_events: int) -> None:
        import socket
        from urllib.parse import urlparse

        u = urlparse(upstream)
        self.upstream = (u.hostname, u.port)
        self.cut_after = cut_after_events
        self.cuts = 0
        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/"
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client) -> None:
        import socket

        up = socket.create_connection(self.upstream)
        request = client.recv(65536)
        cut = b"text/event-stream" in request and self.cuts == 0
        up.sendall(request)

        def pump_up() -> None:
            try:
                while data := client.recv(65536):
                    up.sendall(data)
            except OSError:
                pass

        threading.Thread(target=pump_up, daemon=True).start()
        events = 0
        try:
            while data := up.recv(65536):
                if cut:
                    events += data.count(b"event: progress")
                    if events >= self.cut_after:
                        # pass on part of this chunk only, then drop the connection
                        client.sendall(data[: data.find(b"event: progress") + 5])
                        self.cuts += 1
                        break
                client.sendall(data)
        except OSError:
            pass
        finally:
            for s in (client, up):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def test_rest_api_md_example(lab):
    """docs/rest-api.md's RestBackend example as written, with this server's URL and token
    for the doc's 8888 and ``<server token>``."""
    import doc_examples

    block = doc_examples.block("docs/rest-api.md", "Authentication and permissions",
                               lang="python")
    text = (block.text.replace("http://127.0.0.1:8888/cloudtik/api/", lab.api_url)
            .replace("<server token>", lab.token))
    assert text.count(lab.token) == 1 and lab.api_url in text
    ns: dict = {}
    exec(compile(text, block.id, "exec"), ns)
    c = ns["c"]
    try:
        assert c.name == "demo" and c.status == "running"
        (seen,) = [x for x in lab.get("clusters").json()["clusters"] if x["name"] == "demo"]
        assert seen["state"] == "running"
    finally:
        c.down()
