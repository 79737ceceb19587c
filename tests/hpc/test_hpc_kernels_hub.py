"""Issue 33, point 4: interactive HPC kernels through a real JupyterHub.

The sidekick holds the backend (the project's Slurm, as ``daint``) and the catalogue's
kernel profiles; alice (group physics) and bob (group chemistry) each have their own
single-user server, which lists as kernel specs only the profiles the catalogue grants
them (a profile *and* its backend), starts them through the sidekick, and reaches the
kernel through websockets to the sidekick.  Written as bob attacking alice's kernels
with everything the sidekick's kernel API takes, and as a server killed while its
kernel runs (the sidekick's lease ends the job).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import dataclass

import doc_examples
import psutil
import pytest
import requests
import yaml

from cloudtik_emulators.hub import start_hub
from tests.hpc.conftest import wait_for
from tests.hpc.test_hpc_docs_kernels import _execute, _job_ids

pytestmark = pytest.mark.slow

PROFILE = "cloudtik-hub-daint-debug"


@dataclass
class UserServer:
    """A user's single-user server as ``_execute`` reaches it."""

    url: str
    token: str

    def headers(self) -> dict:
        return {"Authorization": f"token {self.token}"}

    def kernels(self) -> list:
        return requests.get(self.url + "api/kernels", headers=self.headers(), timeout=60).json()


@pytest.fixture(scope="module")
def hub(tmp_path_factory, slurm):
    base = tmp_path_factory.mktemp("hubkernels")
    backends = {"daint": {"type": "slurm", "env": slurm.env,
                          "workdir": str(base / "daint-jobs"),
                          "environment": {"python": sys.executable}}}
    h = start_hub(base / "hub", sidekick_config=(
        f"c.HPC.backends = {backends!r}\n"
        "c.CloudTikHub.kernel_lease = 10\n"
        "c.CloudTikHub.kernels_per_user = 2\n"),
        user_args=["--ServerApp.kernel_spec_manager_class="
                   "jupyter_cloudtik.hpc.kernels.HPCKernelSpecManager",
                   "--HPCKernels.poll_interval=0.5"])
    try:
        admin = h.browser("admin")
        api = h.sidekick_api
        # the catalogue of docs/hpc.md, as written (chemistry may use the debug profile
        # but not its backend: offered to nobody there, refused like a missing one)
        catalogue = yaml.safe_load(doc_examples.block(
            "docs/hpc.md", "Interactive kernels through the hub", 0, lang="yaml").text)
        for res in catalogue["resources"]:
            body = {k: v for k, v in res.items() if k not in ("kind", "name")}
            r = admin.put(api + f"hub/catalog/{res['kind']}/{res['name']}", json=body)
            assert r.status_code == 200, r.text
        r = admin.put(api + "hub/catalog/kernel/bad", json={"spec": {"backend": "daint",
                                                                     "cores": 0}})
        assert r.status_code == 400 and r.json()["field"] == "spec.cores", r.text
    except BaseException:
        h.stop()
        raise
    yield h
    h.stop_all()


def _server(hub, user) -> UserServer:
    return UserServer(hub.start_server(user).rstrip("/") + "/", hub.token(user))


def _specs(server: UserServer) -> dict:
    r = requests.get(server.url + "api/kernelspecs", headers=server.headers(), timeout=60)
    assert r.status_code == 200, r.text
    return {n: s["spec"] for n, s in r.json()["kernelspecs"].items()
            if n.startswith("cloudtik-hub-")}


def _sidekick_kernels(hub) -> dict:
    """The sidekick's own record of every kernel (as the process sees it: its state
    folder's rows), for what bob must not have changed."""
    from jupyter_cloudtik.core.store import Store

    return {r["id"]: dict(r) for r in Store(str(hub.state_dir)).query(
        "SELECT * FROM hpc_kernels")}


