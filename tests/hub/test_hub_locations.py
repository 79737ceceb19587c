"""Issue 12 against a real hub: no user reads or writes the sidekick's disk, uses another
group's storage, or turns a kernel token into more.

One hub for the module (real JupyterHub, configurable-http-proxy, the sidekick, users'
single-user servers), with a *remote* HPC backend as docs/hub.md recommends: a real
single-node Slurm whose jobs do not share the sidekick's filesystem, so every input is
staged by the sidekick — exactly where it must never read a path of its own disk.
"""

from __future__ import annotations

import base64
import json
import sys
import time
import uuid

import psutil
import pytest
import requests

from cloudtik_emulators.hub import start_hub, wait_operation
from jupyter_cloudtik.storage.servers import start_server

pytestmark = pytest.mark.slow

STORAGE_SECRET = f"stor-secret-{uuid.uuid4().hex}"
CANARY = f"CANARY-{uuid.uuid4().hex}"
FINAL = ("succeeded", "failed", "cancelled")


def _nb(src: str) -> dict:
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                        "language": "python"}},
            "cells": [{"cell_type": "code", "id": "c0", "metadata": {"tags": []},
                       "execution_count": None, "outputs": [], "source": src}]}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    from cloudtik_emulators.slurm import SlurmCluster, missing_programs

    missing = missing_programs()
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)}); "
                    "run scripts/install-system-deps.sh")
    cluster = SlurmCluster(tmp_path_factory.mktemp("hub-slurm"), cpus=2, memory_mb=2000,
                           max_time_minutes=60)
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def hub(tmp_path_factory, slurm):
    base = tmp_path_factory.mktemp("hubloc")
    outside = base / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text(CANARY)
    data = base / "webdav-data"
    (data / "results").mkdir(parents=True)
    (data / "results" / "run1.csv").write_text("x,y\n1,2\n")
    dav = start_server("webdav", data, workdir=base / "dav", password=STORAGE_SECRET)
    # the admin names the system's Python with papermill (a shared service has no
    # session of the user's to replicate: hpc/environment.prepare refuses that)
    backends = {"remote": {"type": "slurm", "env": slurm.env, "shared_filesystem": False,
                           "workdir": str(base / "slurm-jobs"),
                           "environment": {"python": sys.executable}}}
    h = start_hub(base / "hub", sidekick_config=f"c.HPC.backends = {backends!r}\n")
    try:
        h.outside = outside
        admin = h.browser("admin")
        api = h.sidekick_api
        options = dav.storage_options()
        password = options.pop("pass")
        r = admin.put(api + "hub/catalog/storage/physics-data", json={
            "spec": {"type": "webdav", "options": options, "read_only": True},
            "secrets": {"pass": password}, "groups": ["physics"]})
        assert r.status_code == 200, r.text
        r = admin.put(api + "hub/catalog/hpc/remote", json={
            "spec": {}, "groups": ["physics", "chemistry"]})
        assert r.status_code == 200, r.text
        r = admin.put(api + "hub/catalog/provider/local-pool", json={
            "spec": {"type": "local"}, "groups": ["physics"]})
        assert r.status_code == 200, r.text
    except BaseException:  # a failed set-up leaves no hub behind
        h.stop()
        raise
    yield h
    h.stop_all()
    dav.stop()
    assert CANARY not in (base / "hub" / "hub.log").read_text(errors="replace")


def _refused(resp: requests.Response, status: int, field: str) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text[:400])
    body = resp.json()
    assert body["field"] == field, body
    assert CANARY not in resp.text
    return body


def test_no_user_reads_or_writes_the_sidekicks_disk(hub):
    """Issue 12, bullets 1 and 2: inputs staged from the sidekick's own disk (its
    secret.key), results written to a folder of the sidekick's choosing."""
    api = hub.sidekick_api
    alice = hub.session("alice")
    key = hub.state_dir / "secret.key"
    assert key.exists()
    secret = key.read_text().strip()
    for value in (str(key), "/etc/passwd", f"file://{key}", "file:///etc/passwd",
                  str(hub.outside / "canary.txt"), "relative.txt", "../../etc/passwd",
                  "sk=" + str(key), "/proc/self/cmdline", "remote:/etc/passwd"):
        r = alice.post(api + "jobs", json={"command": ["cat", "secret.key"],
                                           "backend": "remote", "inputs": [value]})
        body = _refused(r, 403, "inputs")
        assert secret not in r.text, value
        if not value.startswith("remote:"):
            assert "the sidekick's disk is not yours" in body["message"], body
    r = alice.post(api + "jobs", json={"notebook": str(hub.outside / "x.ipynb"),
                                       "backend": "remote"})
    _refused(r, 403, "notebook")
    target = hub.outside / "written-here"
    r = alice.post(api + "jobs", json={"command": ["true"], "backend": "remote",
                                       "output": str(target)})
    _refused(r, 403, "output")
    assert not target.exists()
    assert alice.get(api + "jobs").json()["jobs"] == []  # nothing was even recorded


