"""Issue 26: the attack generated from the schemas, not listed by hand.

Every string field of every request body the API takes (``openapi.yaml``) and of the
cluster config (``cluster.schema.json`` and the local provider's node config) is
classified here by what it names — a storage, a location, an HPC backend, a provider,
something run on the nodes — or as naming nothing; ``test_every_field_is_classified``
fails when a schema gains a field this table does not know, so a new field cannot skip the
walk.  The walk then puts into every field that names something the values an attacker
would: another group's item, an unknown one, a read-only storage where a write goes, the
sidekick's own files and ``/proc``; as each kind of caller — a user's token, a kernel of
the user's server (its kernel token, through the server), another group's user, an admin
— against a real JupyterHub with the sidekick, real WebDAV storages and real sandboxed
local clusters and jobs.  What it asserts is what an attacker could read or write:
no answer to anyone carries a catalogue secret or the secret store's key; another group's
item is answered exactly like an unknown one; no node holds a credential its owner was
not granted (nor the writable credential of a storage they may only read); no job output
holds a secret; nothing was written to the read-only storage.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
import uuid
from pathlib import Path

import psutil
import pytest
import requests

from cloudtik_emulators.hub import start_hub, wait_operation
from jupyter_cloudtik.storage.servers import start_server

pytestmark = pytest.mark.slow

PHYSICS_PW = f"physics-rw-{uuid.uuid4().hex}"   # physics-data's own (may write): admins'
PHYSICS_RO_PW = f"physics-ro-{uuid.uuid4().hex}"  # its read-only credential
SCRATCH_PW = f"scratch-{uuid.uuid4().hex}"
CHEM_PW = f"chem-{uuid.uuid4().hex}"
PROVIDER_SECRET = f"provider-{uuid.uuid4().hex}"
GATEWAY_SECRET = f"gateway-{uuid.uuid4().hex}"
ADMIN_EGRESS = f"Bearer admin-egress-{uuid.uuid4().hex}"
BOB_EGRESS = f"Bearer bob-egress-{uuid.uuid4().hex}"
ALL = [PHYSICS_PW, PHYSICS_RO_PW, SCRATCH_PW, CHEM_PW, PROVIDER_SECRET, GATEWAY_SECRET,
       ADMIN_EGRESS, BOB_EGRESS]

# --------------------------------------------------------------------------- the table
#: what each string field of a request body names (None: nothing a policy decides on)
OPENAPI_FIELDS = {
    "POST /clusters": {".name": "cluster", ".provider": "provider", ".template": "template"},
    "PATCH /clusters/{name}": {".node_type": None},  # a type of the caller's own cluster
    "PUT /clusters/{name}/adapt": {},
    # zones and workspaces: admins only through the hub (UserContext.feature)
    "POST /zones/select": {".request.node_type": None, ".request.user": None,
                           ".request.cluster": None, ".request.filters[]": None,
                           ".request.query": None, ".request.availability_zones[]": None,
                           ".request.exclude[]": None, ".path[]": None,
                           ".request.strategy": None},
    "POST /zones/boot": {".request.node_type": None, ".request.user": None,
                         ".request.cluster": None, ".request.filters[]": None,
                         ".request.query": None, ".request.availability_zones[]": None,
                         ".request.exclude[]": None, ".hints[].hint": None,
                         ".request.strategy": None},
    "POST /zones/release": {".reservation_id": None},
    "POST /workspaces": {".name": "admin-only", ".provider": "admin-only"},
    # adding storages: admins only through the hub (the catalogue)
    "POST /storages": {".name": "admin-only", ".backend": "admin-only", ".url": "admin-only",
                       ".options.*": "admin-only", ".source": "admin-only",
                       ".mount_path": "admin-only", ".description": "admin-only",
                       ".vfs_cache_mode": "admin-only"},
    # checking an add (the notebook's %storage add): the same, admins only on a hub
    "POST /storage-checks": {".storage.name": "admin-only", ".storage.backend": "admin-only",
                             ".storage.url": "admin-only", ".storage.options.*": "admin-only",
                             ".storage.source": "admin-only",
                             ".storage.mount_path": "admin-only",
                             ".storage.description": "admin-only",
                             ".storage.vfs_cache_mode": "admin-only", ".ask[]": "admin-only"},
    "POST /storages/{name}/mount": {".mode": None},  # mounts: refused through the hub
    "POST /storage-transfers": {".src": "location", ".dst": "location-write", ".mode": None},
    # an HPC kernel's node, with that kernel's own token only (never a hub caller's): not
    # walked here (no caller below holds one); tests/hpc/test_hpc_kernel_storage.py
    "POST /hpc/kernels/{kid}/node/get": {".src": "location", ".dest": "node-path"},
    "POST /hpc/kernels/{kid}/node/put": {".src": "node-path", ".dst": "location-write"},
    "POST /jobs": {".notebook": "location", ".command[]": "command", ".backend": "hpc",
                   ".name": None, ".memory": None, ".time": None, ".queue": None,
                   ".account": None, ".reservation": None, ".inputs[]": "location",
                   ".outputs[]": None,  # patterns inside the job's own folder
                   ".output": "location-write", ".container": "command",
                   ".python": "command", ".kernel": None, ".env.*": "command",
                   # names of the session's installed packages (never folders)
                   ".packages": "package", ".packages[]": "package",
                   # a requirements file's contents: its lines name packages, never files
                   ".requirements": "package",
                   ".files.*": None},  # content, written only into the job's folder
    "POST /jobs/{job_id}/fetch": {".dest": "location-write", ".files[]": None},
    # a sweep: the fields of POST /jobs (no command), its grid/zip/elements hold values
    "POST /jobs/sweeps": {".notebook": "location", ".backend": "hpc", ".name": None,
                          ".memory": None, ".time": None, ".queue": None, ".account": None,
                          ".reservation": None, ".inputs[]": "location", ".outputs[]": None,
                          ".output": "location-write", ".container": "command",
                          ".python": "command", ".kernel": None, ".env.*": "command",
                          ".files.*": None, ".packages": "package", ".packages[]": "package",
                          ".requirements": "package"},
    "POST /jobs/sweeps/{sweep_id}/cancel": {},
    # a custom size of an HPC kernel profile: kernels run in each user's own server; the
    # sidekick sizes none (hub.views.NoKernelsView), never with its own backends
    "POST /hpc/kernel-sizes": {".backend": "hpc", ".profile": None, ".time": None,
                               ".memory": None},
}
#: what each marked field of the cluster config names (core/config_names.py): the
#: schema's own marks, checked against this list
CONFIG_MARKS = {
    "runtime.pip[]": "package", "runtime.dask.worker_options[]": "command",
    "runtime.dask.scheduler_options[]": "command", "runtime.spark.conf.*": "command",
    "runtime.spark.storage_root": "node-path", "setup_commands[]": "command",
    "storage.remotes[]": "storage", "available_node_types.*.node_config.env.*": "command",
}
#: string fields of the cluster config that name nothing a policy decides on
CONFIG_PLAIN = {"cluster_name", "provider.type", "head_node_type", "runtime.types[]",
                "runtime.spark.version", "runtime.spark.daemon_memory",
                "runtime.spark.connect_memory", "placement.filters[]", "placement.query",
                "placement.strategy", "placement.availability_zones[]",
                "available_node_types.*.resources.memory",
                "available_node_types.*.resources.disk",
                "available_node_types.*.placement.filters[]",
                "available_node_types.*.placement.query",
                "available_node_types.*.placement.strategy",
                "available_node_types.*.placement.availability_zones[]"}


def _openapi():
    from jupyter_cloudtik.api import openapi

    return openapi.spec()


def _string_fields(schema, root, path="", seen=()):
    """Paths of the string fields under ``schema`` (``.a.b``, ``[]`` for items, ``.*`` for
    map values), following ``$ref`` within ``root``."""
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref in seen:
            return
        node = root
        for part in ref.lstrip("#/").split("/"):
            node = node[part]
        yield from _string_fields(node, root, path, (*seen, ref))
        return
    for sub in schema.get("oneOf", []) + schema.get("anyOf", []) + schema.get("allOf", []):
        yield from _string_fields(sub, root, path, seen)
    for key, sub in (schema.get("properties") or {}).items():
        yield from _string_fields(sub, root, f"{path}.{key}", seen)
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _string_fields(schema["additionalProperties"], root, f"{path}.*", seen)
    if isinstance(schema.get("items"), dict):
        yield from _string_fields(schema["items"], root, f"{path}[]", seen)
    t = schema.get("type")
    if t == "string" or (isinstance(t, list) and "string" in t) or "enum" in schema:
        yield path


def test_every_field_is_classified():
    """A field added to a schema without a decision here fails (and so the walk below
    covers every field that names something)."""
    spec = _openapi()
    found = {}
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if not isinstance(op, dict):  # path-level parameters
                continue
            body = (op.get("requestBody") or {}).get("content", {}).get("application/json")
            if body:
                found[f"{method.upper()} {path}"] = set(_string_fields(body["schema"], spec))
    assert {k: set(v) for k, v in OPENAPI_FIELDS.items()} == found

    from jupyter_cloudtik.core.config import cluster_schema
    from jupyter_cloudtik.core.config_names import MARK
    from jupyter_cloudtik.providers.local.provider import LocalNodeProvider

    schema = cluster_schema()
    fields = {p.lstrip(".").replace(".*.", ".*.") for p in _string_fields(schema, schema)}
    node = {f"available_node_types.*.node_config{p}"
            for p in _string_fields(LocalNodeProvider.node_config_schema,
                                    LocalNodeProvider.node_config_schema)}
    fields = {f for f in fields if not f.startswith("available_node_types.*.node_config")}
    assert fields | node == set(CONFIG_MARKS) | CONFIG_PLAIN

    def marks(s, root, path=""):
        if "$ref" in s:
            node_ = root
            for part in s["$ref"].lstrip("#/").split("/"):
                node_ = node_[part]
            yield from marks(node_, root, path)
            return
        if s.get(MARK):
            yield path.lstrip("."), s[MARK]
        for key, sub in (s.get("properties") or {}).items():
            yield from marks(sub, root, f"{path}.{key}")
        if isinstance(s.get("additionalProperties"), dict):
            yield from marks(s["additionalProperties"], root, f"{path}.*")
        if isinstance(s.get("items"), dict):
            yield from marks(s["items"], root, f"{path}[]")
    marked = dict(marks(schema, schema)) | {
        f"available_node_types.*.node_config.{p}": k for p, k in marks(
            LocalNodeProvider.node_config_schema, LocalNodeProvider.node_config_schema)}
    assert marked == CONFIG_MARKS


# --------------------------------------------------------------------------- the hub
@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    base = tmp_path_factory.mktemp("walk-servers")
    (base / "physics" / "in").mkdir(parents=True)
    for other in ("scratch", "chem"):
        (base / other / "in").mkdir(parents=True)
    (base / "physics" / "in" / "a.csv").write_text("x\n1\n")
    out = {"physics": start_server("webdav", base / "physics", workdir=base / "w1",
                                   password=PHYSICS_PW),
           "physics-ro": start_server("webdav", base / "physics", workdir=base / "w2",
                                      password=PHYSICS_RO_PW, read_only=True),
           "scratch": start_server("webdav", base / "scratch", workdir=base / "w3",
                                   password=SCRATCH_PW),
           "chem": start_server("webdav", base / "chem", workdir=base / "w4",
                                password=CHEM_PW)}
    yield out
    for s in out.values():
        s.stop()


def _storage(srv, groups, **spec):
    options = srv.storage_options()
    password = options.pop("pass")
    return {"spec": {"type": "webdav", "options": options, **spec},
            "secrets": {"pass": password}, "groups": groups}


@pytest.fixture(scope="module")
def hub(tmp_path_factory, servers):
    # an HPC backend of each group: the walk's "other" backend is one a caller holds no
    # grant for, not a name nobody has
    h = start_hub(tmp_path_factory.mktemp("hub-walk"), sidekick_config=(
        "c.HPC.backends = {'physics-hpc': {'type': 'local'}, 'chem-hpc': {'type': 'local'}}\n"))
    try:
        admin = h.browser("admin")
        api = h.sidekick_api
        ro = servers["physics-ro"].storage_options()
        both = ["physics", "chemistry"]
        for path, body in {
            "provider/pool": {"spec": {"type": "local"}, "secrets": {"key": PROVIDER_SECRET},
                              "groups": both},
            "storage/physics-data": {**_storage(servers["physics"], ["physics"], read_only=True),
                                     "read_only_credentials": {"url": ro["url"], "user": ro["user"],
                                                               "pass": PHYSICS_RO_PW}},
            "storage/physics-scratch": _storage(servers["scratch"], ["physics"], read_only=False),
            "storage/chem-data": _storage(servers["chem"], ["chemistry"], read_only=False),
            "hpc/local": {"spec": {}, "groups": both},
            "hpc/physics-hpc": {"spec": {}, "groups": ["physics"]},
            "hpc/chem-hpc": {"spec": {}, "groups": ["chemistry"]},
            "sidekick/jobgw": {"spec": {"entry_point": "jupyter_cloudtik.hub.job_gateway",
                                        "health_interval": 0.3, "startup_timeout": 60,
                                        "env": {"GW_KEY": {"secret": "gwkey"}}},
                               "secrets": {"gwkey": GATEWAY_SECRET}, "groups": both},
        }.items():
            r = admin.put(api + f"hub/catalog/{path}", json=body)
            assert r.status_code == 200, (path, r.text)
        r = admin.put(api + "hub/egress/rules/org", json={
            "host": "example.org", "header": "Authorization", "value": ADMIN_EGRESS,
            "groups": ["chemistry"]})
        assert r.status_code == 200, r.text
        r = h.browser("bob").put(api + "hub/egress/rules/mine", json={
            "host": "example.net", "header": "Authorization", "value": BOB_EGRESS})
        assert r.status_code == 200, r.text
    except BaseException:  # a failed set-up leaves no hub behind
        h.stop()
        raise
    yield h
    h.stop()
    logs = (h.base / "hub.log").read_text(errors="replace") + "".join(
        p.read_text(errors="replace") for p in (h.state_dir / "hub").rglob("*.log"))
    leaked = [v[:12] for v in ALL if v in logs]
    assert not leaked, f"secrets in the hub's, the sidekick's or a side-kick's log: {leaked}"


class Answers:
    """Every answer every caller got, checked for secrets as they come."""

    def __init__(self, hub) -> None:
        self.key = (hub.state_dir / "secret.key").read_text().strip()
        self.count = 0

    def check(self, who: str, r: requests.Response, what: str) -> requests.Response:
        self.count += 1
        assert r.status_code < 500, (who, what, r.status_code, r.text[:300])
        for value in (*ALL, self.key):
            assert value not in r.text, (who, what, "leaked", value[:12])
        return r


def _kernel_session(hub, server: str) -> requests.Session:
    """A kernel of alice's own server: its kernel token, against its server's API."""
    alice = hub.session("alice")
    r = alice.post(server + "api/kernels", json={"name": "python3"})
    assert r.status_code == 201, r.text
    kid = r.json()["id"]
    deadline, token = time.monotonic() + 30, None
    while token is None and time.monotonic() < deadline:
        for proc in psutil.process_iter(["cmdline", "environ"]):
            if kid in " ".join(proc.info["cmdline"] or []):
                token = (proc.info["environ"] or {}).get("CLOUDTIK_API_TOKEN")
        time.sleep(0.2)
    assert token
    k = requests.Session()
    k.trust_env = False
    k.headers["Authorization"] = f"token {token}"
    return k


def _values(kind: str, hub, me: str) -> list[tuple[str, str]]:
    """(label, value) an attacker puts into a field that names ``kind``."""
    state = str(hub.state_dir)
    other = "chem-data" if me != "bob" else "physics-scratch"
    if kind == "storage":
        return [("other", other), ("unknown", "no-such-store"), ("read-only", "physics-data"),
                ("wildcard", "%"), ("traversal", "..")]
    if kind in ("location", "location-write"):
        out = [("other", f"{other}:x"), ("unknown", "no-such-store:x"),
               ("state key", f"{state}/secret.key"), ("state db", f"file://{state}/state.db"),
               ("proc", "/proc/self/environ"), ("home", "~root/.ssh/id_rsa"),
               ("system path", "local:/etc/shadow")]
        if kind == "location-write":
            out.append(("read-only", "physics-data:pwned"))
        return out
    if kind == "hpc":
        return [("other", "chem-hpc" if me != "bob" else "physics-hpc"),
                ("unknown", "no-such-backend"), ("dask of a cluster", "dask:anything")]
    if kind in ("provider", "template"):
        return [("unknown", "no-such-provider")]
    if kind == "package":
        # a direct reference is a folder or an archive pip would fetch and build on the
        # submitting side (the sidekick's machine, past its location policy and egress)
        return [("state folder", state), ("relative folder", "./x"),
                ("direct file", f"x @ file://{state}"), ("direct file etc", "x @ file:///etc"),
                ("direct url", "x @ https://evil.example/x.tar.gz")]
    if kind == "node-path":
        return [("state folder", state)]
    return []


def _set(body: dict, field: str, value) -> dict:
    """``body`` with ``field`` (``.a.b``, ``.a[]``, ``.a.*``) set to ``value``."""
    out = json.loads(json.dumps(body))
    parts = field.lstrip(".").split(".")
    node = out
    for part in parts[:-1]:
        node = node.setdefault(part.rstrip("[]"), {})
    last = parts[-1]
    if last.endswith("[]"):
        node[last[:-2]] = [value]
    elif last == "*":
        node["X"] = value
    else:
        node[last] = value
    return out


#: a body each caller may send as it is (the walk changes one field of it)
BASES = {
    "POST /clusters": (lambda me: {"name": f"w-{uuid.uuid4().hex[:6]}", "provider": "pool",
                                   "workers": 0}),
    "POST /storage-transfers": (lambda me: {
        "src": f"{OWN[me]}:in", "dst": f"{OWN[me]}:out"}),
    "POST /jobs": (lambda me: {"command": ["echo", "walk"], "backend": "local"}),
    "POST /hpc/kernel-sizes": (lambda me: {"profile": "debug", "cores": 1, "time": "30m"}),
    # a sweep of one element of a notebook sent as content (as %%hpc sends a cell): each
    # field the walk changes is the only thing between it and a sweep that runs
    "POST /jobs/sweeps": (lambda me: {"notebook": "walk.ipynb", "files": {"walk.ipynb": WALK_NB},
                                      "grid": {"alpha": [1]}, "backend": "local"}),
}
WALK_NB = base64.b64encode(json.dumps({
    "nbformat": 4, "nbformat_minor": 5,
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                "language": "python"}},
    "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {"tags": tags},
               "execution_count": None, "outputs": [], "source": src}
              for i, (src, tags) in enumerate([("alpha = 1", ["parameters"]),
                                               ("print(alpha)", [])])]}).encode()).decode()
OWN = {"alice": "physics-scratch", "admin": "physics-scratch", "bob": "chem-data"}


def test_the_generated_walk_finds_nothing(hub, servers):
    api = hub.sidekick_api
    answers = Answers(hub)
    server = hub.start_server("alice")
    callers = {"alice": hub.session("alice"), "bob": hub.session("bob"),
               "kernel": _kernel_session(hub, server), "admin": hub.browser("admin")}
    apis = {"alice": api, "bob": api, "admin": api, "kernel": server + "cloudtik/api/"}
    physics_before = _tree(servers["physics"].root)
    started: list[tuple[str, str]] = []   # (caller, cluster) to stop at the end
    jobs: list[tuple[str, str]] = []
    walked: set[str] = set()
    try:
        # 1. request bodies: every field that names something, every hostile value
        for route, fields in OPENAPI_FIELDS.items():
            base = BASES.get(route)
            if base is None:
                continue
            method, path = route.split(" ", 1)
            if route == "POST /jobs/sweeps":
                # the base itself is a sweep each caller may run: what is refused below is
                # refused for the field the walk changed, not for the base
                for who, session in callers.items():
                    me = "alice" if who == "kernel" else who
                    r = answers.check(who, session.request(method, apis[who] + path.lstrip(
                        "/"), json=base(me)), f"{route} as it is")
                    assert r.status_code == 201, (who, r.text[:300])
            walked.add(route)
            for field, kind in fields.items():
                for who, session in callers.items():
                    me = "alice" if who == "kernel" else who
                    for label, value in _values(kind or "", hub, me):
                        body = _set(base(me), field, value)
                        r = answers.check(who, session.request(method, apis[who] + path.lstrip(
                            "/"), json=body), f"{route} {field}={label}")
                        if r.status_code < 300:
                            _track(r, who, started, jobs)
                        if _refused(label, who, kind or ""):
                            assert r.status_code >= 400, (who, route, field, label,
                                                          r.text[:300])
                        if label.startswith("direct") and field != ".packages":
                            # refused as such, before pip fetched or built anything on
                            # the sidekick's machine (a failed build is refused too late);
                            # ".packages" as one string is no list of names at all
                            assert "direct reference" in r.text, (who, route, field, label,
                                                                  r.text[:300])
                        if label == "other" and who != "admin":
                            # another group's item: the very answer of an unknown one
                            unk = dict(_values(kind, hub, me))["unknown"]
                            r2 = session.request(method, apis[who] + path.lstrip("/"),
                                                 json=_set(base(me), field, unk))
                            assert r.status_code == r2.status_code, (who, route, field)
                            assert _same(r.text, r2.text, value, unk), (who, route, field,
                                                                        r.text, r2.text)
        assert walked == set(BASES), set(BASES) - walked
        # HPC kernels: the sidekick runs none and sizes none, for anyone (its backends and
        # their credentials are for jobs under the caller's grants, never a kernel's form)
        for who in ("alice", "bob", "admin"):
            r = callers[who].post(api + "hpc/kernel-sizes", json={
                "backend": "local", "profile": "debug", "cores": 1, "time": "30m"})
            assert r.status_code == 409 and "run in your own Jupyter server" in \
                r.json()["message"], (who, r.status_code, r.text[:300])
            r = callers[who].get(api + "hpc/kernels")
            assert r.status_code == 200 and r.json() == {"kernels": []}, (who, r.text[:300])
        # 2. the cluster config: every marked field, every hostile value
        from jupyter_cloudtik.core.config_names import named_values  # noqa: F401 (the marks)

        for field, kind in CONFIG_MARKS.items():
            cfg_field = ".config." + field.replace("available_node_types.*",
                                                  "available_node_types.worker")
            for who, session in callers.items():
                me = "alice" if who == "kernel" else who
                for label, value in _values(kind, hub, me):
                    body = _set(BASES["POST /clusters"](me), cfg_field, value)
                    if "available_node_types" in cfg_field:
                        body["config"]["available_node_types"]["worker"].update(
                            resources={"CPU": 1}, min_workers=0)
                    r = answers.check(who, session.post(apis[who] + "clusters", json=body),
                                      f"config {field}={label}")
                    if r.status_code < 300:
                        _track(r, who, started, jobs)
                    if _refused(label, who, kind):
                        assert r.status_code >= 400, (who, field, label, r.text[:300])
        # 3. code that runs where the user's code runs: a cluster node, a local job, a
        #    side-kick's job, each trying the sidekick's files, /proc and other users'
        attack = _attack_script(hub)
        alice = callers["alice"]
        r = answers.check("alice", alice.post(api + "clusters", json={
            "name": "w-attack", "provider": "pool", "workers": 1,
            "config": {"storage": {"remotes": ["physics-data", "physics-scratch"]},
                       "setup_commands": [attack],
                       "available_node_types": {"worker": {"resources": {"CPU": 1},
                                                           "min_workers": 1,
                                                           "node_config": {"env": {
                                                               "X": attack}}}}}}),
            "the attack cluster")
        assert r.status_code == 202, r.text
        started.append(("alice", "w-attack"))
        assert wait_operation(alice, api, r.json()["operation"]["id"])["state"] == \
            "succeeded"
        r = answers.check("alice", alice.post(api + "jobs", json={
            "command": ["sh", "-c", attack], "backend": "local"}), "the attack job")
        assert r.status_code == 202, r.text
        jobs.append(("alice", r.json()["job"]["id"]))
        assert hub.session("bob").post(api + "hub/sidekicks/jobgw").status_code == 201
        gw = answers.check("alice", alice.post(api + "hub/sidekicks/jobgw"), "side-kick")
        assert gw.status_code == 201, gw.text
        proxied = hub.url.rstrip("/") + gw.json()["url"]
        r = answers.check("alice", alice.post(proxied + "jobs", json={
            "command": ["sh", "-c", attack]}), "the side-kick's job")
        assert r.status_code == 201, r.text
        gw_job = hub.url.rstrip("/") + r.json()["url"]
        outputs = [_job_text(alice, api, job) for _, job in jobs if _ == "alice"]
        outputs.append(_gateway_job_text(alice, gw_job))
        outputs.append(json.dumps(alice.get(api + "clusters/w-attack/logs").json()))
        for text in outputs:
            assert "ATTACK-DONE" in text, text[-2000:]
            for value in (*ALL, answers.key):
                assert value not in text, ("an attack read", value[:12], text[-2000:])
        # 4. what every node of every user was given: only its owner's grants
        _check_node_files(hub)
        assert _tree(servers["physics"].root) == physics_before, "the read-only storage changed"
        print(f"generated walk: {answers.count} requests, {len(started)} clusters started")
    finally:
        for _who, name in started:
            session = callers["admin"]
            r = session.delete(api + f"clusters/{name}")
            if r.status_code == 202:
                wait_operation(session, api, r.json()["operation"]["id"])
        hub.stop_server("alice")


def _refused(label: str, who: str, kind: str) -> bool:
    """Must this value be refused to this caller?  Everything but a caller's own items —
    an admin may use every catalogue item and the backends' own files, never a path of
    the sidekick's machine nor a write to a read-only storage."""
    if label in ("other", "system path"):
        return who != "admin"
    if label == "read-only":
        # a read-only storage for a cluster's nodes: its read-only credential (physics'
        # users and admins); bob may not use it at all
        return kind != "storage" or who == "bob"
    return True