def test_profiles_kernels_and_their_owner(hub, slurm):
    alice, bob = _server(hub, "alice"), _server(hub, "bob")
    api = hub.sidekick_api

    # what each user's launcher lists: the catalogue's grants, decided by the sidekick
    specs = _specs(alice)
    assert sorted(specs) == ["cloudtik-hub-daint-debug", "cloudtik-hub-daint-large"], specs
    assert specs[PROFILE]["display_name"] == "Python 3 on daint — 1 core, 30 min"
    prov = specs[PROFILE]["metadata"]["kernel_provisioner"]
    assert prov == {"provisioner_name": "cloudtik-hpc",
                    "config": {"backend": "daint", "profile": "debug", "hub": True}}, prov
    assert _specs(bob) == {}  # a profile without its backend: not offered

    # a backend whose admin did not accept one site account for all: no kernels on it
    admin = hub.browser("admin")
    r = admin.put(api + "hub/catalog/hpc/daint", json={"spec": {}, "groups": ["physics"]})
    assert r.status_code == 200, r.text
    try:
        assert hub.session("alice").get(api + "hub/kernel-profiles").json()["profiles"] == []
        r = hub.session("alice").post(api + "hub/kernels", json={"profile": "debug",
                                                                 "key": "k" * 32})
        assert r.status_code == 403 and r.json()["field"] == "backend", r.text
        assert "shared_account_kernels: true" in r.json()["message"]
    finally:
        r = admin.put(api + "hub/catalog/hpc/daint", json={
            "spec": {"shared_account_kernels": True}, "groups": ["physics"]})
        assert r.status_code == 200, r.text
    r = admin.put(api + "hub/catalog/hpc/daint", json={
        "spec": {"shared_account_kernels": "yes"}, "groups": ["physics"]})
    assert r.status_code == 400 and r.json()["field"] == "spec.shared_account_kernels"
    assert [p["name"] for p in hub.session("bob").get(api + "hub/kernel-profiles").json()[
        "profiles"]] == []

    # alice: a kernel through the hub; its cells run in the Slurm job
    before = set(_job_ids(slurm.env))
    r = requests.post(alice.url + "api/kernels", headers=alice.headers(),
                      json={"name": PROFILE}, timeout=300)
    assert r.status_code == 201, r.text[:2000]
    kid = r.json()["id"]
    status, out = asyncio.run(_execute(alice, kid, "import os\nprint(os.environ['SLURM_JOB_ID'],"
                                                   " os.environ['SLURM_CPUS_PER_TASK'])"))
    assert status == "ok", out
    job, cpus = out.split()
    assert job in set(_job_ids(slurm.env)) - before and cpus == "1", (out, before)
    rows = _sidekick_kernels(hub)
    (row,) = [r for r in rows.values() if r["native_id"] == job]
    hub_kid = row["id"]

    # interrupt: a message through the relay; the cell ends, the kernel lives on
    async def interrupted() -> tuple[str, str]:
        task = asyncio.ensure_future(_execute(alice, kid, "import time\ntime.sleep(120)"))
        await asyncio.sleep(3)
        await asyncio.to_thread(requests.post, alice.url + f"api/kernels/{kid}/interrupt",
                                headers=alice.headers(), timeout=60)
        return await asyncio.wait_for(task, 60)

    status, out = asyncio.run(interrupted())
    assert status == "error" and "KeyboardInterrupt" in out, (status, out)
    status, out = asyncio.run(_execute(alice, kid, "print(6 * 7)"))
    assert (status, out.strip()) == ("ok", "42")

    # bob, with his own token, on every route of alice's kernel: the very answer of a
    # kernel that does not exist, and nothing of hers changes
    b = hub.session("bob")
    missing = "0" * 32
    for method, path, body in (
            ("GET", "", None), ("DELETE", "", None), ("GET", "/ports", None),
            ("POST", "/connect", None), ("POST", "/signal", {"signal": "INT"}),
            ("POST", "/cancel", None)):
        theirs = b.request(method, api + f"hub/kernels/{hub_kid}{path}", json=body, timeout=60)
        none = b.request(method, api + f"hub/kernels/{missing}{path}", json=body, timeout=60)
        assert theirs.status_code == none.status_code == 404, (path, theirs.text, none.text)
        assert theirs.json()["message"].replace(hub_kid, missing) == none.json()["message"]
    # the websocket of a port of hers
    from tornado.httpclient import HTTPClientError, HTTPRequest
    from tornado.websocket import websocket_connect

    async def ws(token: str, k: str) -> int:
        url = api.replace("http://", "ws://") + f"hub/kernels/{k}/channels/iopub_port"
        try:
            conn = await websocket_connect(HTTPRequest(
                url, headers={"Authorization": f"token {token}"}))
        except HTTPClientError as e:
            return e.code
        conn.close()
        return 101

    assert asyncio.run(ws(hub.token("bob"), hub_kid)) == 404
    assert asyncio.run(ws("not-a-token", hub_kid)) in (403, 401)
    assert asyncio.run(ws(hub.token("alice"), hub_kid)) == 101

    # alice's own browser session (a page of any origin in her browser): no channel
    async def ws_cookie(k: str) -> int:
        jar = hub.browser("alice").cookies
        url = api.replace("http://", "ws://") + f"hub/kernels/{k}/channels/iopub_port"
        try:
            conn = await websocket_connect(HTTPRequest(url, headers={
                "Cookie": "; ".join(f"{c.name}={c.value}" for c in jar),
                "Origin": hub.url.rstrip("/")}))
        except HTTPClientError as e:
            return e.code
        conn.close()
        return 101

    assert asyncio.run(ws_cookie(hub_kid)) == 403
    # bob starting the profile, the other, or one that does not exist: the same 404, no job
    jobs = set(_job_ids(slurm.env))
    for name in ("debug", "large", "nope"):
        r = b.post(api + "hub/kernels", json={"profile": name, "key": "k" * 32}, timeout=60)
        assert r.status_code == 404 and r.json()["field"] == "profile", (name, r.text)
        assert name in r.json()["message"] and "daint" not in r.json()["message"]
    assert set(_job_ids(slurm.env)) == jobs
    assert _sidekick_kernels(hub).keys() == rows.keys()
    status, out = asyncio.run(_execute(alice, kid, "print('still mine')"))
    assert (status, out.strip()) == ("ok", "still mine")

    # shut down from alice's server: the job ends, the sidekick forgets the kernel
    r = requests.delete(alice.url + f"api/kernels/{kid}", headers=alice.headers(), timeout=120)
    assert r.status_code == 204, r.text
    wait_for(lambda: job not in _job_ids(slurm.env), 60, what="the kernel's job to end")
    assert hub.session("alice").get(api + f"hub/kernels/{hub_kid}").status_code == 404
    assert hub_kid not in _sidekick_kernels(hub)