def test_storages_named_in_a_job_follow_the_catalogue(hub):
    """Issue 12, bullet 3: bob staged physics' storage with the admin's credentials."""
    api = hub.sidekick_api
    alice, bob = hub.session("alice"), hub.session("bob")
    assert bob.get(api + "storages/physics-data").status_code == 404
    theirs = _refused(bob.post(api + "jobs", json={
        "command": ["cat", "run1.csv"], "backend": "remote",
        "inputs": ["physics-data:results/run1.csv"]}), 404, "inputs")
    nobody = _refused(bob.post(api + "jobs", json={
        "command": ["cat", "run1.csv"], "backend": "remote",
        "inputs": ["nosuch-data:results/run1.csv"]}), 404, "inputs")
    assert theirs["message"].replace("physics-data", "X") == \
        nobody["message"].replace("nosuch-data", "X")  # missing and not-yours: one answer
    _refused(bob.post(api + "jobs", json={"command": ["true"], "backend": "remote",
                                          "output": "physics-data:bob"}), 404, "output")
    _refused(bob.post(api + "storage-transfers", json={
        "src": "physics-data:results/run1.csv", "dst": "physics-data:x"}), 404, "src")
    # alice may read it, not write it: it is read-only
    _refused(alice.post(api + "jobs", json={"command": ["true"], "backend": "remote",
                                            "output": "physics-data:out"}), 403, "output")
    assert bob.get(api + "jobs").json()["jobs"] == []


def test_a_users_files_travel_as_content_from_their_server(hub):
    """The notebook and inputs of a job submitted in alice's server are read there,
    inside her root, and sent to the sidekick, which writes them only into the job."""
    alice = hub.session("alice")
    server = hub.start_server("alice")
    local_api = server + "cloudtik/api/"
    home = hub.base / "homes" / "alice"
    (home / "sub").mkdir(parents=True, exist_ok=True)
    (home / "analysis.ipynb").write_text(json.dumps(_nb(
        "print('sum', int(open('data.txt').read()) + int(open('two.txt').read()))")))
    (home / "data.txt").write_text("40")
    (home / "sub" / "b.txt").write_text("2")
    r = alice.post(local_api + "jobs", json={
        "notebook": "analysis.ipynb", "backend": "remote",
        "inputs": ["data.txt", "two.txt=sub/b.txt", "physics-data:results/run1.csv"]})
    assert r.status_code == 202, r.text
    job = r.json()["job"]
    assert str(hub.state_dir) not in r.text
    deadline = time.monotonic() + 120
    while (job := alice.get(local_api + f"jobs/{job['id']}",
                            params={"refresh": "true"}).json())["state"] not in FINAL:
        assert time.monotonic() < deadline, job
        time.sleep(0.5)
    logs = alice.get(local_api + f"jobs/{job['id']}/logs").json()["text"]
    assert job["state"] == "succeeded", (job, logs)
    assert job["notebook"] == "analysis.ipynb"
    assert {i["name"]: i["source"] for i in job["inputs"]}["data.txt"] == "sent:data.txt"
    assert str(hub.state_dir) not in json.dumps(job) + logs
    got = alice.get(local_api + f"jobs/{job['id']}/files/two.txt")
    assert got.status_code == 200 and got.content == b"2"
    got = alice.get(local_api + f"jobs/{job['id']}/files/run1.csv")
    assert got.content == b"x,y\n1,2\n"
    out = alice.get(local_api + f"jobs/{job['id']}/files/analysis.out.ipynb").json()
    assert "sum 42" in json.dumps(out)
    assert not list((hub.state_dir / "hpc" / "content").glob("*"))  # nothing kept

    # a parameter the travelling notebook cannot receive (it has no cell tagged
    # `parameters`): the sidekick refuses it before writing or staging anything (issue 20)
    r = alice.post(local_api + "jobs", json={
        "notebook": "analysis.ipynb", "backend": "remote", "parameters": {"alpha": 2},
        "inputs": ["data.txt"]})
    body = _refused(r, 400, "parameters.alpha")
    assert "'analysis.ipynb' has no cell tagged 'parameters'" in body["message"]
    assert not list((hub.state_dir / "hpc" / "content").glob("*"))
    r = alice.post(local_api + "jobs", json={
        "notebook": "analysis.ipynb", "backend": "remote", "parameters": {"alpha": 2},
        "inputs": ["data.txt"], "allow_unknown_parameters": True})
    assert r.status_code == 202, r.text
    assert "no cell tagged 'parameters'" in r.json()["job"]["warnings"][0]
    alice.delete(local_api + f"jobs/{r.json()['job']['id']}")

    # what is not under her root is refused by her server, before the sidekick
    for value in ("../bob/x", "/etc/passwd", str(hub.state_dir / "secret.key"),
                  "/proc/self/cmdline"):
        r = alice.post(local_api + "jobs", json={"command": ["true"], "backend": "remote",
                                                 "inputs": [value]})
        _refused(r, 403, "inputs")
    r = alice.post(local_api + "jobs", json={"command": ["true"], "backend": "remote",
                                             "output": "results"})
    _refused(r, 403, "output")
    # files sent straight to the sidekick land in the job only, whatever their names
    for name in ("../../evil.txt", "/tmp/evil.txt", "a/../../evil.txt"):
        r = alice.post(hub.sidekick_api + "jobs", json={
            "command": ["true"], "backend": "remote",
            "files": {name: base64.b64encode(b"evil").decode()}})
        _refused(r, 400, "files")