def _track(r, who, started, jobs) -> None:
    body = r.json()
    if isinstance(body.get("job"), dict):
        jobs.append((who, body["job"]["id"]))
    elif body.get("cluster"):
        started.append((who, body["cluster"]))


def _same(a: str, b: str, va: str, vb: str) -> bool:
    """The two answers differ only by the value each was given (or its name part)."""
    for v, ab in ((va, "a"), (vb, "b")):
        for part in (v, v.split(":", 1)[0]):
            if ab == "a":
                a = a.replace(part, "<V>")
            else:
                b = b.replace(part, "<V>")
    return a == b


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _attack_script(hub) -> str:
    """What user code tries where it runs: the sidekick's files, every process's
    environment, bob's side-kick's log, and the sidekick's and the hub's APIs with no
    credential (a side-kick holds none)."""
    state, base = hub.state_dir, hub.base
    return (f"cat {state}/secret.key {state}/state.db {state}/shared.json; "
            f"ls -laR {state} {base}; cat {base}/hub.sqlite; "
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/environ; done; "
            f"cat {state}/hub/sidekicks/bob/jobgw.log; env; "
            f"curl -s {hub.service_url}cloudtik/api/hub/catalog; "
            f"curl -s {hub.url}hub/api/users; echo ATTACK-""DONE")