def test_hostile_starts_submit_nothing(hub, slurm):
    """Every field of a start (HubKernelStart in openapi.yaml) with hostile values, as
    alice (who may use the profile): a 4xx naming the field, and no job, file or row."""
    from jupyter_cloudtik.api.openapi import spec

    schema = spec()["components"]["schemas"]
    fields = set(schema["HubKernelStart"]["properties"])
    assert fields == {"profile", "custom", "key", "session"}, fields
    a = hub.session("alice")
    api = hub.sidekick_api
    good = {"profile": "debug", "key": "k" * 32}
    hostile = {
        "profile": ["", "../debug", "debug/../large", "x" * 300, 5, None, ["debug"],
                    "DEBUG", "debug\n", "bad"],
        "custom": [{"cores": 3, "time": "30m"}, {"cores": 2, "time": "2h"},
                   {"cores": 0, "time": "30m"}, {"cores": 1}, {"cores": 1, "time": "30s"},
                   {"cores": 1, "time": "30m", "gpus": 1}, {"cores": 1, "time": "30m",
                                                           "partition": "x"}, "big", 7],
        "key": ["", "short", "k" * 200, "../../../etc/passwd", "k" * 20 + "\n",
                "k" * 20 + "'", None, 5],
        "session": [5, ["x"]],
    }
    jobs = set(_job_ids(slurm.env))
    rows = _sidekick_kernels(hub)
    folders = set(os.listdir(hub.base.parent / "daint-jobs")) \
        if (hub.base.parent / "daint-jobs").exists() else set()
    for name, values in hostile.items():
        for value in values:
            r = a.post(api + "hub/kernels", json={**good, name: value}, timeout=60)
            assert 400 <= r.status_code < 500, (name, value, r.status_code, r.text[:300])
            body = r.json()
            assert body.get("field", "").split(".")[0] in (name, "body", "cores", "time",
                                                            "gpus", "partition"), \
                (name, value, body)
    # the large profile (8 cores) on a 2-core partition: the partition's line, a 409
    r = a.post(api + "hub/kernels", json={**good, "profile": "large"}, timeout=60)
    assert r.status_code == 409 and "at most 2" in r.json()["message"], r.text
    assert set(_job_ids(slurm.env)) == jobs
    assert _sidekick_kernels(hub) == rows
    after = set(os.listdir(hub.base.parent / "daint-jobs")) \
        if (hub.base.parent / "daint-jobs").exists() else set()
    assert after == folders