def test_kernel_token_through_the_hub_is_a_capability(hub):
    """A kernel of alice's server: its token works for jobs and storage use, not for the
    catalogue or credentials, and stages nothing of her server outside her root."""
    alice = hub.session("alice")
    server = hub.start_server("alice")
    local_api = server + "cloudtik/api/"
    r = alice.post(server + "api/kernels", json={"name": "python3"})
    assert r.status_code == 201, r.text
    kid = r.json()["id"]
    try:
        token = None
        deadline = time.monotonic() + 30
        while token is None and time.monotonic() < deadline:
            for proc in psutil.process_iter(["cmdline", "environ"]):
                if kid in " ".join(proc.info["cmdline"] or []):
                    token = (proc.info["environ"] or {}).get("CLOUDTIK_API_TOKEN")
            time.sleep(0.2)
        assert token, "no kernel token in the kernel's environment"
        k = requests.Session()
        k.trust_env = False
        k.headers["Authorization"] = f"token {token}"
        assert k.get(local_api + "storages").status_code == 200
        for method, path, what in (("GET", "hub/catalog", "catalogue"),
                                   ("PUT", "hub/catalog/storage/x", "catalogue"),
                                   ("GET", "hub/audit", "audit"),
                                   ("POST", "storages", "adding a storage"),
                                   ("POST", "hub/egress/shares/any/accept",
                                    "egress share offers")):
            r = k.request(method, local_api + path, json={})
            body = _refused(r, 403, "token")
            assert what in body["message"], body
        r = k.post(local_api + "jobs", json={"command": ["true"], "backend": "remote",
                                             "inputs": ["/proc/self/cmdline"]})
        _refused(r, 403, "inputs")
    finally:
        alice.delete(server + f"api/kernels/{kid}")


def test_the_state_folder_is_not_in_a_users_cluster_logs(hub):
    """Issue 12, bullet 1: the sidekick's state folder was printed in a user's own
    cluster logs."""
    alice = hub.session("alice")
    api = hub.sidekick_api
    r = alice.post(api + "clusters", json={"name": "alice-loc", "provider": "local-pool",
                                           "workers": 0})
    assert r.status_code == 202, r.text
    op = wait_operation(alice, api, r.json()["operation"]["id"])
    try:
        assert op["state"] == "succeeded", op
        state = str(hub.state_dir)
        logs = alice.get(api + "clusters/alice-loc/logs").text
        assert logs and state not in logs
        events = alice.get(api + f"operations/{op['id']}/events").text
        assert state not in events
        got = alice.get(api + "clusters/alice-loc").text
        assert state not in got, got[max(0, got.find(state) - 300):got.find(state) + 100]
        admin_logs = hub.session("admin").get(api + "clusters/alice-loc/logs").text
        assert admin_logs  # the admin sees them too (redacted the same way)
    finally:
        r = alice.delete(api + "clusters/alice-loc")
        if r.status_code == 202:
            wait_operation(alice, api, r.json()["operation"]["id"])


