"""Issue 12 against a real single-user server: every location a request names stays inside
the server's root folder, and the kernel token is a capability, not the user's key.

One server for the module, set up the way that is most exposed: its root folder is its
user's home, which also holds the cloudtik state folder (``secret.key``) and Jupyter's
runtime folder (``jpserver-*.json`` with the server's token).  Outside the root lies a
canary folder.  Every route and body field that names a location (taken from openapi.yaml)
gets every hostile value; each answer must be a 4xx naming the field, no answer may carry a
byte of the canary, the key or the token, and nothing may appear outside the root.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
import requests

from jupyter_cloudtik.core.errors import CloudTikError
from jupyter_cloudtik.core.locations import InProcess, ServerRoot, resolve
from jupyter_cloudtik.storage.servers import start_server

from .conftest import _start_server, _stop
from .kernels import kernel_api_token

CANARY = f"CANARY-{uuid.uuid4().hex}"
MAX_STAGE = 4096


def _nb(src: str) -> dict:
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                        "language": "python"}},
            "cells": [{"cell_type": "code", "id": "c0", "metadata": {"tags": []},
                       "execution_count": None, "outputs": [], "source": src}]}


class Setup:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.home = base / "srv" / "root"   # the server's root folder is its home
        self.outside = base / "outside"
        self.state = self.home / "cloudtik-state"          # inside the root, not hidden
        self.runtime = self.home / ".local" / "share" / "jupyter" / "runtime"
        self.server = None

    def snapshot(self) -> dict[str, bytes]:
        return {str(p): p.read_bytes() if p.is_file() else b"<dir>"
                for p in sorted(self.outside.rglob("*"))}

    def secrets(self) -> list[str]:
        """What must never come back: the canary, the key, the server's token."""
        out = [CANARY, self.server.token]
        key = self.state / "secret.key"
        if key.exists():
            out.append(key.read_text().strip())
        return out


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    s = Setup(tmp_path_factory.mktemp("locations"))
    s.home.mkdir(parents=True)
    s.outside.mkdir()
    (s.outside / "canary.txt").write_text(CANARY)
    (s.outside / "canary-dir").mkdir()
    (s.outside / "canary-dir" / "inner.txt").write_text(CANARY)
    s.state.mkdir()
    s.runtime.mkdir(parents=True)
    root = s.home
    (root / "work").mkdir()
    (root / "work" / "run.ipynb").write_text(json.dumps(_nb("print('ok')")))
    (root / "work" / "data.txt").write_text("data\n")
    (root / "link-out").symlink_to(s.outside)                 # a symlink planted in root
    (root / "work" / "canary-link.txt").symlink_to(s.outside / "canary.txt")
    (root / "folder-with-link").mkdir()
    (root / "folder-with-link" / "ok.txt").write_text("fine")
    (root / "folder-with-link" / "escape").symlink_to(s.outside / "canary.txt")
    (root / "big").mkdir()
    (root / "big" / "blob.bin").write_bytes(b"x" * (MAX_STAGE + 1))
    (root / ".hidden").mkdir()
    (root / ".hidden" / "notes.txt").write_text(CANARY)
    s.server = _start_server(s.base / "srv", "server", [
        "--ServerApp.jpserver_extensions={'jupyter_cloudtik': True}",
        f"--CloudTikServer.max_stage_bytes={MAX_STAGE}",
    ], {"HOME": str(s.home), "CLOUDTIK_STATE_DIR": str(s.state),
        "JUPYTER_RUNTIME_DIR": str(s.runtime)})
    deadline = time.monotonic() + 20
    while not list(s.runtime.glob("jpserver-*.json")) and time.monotonic() < deadline:
        time.sleep(0.1)
    # the key exists once the secret store is first opened: add a storage through it
    s.s3 = start_server("s3", s.base / "s3root", workdir=s.base / "s3work")
    (s.s3.root / "bucket").mkdir()
    (s.s3.root / "bucket" / "k.txt").write_text("in the bucket")
    r = s.server.request("POST", "storages", json={
        "name": "store", "backend": "s3", "options": s.s3.storage_options(),
        "source": "bucket", "read_only": False})
    assert r.status_code == 201, r.text
    assert (s.state / "secret.key").exists() or os.environ.get("CLOUDTIK_SECRET_KEY")
    # one finished job, for the fetch and files routes
    r = s.server.request("POST", "jobs", json={"command": ["echo", "done"],
                                              "backend": "local"})
    assert r.status_code == 202, r.text
    s.job = r.json()["job"]["id"]
    deadline = time.monotonic() + 60
    while s.server.get(f"jobs/{s.job}").json()["state"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    s.before = s.snapshot()
    yield s
    s.s3.stop()
    problems = _stop(s.server)
    assert not problems, problems


def _hostile(s: Setup) -> dict[str, str]:
    jpserver = sorted(s.runtime.glob("jpserver-*.json"))
    assert jpserver, "the server wrote no connection file"
    return {
        "absolute outside": str(s.outside / "canary.txt"),
        "absolute outside folder": str(s.outside),
        "dotdot": "../outside/canary.txt",
        "dotdot inside": "work/../../outside/canary.txt",
        "tilde root": "~root/x",
        "tilde nosuch": "~nosuch/x",
        "tilde home": "~/cloudtik-state/secret.key",
        "file url outside": f"file://{s.outside / 'canary.txt'}",
        "file url passwd": "file:///etc/passwd",
        "symlink folder": "link-out/canary.txt",
        "symlink file": "work/canary-link.txt",
        "symlink missing child": "link-out/new-folder/x",
        "NUL": "work/data\x00.txt",
        "long path": "a/" * 2500,
        "long name": "n" * 5000,
        "unknown storage": "physics-data:results/x",
        "proc cmdline": "/proc/self/cmdline",
        "proc environ": "/proc/self/environ",
        "secret.key": str(s.state / "secret.key"),
        "secret.key relative": "cloudtik-state/secret.key",
        "jpserver json": str(jpserver[0]),
        "jpserver relative": str(jpserver[0].relative_to(s.home)),
        "hidden": ".hidden/notes.txt",
    }


def _routes(s: Setup):
    """(label, method, path, json/params builder, field): every location field of the
    API (openapi.yaml: JobSubmit notebook/inputs/output, JobFetch dest, job files name,
    StorageCreate mount_path/url/source, storage ls path, StorageTransfer src/dst)."""
    return [
        ("jobs.notebook", "POST", "jobs", lambda v: {"json": {"notebook": v}}, "notebook"),
        ("jobs.inputs", "POST", "jobs",
         lambda v: {"json": {"command": ["true"], "inputs": [v]}}, "inputs"),
        ("jobs.inputs NAME=", "POST", "jobs",
         lambda v: {"json": {"command": ["true"], "inputs": [f"renamed={v}"]}}, "inputs"),
        ("jobs.output", "POST", "jobs",
         lambda v: {"json": {"command": ["true"], "output": v}}, "output"),
        ("fetch.dest", "POST", f"jobs/{s.job}/fetch", lambda v: {"json": {"dest": v}},
         "dest"),
        ("storages.mount_path", "POST", "storages",
         lambda v: {"json": {"name": "evil", "url": "s3://bucket", "mount_path": v}},
         "mount_path"),
        ("storage-transfers.src", "POST", "storage-transfers",
         lambda v: {"json": {"src": v, "dst": "store:stolen"}}, "src"),
        ("storage-transfers.dst", "POST", "storage-transfers",
         lambda v: {"json": {"src": "store:k.txt", "dst": v}}, "dst"),
    ]


def _check_refused(s: Setup, resp: requests.Response, field: str, label: str) -> None:
    assert 400 <= resp.status_code < 500, (label, resp.status_code, resp.text[:300])
    body = resp.json()
    assert body["field"] == field or body["message"].startswith(f"{field}"), (label, body)
    for secret in s.secrets():
        assert secret not in resp.text, (label, "leaked")


def test_every_location_field_refuses_every_hostile_value(env):
    s = env
    hostile = _hostile(s)
    seen = 0
    for label, method, path, make, field in _routes(s):
        for vname, value in hostile.items():
            if field in ("notebook", "mount_path") and vname == "unknown storage":
                continue  # a plain (odd) file name there, not a location
            resp = s.server.request(method, path, **make(value))
            _check_refused(s, resp, field, f"{label} <- {vname}")
            seen += 1
    assert seen > 150
    # storage ls path and job files name: what is not a plain path inside is refused
    # (tornado turns a NUL of a query argument into a space: none arrives in ls's path)
    for value in ("../x", "a/../../b", "x\x00y", "a/" * 2500, "n" * 5000):
        if "\x00" not in value:
            resp = s.server.get("storages/store/ls", params={"path": value})
            _check_refused(s, resp, "path", f"ls <- {value[:20]!r}")
        resp = s.server.get(f"jobs/{s.job}/files/{quote(value, safe='')}")
        _check_refused(s, resp, "name", f"files <- {value[:20]!r}")
    for value in ("/etc/passwd", str(s.state / "secret.key")):
        resp = s.server.get(f"jobs/{s.job}/files/{quote(value, safe='')}")
        _check_refused(s, resp, "name", f"files <- {value!r}")
    # storage URLs and sources that would name this machine's disk
    for body, field in (({"name": "evil", "url": "file:///etc"}, "url"),
                        ({"name": "evil", "url": f"file://{s.outside}"}, "url"),
                        ({"name": "evil", "backend": "local", "source": str(s.outside)},
                         "backend"),
                        ({"name": "evil", "backend": "alias",
                          "options": {"remote": str(s.outside)}}, "backend")):
        resp = s.server.request("POST", "storages", json=body)
        _check_refused(s, resp, field, f"storages <- {body}")
    assert s.server.get("storages/evil").status_code == 404
    # nothing was written outside the root, and no job was recorded for any of it
    assert s.snapshot() == s.before
    jobs = s.server.get("jobs").json()["jobs"]
    assert [j["id"] for j in jobs] == [s.job]


def test_job_inputs_outside_the_root_are_refused(env):
    """Issue 12, bullet 5: absolute paths and '..' in notebook, inputs and output."""
    srv = env.server
    r = srv.request("POST", "jobs", json={"command": ["cat", "canary.txt"],
                                          "inputs": [str(env.outside / "canary.txt")]})
    assert r.status_code == 403 and r.json()["field"] == "inputs", r.text
    assert "outside the server's root folder" in r.json()["message"]
    r = srv.request("POST", "jobs", json={"notebook": "../outside/x.ipynb"})
    assert r.status_code == 403 and r.json()["field"] == "notebook"
    r = srv.request("POST", "jobs", json={"command": ["true"],
                                          "output": str(env.outside / "results")})
    assert r.status_code == 403 and r.json()["field"] == "output"
    assert not (env.outside / "results").exists()
    # a folder input holding a symlink out of the root, and one above the size bound
    r = srv.request("POST", "jobs", json={"command": ["true"],
                                          "inputs": ["folder-with-link"]})
    assert r.status_code == 403 and r.json()["field"] == "inputs", r.text
    assert "escape" in r.json()["message"]
    r = srv.request("POST", "jobs", json={"command": ["true"], "inputs": ["big"]})
    assert r.status_code == 400 and "max_stage_bytes" in r.json()["message"], r.text
    # inside the root everything still works: relative, absolute inside, NAME=, file://
    r = srv.request("POST", "jobs", json={
        "command": ["sh", "-c", "cat data.txt renamed.txt"], "backend": "local",
        "inputs": ["work/data.txt", f"renamed.txt={env.home / 'work' / 'data.txt'}"],
        "output": "results/ok"})
    assert r.status_code == 202, r.text
    job = r.json()["job"]
    deadline = time.monotonic() + 60
    while (job := srv.get(f"jobs/{job['id']}").json())["state"] not in (
            "succeeded", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert job["state"] == "succeeded", (job, srv.get(f"jobs/{job['id']}/logs").text)
    assert srv.get(f"jobs/{job['id']}/logs").json()["text"].endswith("data\ndata\n")
    r = srv.request("POST", f"jobs/{job['id']}/fetch", json={"dest": "fetched"})
    assert r.status_code == 200 and r.json()["dest"] == "fetched", r.text


def test_kernel_token_cannot_become_the_server_token(env):
    """Issue 12, bullet 5: the kernel token staged /proc/self/cmdline (the server's
    command line, with --IdentityProvider.token) and read it back."""
    srv = env.server
    ctx_token = _kernel_token(srv)
    kernel = requests.Session()
    kernel.headers["Authorization"] = f"token {ctx_token}"
    api = srv.api_url
    for value in ("/proc/self/cmdline", "/proc/self/environ",
                  str(next(env.runtime.glob("jpserver-*.json")))):
        r = kernel.post(api + "jobs", json={"command": ["cat", "cmdline"],
                                            "backend": "local", "inputs": [value]})
        assert r.status_code == 403 and r.json()["field"] == "inputs", (value, r.text)
        assert srv.token not in r.text
    # what stays with the user: credentials and admin; 403 naming what is refused
    r = kernel.post(api + "storages", json={"name": "k", "url": "s3://b"})
    assert r.status_code == 403 and "adding a storage" in r.json()["message"], r.text
    r = kernel.delete(api + "storages/store")
    assert r.status_code == 403 and "removing a storage" in r.json()["message"]
    assert srv.get("storages/store").status_code == 200
    r = kernel.post(api + "workspaces", json={"name": "w"})
    assert r.status_code == 403 and "workspace" in r.json()["message"]
    # what a kernel may do: use the storages and jobs, inside the root
    assert kernel.get(api + "storages").status_code == 200
    assert kernel.get(api + "jobs").status_code == 200
    # and Jupyter's own routes never accept it
    assert kernel.get(srv.url + "api/contents").status_code == 403


def _kernel_token(srv) -> str:
    """The kernel token, as a kernel of this server sees it in its environment."""
    with kernel_api_token(srv) as token:
        return token


def test_policies_outside_a_server(tmp_path):
    """The rules that need no server: root '/' still refuses the state and runtime folders
    and /proc; in-process use is the user's own machine, only malformed paths refused."""
    state = tmp_path / "state"
    runtime = tmp_path / "runtime"
    for d in (state, runtime):
        d.mkdir()
    (state / "secret.key").write_text("k")
    slash = ServerRoot("/", allow_hidden=True,
                       refused=[(state, "the cloudtik state folder"),
                                (runtime, "Jupyter's runtime folder")])
    for path, what in ((state / "secret.key", "state folder"),
                       (runtime / "jpserver-1.json", "runtime folder"),
                       (Path("/proc/self/cmdline"), "/proc"), (Path("/sys/kernel"), "/sys"),
                       (Path("/dev/null"), "/dev")):
        with pytest.raises(CloudTikError) as e:
            resolve(str(path), "inputs", slash)
        assert e.value.http_status == 403 and what in e.value.message
    assert resolve(str(tmp_path), "inputs", slash).text == str(tmp_path.resolve())
    local = InProcess()
    assert resolve("/etc/hostname", "inputs", local).text == "/etc/hostname"
    for bad in ("a\x00b", "x" * 5000, "d/" + "n" * 300):
        with pytest.raises(CloudTikError) as e:
            resolve(bad, "inputs", local)
        assert e.value.http_status == 400 and e.value.field == "inputs"