def test_a_killed_server_s_kernel_is_ended_by_the_lease(hub, slurm):
    alice = _server(hub, "alice")
    r = requests.post(alice.url + "api/kernels", headers=alice.headers(),
                      json={"name": PROFILE}, timeout=300)
    assert r.status_code == 201, r.text[:2000]
    status, out = asyncio.run(_execute(alice, r.json()["id"],
                                       "import os\nprint(os.environ['SLURM_JOB_ID'])"))
    assert status == "ok", out
    job = out.strip()
    procs = [p for p in psutil.process_iter(["cmdline", "environ"])
             if "jupyterhub.singleuser" in " ".join(p.info["cmdline"] or [])
             and (p.info["environ"] or {}).get("JUPYTERHUB_USER") == "alice"]
    assert len(procs) == 1, procs
    procs[0].send_signal(signal.SIGKILL)  # the hub reaps it (a zombie meanwhile)
    # the lease (10 s) runs out: the sidekick ends the job and forgets the kernel
    wait_for(lambda: job not in _job_ids(slurm.env), 60,
             what="the sidekick to end the job of the killed server's kernel")
    wait_for(lambda: not [r for r in _sidekick_kernels(hub).values()
                          if r["native_id"] == job], 30, what="the kernel's row to go")
    log = (hub.base / "hub.log").read_text(errors="replace")
    assert "stopped asking after it" in log, log[-3000:]
    hub.stop_server("alice", timeout=30)


# --- over SSH, as the sidekick runs it on a real hub ---------------------------------------
from . import test_hpc_environment as _site  # noqa: E402

job_account, env_sshd, site_slurm = _site.job_account, _site.env_sshd, _site.site_slurm