def test_what_stays_with_the_person_is_refused_to_the_servers_token(hub):
    """Issue 26: a kernel of alice's server has her server's hub token in its environment
    (``JUPYTERHUB_API_TOKEN``, as every process of her server does); with it a kernel
    changed an egress rule and answered a share offer.  Those need her own browser
    session now; what a kernel may do with it (the table's kernel column) still works."""
    server = hub.start_server("alice")
    alice = hub.session("alice")
    r = alice.post(server + "api/kernels", json={"name": "python3"})
    assert r.status_code == 201, r.text
    kid = r.json()["id"]
    try:
        token, deadline = None, time.monotonic() + 30
        while token is None and time.monotonic() < deadline:
            for proc in psutil.process_iter(["cmdline", "environ"]):
                if kid in " ".join(proc.info["cmdline"] or []):
                    token = (proc.info["environ"] or {}).get("JUPYTERHUB_API_TOKEN")
            time.sleep(0.2)
        assert token, "the kernel has no hub token (then there is nothing to test)"
        k = requests.Session()
        k.trust_env = False
        k.headers["Authorization"] = f"token {token}"
        api = hub.sidekick_api
        assert k.get(api + "clusters").status_code == 200   # using: the kernel column
        for method, path, body in (
                ("PUT", "hub/egress/rules/from-kernel", {"host": "example.org",
                                                         "header": "X-K", "value": "v" * 8}),
                ("DELETE", "hub/egress/rules/anything", None),
                ("POST", "hub/egress/shares/anything/accept", None),
                ("POST", "hub/egress/shares/anything/decline", None)):
            r = k.request(method, api + path, json=body)
            body = _refused(r, 403, "token")
            assert "browser session" in body["message"] and "/egress" in body["message"]
        assert hub.browser("alice").get(api + "hub/egress/rules/from-kernel").status_code \
            == 404   # nothing was made
    finally:
        alice.delete(server + f"api/kernels/{kid}")


def test_a_failed_up_and_the_event_cursor_show_nothing_of_the_sidekick(hub):
    """Issue 26, low: a failed ``up``'s reason named the sidekick's state folder (the
    node log's path), and ``last_event_id`` was a hub-wide counter."""
    alice, bob = hub.session("alice"), hub.session("bob")
    api = hub.sidekick_api
    bob_cursor = bob.get(api + "operations").json()["last_event_id"]
    r = alice.post(api + "clusters", json={"name": "alice-fails", "provider": "local-pool",
                                           "workers": 0,
                                           "config": {"setup_commands": ["exit 7"]}})
    assert r.status_code == 202, r.text
    op = wait_operation(alice, api, r.json()["operation"]["id"])
    try:
        assert op["state"] == "failed", op
        state = str(hub.state_dir)
        texts = [alice.get(api + f"operations/{op['id']}").text,
                 alice.get(api + f"operations/{op['id']}/events").text,
                 alice.get(api + "clusters/alice-fails").text,
                 alice.get(api + "clusters/alice-fails/logs").text]
        assert any("exit code" in t or "setup command" in t for t in texts), texts
        for text in texts:
            assert state not in text, text[max(0, text.find(state) - 200):][:400]
        # alice's activity does not move bob's cursor: it is his own events' newest
        assert bob.get(api + "operations").json()["last_event_id"] == bob_cursor
        assert alice.get(api + "operations").json()["last_event_id"] > bob_cursor
    finally:
        r = alice.delete(api + "clusters/alice-fails")
        if r.status_code == 202:
            wait_operation(alice, api, r.json()["operation"]["id"])


def test_an_hpc_systems_work_folder_is_named_not_shown(hub):
    """Issue 26, low: an answer named the HPC work folder (a shared account's folder on the
    system); every answer to a user names it ``<NAME work folder>`` instead."""
    alice = hub.session("alice")
    api = hub.sidekick_api
    r = alice.post(api + "jobs", json={"command": ["pwd"], "backend": "remote"})
    assert r.status_code == 202, r.text
    job_id = r.json()["job"]["id"]
    deadline = time.monotonic() + 120
    while (job := alice.get(api + f"jobs/{job_id}", params={"refresh": "1"}).json())[
            "state"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.3)
    assert job["state"] == "succeeded", job
    folder = str(hub.base.parent / "slurm-jobs")
    texts = [alice.get(api + f"jobs/{job_id}/logs").text,
             alice.get(api + f"jobs/{job_id}").text,
             alice.get(api + f"operations/{job['op_id']}/events").text]
    assert "<remote work folder>" in texts[0], texts[0]   # what `pwd` printed, named
    for text in texts:
        assert folder not in text, text[:400]


def test_the_sidekicks_own_packages_are_not_a_users_session(hub):
    """On the hub, ``packages: session`` would replicate the sidekick's installation (its
    own packages, not the user's): refused in one line naming the field and what to do."""
    alice = hub.session("alice")
    r = alice.post(hub.sidekick_api + "jobs", json={
        "command": ["true"], "backend": "remote", "packages": "session"})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["field"] == "environment.packages", body
    assert "shared service" in body["message"] and "\n" not in body["message"]
