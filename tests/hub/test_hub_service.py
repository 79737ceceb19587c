"""The sidekick behind a real JupyterHub: catalogue, delegation, isolation, egress, side-kicks.

One hub per module (``cloudtik_emulators.hub``): real JupyterHub, real
configurable-http-proxy, the sidekick as a managed service, real single-user servers.
Users: alice (group physics), bob (group chemistry), admin (hub admin).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
import requests

from cloudtik_emulators.hub import start_hub, wait_operation
from cloudtik_emulators.upstreams import make_test_ca, received, serve
from jupyter_cloudtik.storage.servers import start_server

pytestmark = pytest.mark.slow

PROVIDER_SECRET = f"prov-secret-{uuid.uuid4().hex}"
STORAGE_SECRET = f"stor-secret-{uuid.uuid4().hex}"
SCRATCH_SECRET = f"scratch-secret-{uuid.uuid4().hex}"
EGRESS_SECRET = f"Bearer egress-{uuid.uuid4().hex}"
ALL_SECRETS = (PROVIDER_SECRET, STORAGE_SECRET, SCRATCH_SECRET, EGRESS_SECRET)


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory):
    base = tmp_path_factory.mktemp("upstreams")
    ca_path, ctx = make_test_ca(base)
    http_srv, _ = serve(None)
    https_srv, _ = serve(ctx)
    yield {"ca": ca_path, "http": http_srv.server_address[1],
           "https": https_srv.server_address[1]}
    http_srv.shutdown()
    https_srv.shutdown()


@pytest.fixture(scope="module")
def webdav(tmp_path_factory):
    """Two real WebDAV servers (rclone serve) whose passwords only the admin knows."""
    base = tmp_path_factory.mktemp("webdav")
    data = base / "data"
    (data / "results").mkdir(parents=True)
    (data / "results" / "run1.csv").write_text("x,y\n1,2\n")
    servers = {"data": start_server("webdav", data, workdir=base / "w1",
                                    password=STORAGE_SECRET),
               "scratch": start_server("webdav", base / "scratch", workdir=base / "w2",
                                       password=SCRATCH_SECRET)}
    yield servers
    for srv in servers.values():
        srv.stop()


@pytest.fixture(scope="module")
def hub(tmp_path_factory, upstreams, webdav):
    base = tmp_path_factory.mktemp("hub")
    h = start_hub(base, sidekick_config=(
        f"c.CloudTikHub.egress_upstream_ca_bundle = {str(upstreams['ca'])!r}\n"))
    try:
        admin = h.browser("admin")  # catalogue changes: the admin's own browser session
        api = h.sidekick_api
        r = admin.put(api + "hub/catalog/provider/local-pool", json={
            "spec": {"type": "local"}, "secrets": {"access_key": PROVIDER_SECRET},
            "groups": ["physics"], "description": "machines of the physics department"})
        assert r.status_code == 200, r.text
        for name, srv, read_only in (("physics-data", webdav["data"], True),
                                     ("physics-scratch", webdav["scratch"], False)):
            options = srv.storage_options()
            password = options.pop("pass")
            r = admin.put(api + f"hub/catalog/storage/{name}", json={
                "spec": {"type": "webdav", "options": options, "read_only": read_only},
                "secrets": {"pass": password}, "groups": ["physics"]})
            assert r.status_code == 200, r.text
    except BaseException:  # a failed set-up leaves no hub behind
        h.stop()
        raise
    yield h
    h.stop_all()
    log = (base / "hub.log").read_text(errors="replace")
    leaked = [s for s in ALL_SECRETS if s in log]
    assert not leaked, "a secret value reached the hub/sidekick log"


def _no_secret(text: str) -> None:
    for s in ALL_SECRETS:
        assert s not in text


def test_catalogue_is_admin_only_and_filtered_by_group(hub):
    api = hub.sidekick_api
    alice, bob, admin = hub.session("alice"), hub.session("bob"), hub.browser("admin")
    r = alice.put(api + "hub/catalog/provider/mine", json={"spec": {"type": "local"}})
    assert r.status_code == 403 and r.json()["field"] == "user"
    r = hub.browser("alice").put(api + "hub/catalog/provider/mine",
                                 json={"spec": {"type": "local"}})
    assert r.status_code == 403 and r.json()["field"] == "user"
    # an admin's token (a script's, or a kernel of the admin's server that read it) may
    # not change the catalogue: that needs the admin's own browser session
    r = hub.session("admin").put(api + "hub/catalog/provider/mine",
                                 json={"spec": {"type": "local"}})
    assert r.status_code == 403 and r.json()["field"] == "token", r.text
    r = admin.put(api + "hub/catalog/widget/x", json={"spec": {}})
    assert r.status_code == 400 and "kind" in r.json()["message"]
    r = admin.put(api + "hub/catalog/template/t1", json={"spec": {"provider": 5}})
    assert r.status_code == 400 and r.json()["field"] == "spec.provider"
    # rclone's schema checks a storage before the catalogue keeps it
    r = admin.put(api + "hub/catalog/storage/bad", json={
        "spec": {"type": "webdav", "options": {"url": "http://x", "no_such_option": "1"}}})
    assert r.status_code == 400 and "no_such_option" in r.json()["message"], r.text
    assert admin.get(api + "hub/catalog/storage/bad").status_code == 404
    r = admin.put(api + "hub/catalog/storage/physics-data", json={
        "spec": {"type": "webdav", "options": {"url": "http://x", "no_such_option": "1"}},
        "groups": ["physics"]})
    assert r.status_code == 400
    assert admin.get(api + "hub/catalog/storage/physics-data").json()["spec"]["type"] == \
        "webdav"

    seen_a = alice.get(api + "hub/catalog").json()["resources"]
    assert {(x["kind"], x["name"]) for x in seen_a} == {
        ("provider", "local-pool"), ("storage", "physics-data"), ("storage", "physics-scratch")}
    assert all("users" not in x for x in seen_a)  # who else may use it is the admins' business
    assert bob.get(api + "hub/catalog").json()["resources"] == []
    assert bob.get(api + "hub/catalog/provider/local-pool").status_code == 404
    for resp in (alice.get(api + "hub/catalog"), admin.get(api + "hub/catalog")):
        _no_secret(resp.text)
        assert "<secret>" in resp.text

    # storages: alice lists the physics one, bob none; bob cannot reach it by name either
    names_a = [s["name"] for s in alice.get(api + "storages").json()["storages"]]
    assert names_a == ["physics-data", "physics-scratch"]
    assert bob.get(api + "storages").json()["storages"] == []
    assert bob.get(api + "storages/physics-data").status_code == 404
    assert bob.get(api + "storages/physics-data/ls").status_code == 404
    detail = alice.get(api + "storages/physics-data")
    assert detail.status_code == 200
    _no_secret(detail.text)
    r = alice.post(api + "storages", json={"name": "own", "url": "s3://b"})
    assert r.status_code == 403
    # nor check one (the notebook's %storage add asks this first): the same refusal,
    # and no secret in it
    r = bob.post(api + "storage-checks", json={"storage": {"name": "physics-data",
                                                           "url": "s3://b"}, "ask": []})
    assert r.status_code == 403, r.text
    _no_secret(r.text)


def test_storage_is_used_on_the_users_behalf(hub, webdav):
    """Alice browses and copies the admin's WebDAV storages: the sidekick holds the
    passwords; alice gets listings and copies, never the credentials."""
    api = hub.sidekick_api
    alice, bob = hub.session("alice"), hub.session("bob")
    r = alice.get(api + "storages/physics-data/ls", params={"path": "results"})
    assert r.status_code == 200, r.text
    assert [e["name"] for e in r.json()["entries"]] == ["run1.csv"]
    _no_secret(r.text)
    r = alice.post(api + "storage-transfers", json={
        "src": "physics-data:results/run1.csv", "dst": "physics-scratch:in"})
    assert r.status_code == 202, r.text
    op = wait_operation(alice, api, r.json()["operation"]["id"])
    assert op["state"] == "succeeded", op
    assert (webdav["scratch"].root / "in" / "run1.csv").read_text() == "x,y\n1,2\n"
    # read-only storages stay read-only, local paths are the sidekick's disk: refused
    r = alice.post(api + "storage-transfers", json={
        "src": "physics-scratch:in/run1.csv", "dst": "physics-data:results/x.csv"})
    assert r.status_code == 403 and r.json()["field"] == "dst"
    r = alice.post(api + "storage-transfers", json={
        "src": "physics-data:results/run1.csv", "dst": "/tmp/stolen.csv"})
    assert r.status_code == 403
    r = alice.post(api + "storages/physics-data/mount", json={})
    assert r.status_code == 403
    # bob: not his storages; he cannot copy out of them either
    r = bob.post(api + "storage-transfers", json={
        "src": "physics-data:results/run1.csv", "dst": "physics-scratch:bob.csv"})
    assert r.status_code == 404


def test_admin_actions_are_audited_without_secrets(hub):
    api = hub.sidekick_api
    alice, admin = hub.session("alice"), hub.session("admin")
    page = admin.get(hub.url + "services/cloudtik/admin")
    assert page.status_code == 200 and "cloudtik sidekick" in page.text
    assert alice.get(hub.url + "services/cloudtik/admin").status_code == 403
    audit = admin.get(api + "hub/audit").json()["entries"]
    actions = {(e["actor"], e["action"], e["target"]) for e in audit}
    assert ("admin", "provider.put", "provider:local-pool") in actions
    _no_secret(admin.get(api + "hub/audit").text)
    assert alice.get(api + "hub/audit").status_code == 403


def test_delegated_cluster_is_isolated_and_quota_enforced(hub):
    api = hub.sidekick_api
    alice, bob, admin = hub.session("alice"), hub.session("bob"), hub.browser("admin")
    server = hub.start_server("alice")
    local_api = server + "cloudtik/api/"

    # her server's own interactive HPC kernels are answered by it, not delegated (the
    # sidekick runs none: an empty list and a refusal of every size)
    r = alice.get(local_api + "hpc/kernels")
    assert r.status_code == 200 and r.json() == {"kernels": []}, r.text
    r = alice.post(local_api + "hpc/kernel-sizes", json={"profile": "debug", "cores": 1,
                                                         "time": "30m"})
    assert r.status_code == 400 and "cannot run interactive kernels" in r.json()["message"], \
        r.text
    r = alice.post(api + "hpc/kernel-sizes", json={"profile": "debug", "cores": 1,
                                                   "time": "30m"})
    assert r.status_code == 409 and "run in your own Jupyter server" in r.json()["message"]

    # alice, through her own server: the request goes to the sidekick
    providers = alice.get(local_api + "providers").json()["providers"]
    assert [p["name"] for p in providers] == ["local-pool"]
    r = alice.post(local_api + "clusters", json={"name": "alice-c1", "provider": "local-pool",
                                                 "workers": 1})
    assert r.status_code == 202, r.text
    op = wait_operation(alice, local_api, r.json()["operation"]["id"])
    assert op["state"] == "succeeded", op
    listed = alice.get(local_api + "clusters").json()["clusters"]
    assert [(c["name"], c["owner"], c["state"]) for c in listed] == [
        ("alice-c1", "alice", "running")]
    _no_secret(alice.get(local_api + "clusters/alice-c1").text)

    # bob sees nothing, cannot read, scale, stop it or watch its operations
    assert bob.get(api + "clusters").json()["clusters"] == []
    assert bob.get(api + "clusters/alice-c1").status_code == 404
    assert bob.delete(api + "clusters/alice-c1").status_code == 404
    assert bob.patch(api + "clusters/alice-c1", json={"workers": 0}).status_code == 404
    assert bob.get(api + f"operations/{op['id']}").status_code == 404
    assert bob.get(api + f"operations/{op['id']}/events").status_code == 404
    assert bob.get(api + "clusters/alice-c1/logs").status_code == 404
    assert bob.get(api + "clusters/alice-c1/connect").status_code == 404
    assert bob.get(api + "operations").json()["operations"] == []
    everything = bob.get(api + "events", params={"after": 0}).json()["events"]
    assert everything == []
    mine = alice.get(api + "events", params={"after": 0}).json()["events"]
    assert mine and {e["op_id"] for e in mine} >= {op["id"]}
    # bob has no provider: he is told what he may use (nothing), not given alice's
    r = bob.post(api + "clusters", json={"name": "bob-c1", "workers": 0})
    assert r.status_code == 400 and r.json()["field"] == "template"
    r = bob.post(api + "clusters", json={"name": "bob-c1", "provider": "local-pool"})
    assert r.status_code == 404
    # the admin sees everyone's
    assert [c["name"] for c in admin.get(api + "clusters").json()["clusters"]] == ["alice-c1"]

    # quota: one cluster for alice
    r = admin.put(api + "hub/quotas/user:alice", json={"max_clusters": 1})
    assert r.status_code == 200, r.text
    r = alice.post(local_api + "clusters", json={"name": "alice-c2", "provider": "local-pool",
                                                 "workers": 0})
    assert r.status_code == 403 and r.json()["field"] == "quota", r.text
    assert "quota" in r.json()["message"]
    admin.put(api + "hub/quotas/user:alice", json={"max_clusters": None})

    # the single-user server's processes hold no admin secret in their environment
    for proc in psutil.process_iter(["cmdline", "environ"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "jupyterhub.singleuser" in cmd:
            env = "\n".join(f"{k}={v}" for k, v in (proc.info["environ"] or {}).items())
            _no_secret(env)
            _no_secret(cmd)

    r = alice.delete(local_api + "clusters/alice-c1")
    assert r.status_code == 202
    assert wait_operation(alice, local_api, r.json()["operation"]["id"])["state"] == "succeeded"


def test_egress_injects_headers_without_giving_the_secret(hub, upstreams):
    api = hub.sidekick_api
    alice, bob = hub.session("alice"), hub.session("bob")
    # rules and share answers: each user's own browser session (docs/security.md)
    alice_b, bob_b = hub.browser("alice"), hub.browser("bob")
    for rid, port in (("plain", upstreams["http"]), ("tls", upstreams["https"])):
        r = alice_b.put(api + f"hub/egress/rules/{rid}", json={
            "host": "127.0.0.1", "port": port, "header": "Authorization",
            "value": EGRESS_SECRET, "users": ["alice"]})
        assert r.status_code == 200, r.text
        assert r.json()["value"] == "<secret>"
    assert bob.get(api + "hub/egress/rules").json()["rules"] == []
    assert bob_b.delete(api + "hub/egress/rules/plain").status_code == 404
    # alice offers bob one path of her project's host with her key (he never sees it)
    r = alice_b.put(api + "hub/egress/rules/shared", json={
        "host": "127.0.0.1", "port": upstreams["http"], "path_prefix": "/shared",
        "header": "X-Project-Key", "value": EGRESS_SECRET, "users": ["bob"]})
    assert r.status_code == 200, r.text

    def session_for(user: requests.Session, tmp: Path) -> tuple[dict, requests.Session]:
        data = user.get(api + "hub/egress/session").json()
        bundle = tmp / "bundle.pem"
        bundle.write_text(data["ca_pem"])
        s = requests.Session()
        s.trust_env = False
        s.proxies = {"http": data["env"]["HTTP_PROXY"], "https": data["env"]["HTTPS_PROXY"]}
        s.verify = str(bundle)
        return data, s

    tmp = Path(hub.base)
    data, s = session_for(alice, tmp)
    _no_secret(repr(data))
    got = received(s.get(f"http://127.0.0.1:{upstreams['http']}/x", timeout=10))
    assert ["Authorization", EGRESS_SECRET] in got["headers"]
    got = received(s.get(f"https://127.0.0.1:{upstreams['https']}/y", timeout=10))
    assert ["Authorization", EGRESS_SECRET] in got["headers"]

    # a kernel of alice's own server gets the proxy settings, and no secret
    server = hub.start_server("alice")
    r = alice.post(server + "api/kernels", json={"name": "python3"})
    assert r.status_code == 201, r.text
    kernel_id = r.json()["id"]
    try:
        deadline = time.monotonic() + 30
        kenv = None
        while kenv is None and time.monotonic() < deadline:
            for proc in psutil.process_iter(["cmdline", "environ"]):
                if kernel_id in " ".join(proc.info["cmdline"] or []):
                    kenv = proc.info["environ"]
            time.sleep(0.2)
        assert kenv is not None, "kernel process not found"
        assert kenv["HTTPS_PROXY"] == data["env"]["HTTPS_PROXY"]
        assert data["ca_pem"] in Path(kenv["REQUESTS_CA_BUNDLE"]).read_text()
        assert kenv["SSL_CERT_FILE"] == kenv["REQUESTS_CA_BUNDLE"]
        _no_secret("\n".join(f"{k}={v}" for k, v in kenv.items()))
        ks = requests.Session()
        ks.trust_env = False
        ks.proxies = {"https": kenv["HTTPS_PROXY"]}
        ks.verify = kenv["REQUESTS_CA_BUNDLE"]
        got = received(ks.get(f"https://127.0.0.1:{upstreams['https']}/z", timeout=10))
        assert ["Authorization", EGRESS_SECRET] in got["headers"]
    finally:
        alice.delete(server + f"api/kernels/{kernel_id}")

    # bob's proxy credential works, but no rule is his: requests go out untouched
    (tmp / "bob").mkdir(exist_ok=True)
    _, sb = session_for(bob, tmp / "bob")
    got = received(sb.get(f"http://127.0.0.1:{upstreams['http']}/x", timeout=10))
    assert all(k.lower() not in ("authorization", "x-project-key") for k, _ in got["headers"])
    # an offer is not consent: nothing of alice's reaches bob's requests until he accepts
    got = received(sb.get(f"http://127.0.0.1:{upstreams['http']}/shared/data", timeout=10))
    assert all(k.lower() != "x-project-key" for k, _ in got["headers"])
    applies = bob.get(api + "hub/egress/applies").json()
    assert [(x["id"], x["share"], x["owner"]) for x in applies["shared"]] == [
        ("shared", "offered", "alice")]
    assert applies["applied"] == []
    r = bob.post(api + "hub/egress/shares/shared/accept")  # his token: not his consent
    assert r.status_code == 403 and r.json()["field"] == "token", r.text
    r = bob_b.post(api + "hub/egress/shares/shared/accept")
    assert r.status_code == 200 and r.json()["share"] == "accepted", r.text
    got = received(sb.get(f"http://127.0.0.1:{upstreams['http']}/shared/data", timeout=10))
    assert ["X-Project-Key", EGRESS_SECRET] in got["headers"]
    assert all(k.lower() != "authorization" for k, _ in got["headers"])
    assert bob.get(api + "hub/egress/rules").json()["rules"] == []  # he owns none


def test_sidekick_is_started_health_checked_restarted_and_stopped(hub):
    api = hub.sidekick_api
    alice, bob, admin = hub.session("alice"), hub.session("bob"), hub.browser("admin")
    r = admin.put(api + "hub/catalog/sidekick/jobgw", json={
        "spec": {"entry_point": "jupyter_cloudtik.hub.job_gateway", "health_interval": 0.3,
                 "unhealthy_after": 2, "startup_timeout": 60},
        "groups": ["physics"], "description": "HTTP to HPC jobs"})
    assert r.status_code == 200, r.text
    assert [x["name"] for x in alice.get(api + "hub/sidekicks").json()["sidekicks"]] == [
        "jobgw"]
    assert bob.post(api + "hub/sidekicks/jobgw").status_code == 404

    hub.start_server("alice")  # side-kicks live as long as their user's session
    r = alice.post(api + "hub/sidekicks/jobgw")
    assert r.status_code == 201, r.text
    info = r.json()
    assert info["state"] == "running" and info["pid"]
    proxied = hub.url.rstrip("/") + info["url"]
    assert alice.get(proxied + "health").status_code == 200
    assert bob.get(proxied + "health").status_code == 404  # only its owner gets through
    # the job gateway turns a plain HTTP request into a job, through the hub's proxy
    r = alice.post(proxied + "jobs", json={"command": ["echo", "via the gateway"]})
    assert r.status_code == 201, r.text
    job_url = hub.url.rstrip("/") + r.json()["url"]
    deadline = time.monotonic() + 60
    while (job := alice.get(job_url, params={"refresh": "1"}).json())["state"] not in (
            "succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.3)
    assert job["state"] == "succeeded" and job["user"] == "alice", job
    assert "via the gateway" in alice.get(job_url + "/logs").json()["text"]
    assert bob.post(proxied + "jobs", json={"command": ["id"]}).status_code == 404

    os.kill(info["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = alice.get(api + "hub/sidekicks/jobgw").json()
        if now["restarts"] >= 1 and now["state"] == "running" and now["pid"] != info["pid"]:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"side-kick not restarted: {now}")
    assert alice.get(proxied + "health").status_code == 200

    # the command line of a hub session (a terminal has the server's hub token)
    env = {**os.environ, "CLOUDTIK_HUB_SERVICE_URL": hub.service_url,
           "JUPYTERHUB_API_TOKEN": hub.token("alice")}
    env.pop("CLOUDTIK_API_URL", None)
    cli = [sys.executable, "-m", "jupyter_cloudtik", "sidekick"]
    out = subprocess.run([*cli, "status", "jobgw"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "jobgw: running, restarts 1" in out.stdout, out
    out = subprocess.run([*cli, "stop", "jobgw"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "stopped" in out.stdout, out
    assert not _alive(now["pid"])
    out = subprocess.run([*cli, "start", "nope"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and "no sidekick named 'nope'" in out.stderr, out

    # a side-kick ends with its user's session
    info = alice.post(api + "hub/sidekicks/jobgw").json()
    assert info["state"] == "running"
    hub.stop_server("alice")
    deadline = time.monotonic() + 20
    while alice.get(api + "hub/sidekicks/jobgw").json()["state"] != "stopped":
        assert time.monotonic() < deadline, "side-kick still running after its session"
        time.sleep(0.2)
    assert not _alive(info["pid"])


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_jobs_through_the_hub_are_the_users_own(hub):
    api = hub.sidekick_api
    alice, bob, admin = hub.session("alice"), hub.session("bob"), hub.browser("admin")
    r = alice.post(api + "jobs", json={"command": ["echo", "hello from the hub"],
                                       "backend": "local"})
    assert r.status_code == 404 and r.json()["field"] == "backend", r.text  # not offered
    r = admin.put(api + "hub/catalog/hpc/local", json={"spec": {}, "groups": ["physics"]})
    assert r.status_code == 200, r.text
    assert [b["name"] for b in alice.get(api + "hpc/backends").json()["backends"]] == [
        "local"]
    assert bob.get(api + "hpc/backends").json()["backends"] == []

    r = alice.post(api + "jobs", json={"command": ["echo", "hello from the hub"],
                                       "backend": "local"})
    assert r.status_code == 202, r.text
    job_id = r.json()["job"]["id"]
    deadline = time.monotonic() + 60
    while (job := alice.get(api + f"jobs/{job_id}", params={"refresh": "true"}).json()
           )["state"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.3)
    assert job["state"] == "succeeded", job
    assert job["user"] == "alice"
    logs = alice.get(api + f"jobs/{job_id}/logs").json()
    assert "hello from the hub" in logs["text"]
    assert bob.get(api + f"jobs/{job_id}").status_code == 404
    assert bob.get(api + f"jobs/{job_id}/logs").status_code == 404
    assert bob.delete(api + f"jobs/{job_id}").status_code == 404
    assert bob.get(api + "jobs").json()["jobs"] == []
    r = bob.post(api + "jobs", json={"command": ["id"], "backend": "local"})
    assert r.status_code == 404


def test_local_execution_is_refused_unless_allowed(tmp_path):
    """By default the catalogue will not offer what runs users' code on the sidekick's
    machine (its account holds every credential)."""
    hub = start_hub(tmp_path / "hub", sidekick_config=(
        "c.CloudTikHub.allow_local_execution = False\n"
        "c.CloudTikHub.session_check_interval = 0\n"))  # side-kicks without a session
    try:
        admin = hub.browser("admin")
        r = admin.put(hub.sidekick_api + "hub/catalog/provider/here",
                      json={"spec": {"type": "local"}, "groups": ["physics"]})
        assert r.status_code == 400 and r.json()["field"] == "spec.type", r.text
        r = admin.put(hub.sidekick_api + "hub/catalog/hpc/local", json={"spec": {}})
        assert r.status_code == 400 and r.json()["field"] == "name", r.text
        r = admin.put(hub.sidekick_api + "hub/catalog/provider/gw",
                      json={"spec": {"type": "dask-gateway",
                                     "config": {"address": "http://127.0.0.1:9"}}})
        assert r.status_code == 200, r.text
        # a Slurm of this machine runs jobs as the service's account: local too
        r = admin.put(hub.sidekick_api + "hub/catalog/provider/here-slurm",
                      json={"spec": {"type": "slurm"}, "groups": ["physics"]})
        assert r.status_code == 400 and "slurm of this machine" in r.json()["message"]
        # the docs' job gateway, offered as documented: its jobs may not run here either
        r = admin.put(hub.sidekick_api + "hub/catalog/sidekick/jobgw", json={
            "spec": {"entry_point": "jupyter_cloudtik.hub.job_gateway",
                     "health_interval": 0.3, "startup_timeout": 60},
            "groups": ["physics"]})
        assert r.status_code == 200, r.text
        alice = hub.session("alice")
        r = alice.post(hub.sidekick_api + "hub/sidekicks/jobgw")
        assert r.status_code == 201, r.text
        proxied = hub.url.rstrip("/") + r.json()["url"]
        for body in ({"command": ["id"]}, {"command": ["id"], "backend": "local"},
                     {"command": ["id"], "backend": "dask"}):
            r = alice.post(proxied + "jobs", json=body)
            assert r.status_code == 403 and r.json()["field"] == "backend", (body, r.text)
            assert "allow_local_execution" in r.json()["message"]
        assert alice.get(proxied + "jobs").json()["jobs"] == []
    finally:
        hub.stop()


def _sidekick_routes(prefix: str) -> list[tuple[str, str, str]]:
    """(method, path, handler) for every method of every route the sidekick serves."""
    import re

    from jupyter_server.base.handlers import APIHandler, JupyterHandler

    from jupyter_cloudtik.api.routes import build_routes
    from jupyter_cloudtik.hub.handlers import hub_routes

    fill = {"name": "x", "op_id": "x", "fmt": "yaml", "backend": "s3", "kind": "provider",
            "reservation_id": "x", "job_id": "x", "sweep_id": "x", "user": "alice",
            "rest": "/health", "action": "accept", "proxied_path": "/status",
            "kid": "0" * 32, "kaction": "ports"}  # hub kernels (hub/kernels.py)
    out = []
    for pattern, handler in hub_routes(prefix) + build_routes(prefix):
        path = re.sub(r"\(\?P<(\w+)>[^)]*\)\??", lambda m: fill[m.group(1)], pattern)
        path = path.replace(r"(?:/.*)?", "/not-a-route").replace("\\.", ".")
        for method in ("get", "post", "put", "patch", "delete"):
            impl = getattr(handler, method)
            if impl is not getattr(APIHandler, method) and \
                    impl is not getattr(JupyterHandler, method):
                out.append((method.upper(), path, handler.__name__))
    return out


def test_every_sidekick_route_needs_a_hub_user_with_the_use_scope(hub):
    """No login: 403 (API) or a redirect to the hub's login (pages).  A hub token without
    custom:cloudtik:use: 403 everywhere."""
    routes = _sidekick_routes("/services/cloudtik/")
    assert len(routes) >= 50
    r = hub.admin_request("POST", "users/alice/tokens", json={
        "note": "no cloudtik scope", "scopes": ["access:services!service=cloudtik"]})
    assert r.status_code == 201, r.text
    narrow = {"Authorization": f"token {r.json()['token']}"}
    base = hub.url.rstrip("/")
    for method, path, handler in routes:
        body = b"{}" if method in ("POST", "PUT", "PATCH") else None
        anon = requests.request(method, base + path, data=body, timeout=30,
                                allow_redirects=False)
        if handler in ("AdminPageHandler", "EgressPageHandler", "SidekickProxyHandler",
                       "DashboardHandler", "SparkUIHandler") and method == "GET":
            assert anon.status_code == 302 and "/hub/api/oauth2/authorize" in \
                anon.headers["Location"], (method, path, anon.status_code)
        else:
            assert anon.status_code == 403, (method, path, handler, anon.status_code)
        denied = requests.request(method, base + path, data=body, headers=narrow,
                                  timeout=30, allow_redirects=False)
        assert denied.status_code == 403, (method, path, handler, denied.status_code,
                                           denied.text[:200])
        _no_secret(anon.text + denied.text)