def _job_text(session, api, job_id) -> str:
    deadline = time.monotonic() + 90
    while (job := session.get(api + f"jobs/{job_id}", params={"refresh": "1"}).json())[
            "state"] in ("queued", "running", "unknown"):
        assert time.monotonic() < deadline, job
        time.sleep(0.3)
    return session.get(api + f"jobs/{job_id}/logs").json()["text"]


def _gateway_job_text(session, url) -> str:
    deadline = time.monotonic() + 90
    while (job := session.get(url, params={"refresh": "1"}).json())["state"] in (
            "queued", "running"):
        assert time.monotonic() < deadline, job
        time.sleep(0.3)
    return session.get(url + "/logs").json()["text"]


def _check_node_files(hub) -> None:
    """Each node's files hold what its owner's grants let it hold, nothing else."""
    from jupyter_cloudtik.core.store import Store

    store = Store(hub.state_dir)
    try:
        owners = {r["name"]: r["owner"] for r in store.query("SELECT name, owner FROM clusters")}
    finally:
        store.close()
    # an admin may use every storage — and still gets only the read-only credential of a
    # read-only one; nobody's node gets physics-data's own (writing) password
    allowed = {"alice": {PHYSICS_RO_PW, SCRATCH_PW}, "bob": {CHEM_PW},
               "admin": {PHYSICS_RO_PW, SCRATCH_PW, CHEM_PW}}
    from jupyter_cloudtik.storage.rclone import obscure  # node configs obscure passwords

    for node in (hub.state_dir / "local" / "nodes").iterdir():
        cluster = node.name.rsplit("-", 2)[0]
        owner = owners.get(cluster)
        text = "".join(p.read_text(errors="replace") for p in node.rglob("*")
                       if p.is_file() and p.stat().st_size < 2_000_000)
        for value in ALL:
            if value in text or obscure(value, deterministic=True) in text:
                assert owner and value in allowed.get(owner, set()), (node.name, owner,
                                                                       value[:12])