def test_over_ssh_the_key_stays_with_the_sidekick(tmp_path_factory, site_slurm, env_sshd,
                                                  job_account):
    """The login node over SSH as the site's own account, the key in the sidekick's secret
    store: the kernel is reached through SSH to its node, forwarded to Unix sockets in a
    private folder of the sidekick (no loopback port of the shared machine reaches it), and
    nothing of the key is on the user's side."""
    import subprocess
    import uuid

    base = tmp_path_factory.mktemp("hubkernels-ssh")
    workdir = f"{job_account.pw_dir}/hk-{uuid.uuid4().hex[:8]}"
    backends = {"site": {"type": "slurm", "host": "127.0.0.1", "port": env_sshd.port,
                         "user": _site.ACCOUNT,
                         "known_hosts": str(env_sshd.folder / "known_hosts"),
                         "env": site_slurm.env, "workdir": workdir,
                         "environment": {"packages": ["ipykernel"]},
                         "kernel_node_address": "127.0.0.1",
                         "kernel_node_port": env_sshd.port}}
    h = start_hub(base / "hub", sidekick_config=f"c.HPC.backends = {backends!r}\n",
                  user_args=["--ServerApp.kernel_spec_manager_class="
                             "jupyter_cloudtik.hpc.kernels.HPCKernelSpecManager",
                             "--HPCKernels.poll_interval=0.5"])
    try:
        key_file = base / "id"
        key_file.write_text(env_sshd.private_key)
        (base / "hpc.yaml").write_text(yaml.safe_dump({"backends": backends}))
        # the admin puts the key into the sidekick's secret store, as for its jobs
        r = subprocess.run([sys.executable, "-m", "jupyter_cloudtik", "jobs", "secret", "site",
                            "ssh_key", "--from-file", str(key_file)], capture_output=True,
                           text=True, env={**os.environ, "CLOUDTIK_STATE_DIR": str(h.state_dir),
                                           "CLOUDTIK_HPC_CONFIG": str(base / "hpc.yaml")})
        assert r.returncode == 0, r.stderr
        key_file.unlink()
        admin = h.browser("admin")
        for kind, name, body in (("hpc", "site", {"spec": {"shared_account_kernels": True},
                                                  "groups": ["physics"]}),
                                 ("kernel", "small", {"spec": {"backend": "site", "cores": 1,
                                                               "time": "10m"},
                                                      "groups": ["physics"]})):
            r = admin.put(h.sidekick_api + f"hub/catalog/{kind}/{name}", json=body)
            assert r.status_code == 200, r.text
        alice = _server(h, "alice")
        r = requests.post(alice.url + "api/kernels", headers=alice.headers(),
                          json={"name": "cloudtik-hub-site-small"}, timeout=600)
        assert r.status_code == 201, (r.text[:2000], h.log_tail(80))
        kid = r.json()["id"]
        status, out = asyncio.run(_execute(alice, kid, "import getpass, os\nprint(getpass."
                                                       "getuser(), os.environ['SLURM_JOB_ID'])"))
        assert status == "ok", out
        user, job = out.split()
        assert user == _site.ACCOUNT
        # the sidekick reaches the kernel through Unix sockets in its private folder
        import glob
        from pathlib import Path

        sidekick = [p for p in psutil.process_iter(["cmdline"])
                    if "hub-service" in " ".join(p.info["cmdline"] or [])
                    and str(base) in " ".join(p.info["cmdline"] or [])]
        (sk,) = sidekick
        # its Unix sockets: listed in /proc/net/unix as bound paths; the folder is 0700
        paths = [ln.split()[-1] for ln in Path("/proc/net/unix").read_text().splitlines()
                 if "/cloudtik-kernels-" in ln]
        folders = {os.path.dirname(p) for p in paths}
        assert len(folders) == 1, paths
        (folder,) = [Path(f) for f in folders]
        channels = folder.parent
        assert glob.glob(f"{channels}/*") == [str(folder)]
        assert oct(channels.stat().st_mode & 0o777) == "0o700", sk
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            ["control_port", "hb_port", "iopub_port", "shell_port", "stdin_port"])
        # nothing of the key on alice's side: her server's process, files and answers
        secret_line = env_sshd.private_key.strip().splitlines()[1]
        (proc,) = [p for p in psutil.process_iter(["cmdline", "environ"])
                   if "jupyterhub.singleuser" in " ".join(p.info["cmdline"] or [])
                   and (p.info["environ"] or {}).get("JUPYTERHUB_USER") == "alice"]
        assert secret_line not in " ".join(proc.info["cmdline"]) + str(proc.info["environ"])
        home = h.base / "homes" / "alice"
        for path in home.rglob("*"):
            if path.is_file():
                assert secret_line not in path.read_text(errors="replace"), path
        status, out = asyncio.run(_execute(alice, kid, "print(6 * 7)"))
        assert (status, out.strip()) == ("ok", "42")
        r = requests.delete(alice.url + f"api/kernels/{kid}", headers=alice.headers(),
                            timeout=120)
        assert r.status_code == 204, r.text
        out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                             env={**os.environ, **site_slurm.env}).stdout.split()
        wait_for(lambda: job not in subprocess.run(
            ["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
            env={**os.environ, **site_slurm.env}).stdout.split(), 60,
            what="the kernel's job to end")
        assert not list(channels.iterdir())  # the sockets went with it
        log = (h.base / "hub.log").read_text(errors="replace")
        assert secret_line not in log
        assert "reached through SSH" in log
    finally:
        try:
            h.stop_server("alice", timeout=30)
        finally:
            h.stop()


def test_a_sidekick_across_the_network_without_tls_is_refused(monkeypatch):
    """The key and the kernel's messages never cross the network in the clear: a server
    whose sidekick is at http:// on another host refuses before any request; https://
    and this machine's loopback pass this check."""
    from jupyter_cloudtik.core.errors import ConfigError
    from jupyter_cloudtik.hpc.kernels.profiles import Profile
    from jupyter_cloudtik.hpc.kernels.through_hub import HubKernelJob

    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "t" * 32)
    profile = Profile(name="debug", backend="daint", hub=True)
    for url in ("http://hub:8081/services/cloudtik/", "http://10.0.0.5/services/cloudtik/",
                "ws://hub/services/cloudtik/"):
        with pytest.raises(ConfigError) as e:
            HubKernelJob(url, profile, key="k" * 32).check()
        assert e.value.field == "hub" and "unencrypted" in e.value.message
    for url in ("https://hub:8081/services/cloudtik/", "http://127.0.0.1:9/services/x/"):
        HubKernelJob(url, profile, key="k" * 32).check()  # no size: nothing asked
