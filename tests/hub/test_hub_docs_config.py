"""docs/hub.md's Set-up, as written: its ``jupyterhub_config.py``, the sidekick's config and
its catalogue file run a real JupyterHub with the sidekick.  The test only fills in what a
test machine must differ in (ports, folders, the installed command, the cloud's endpoint:
the Huawei Cloud emulator in the doc's region, whose account keys are the service's
``HWC_*`` variables) and adds its own ``tester`` service; the scopes, roles,
groups-as-admins and the catalogue are the doc's.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import doc_examples
import pytest

from cloudtik_emulators.huaweicloud.process import start_emulator
from cloudtik_emulators.hub import start_hub, wait_operation

REGION = "cn-north-4"  # the doc's
RETRY = {"base_delay": 0.01, "attempts": 6, "budget": 5}
SECRETS: dict[str, str] = {}  # the service's secret variables (the emulator's account)


def _hub_config() -> str:
    text = doc_examples.block("docs/hub.md", "Set-up", 0, lang="python").text
    command = str(Path(sys.executable).parent / "jupyter-cloudtik")
    for old, new in (("127.0.0.1:10101", "127.0.0.1:$service_port"),
                     ("/etc/cloudtik/sidekick.py", "$sidekick_config"),
                     ("/var/lib/cloudtik", "$state_dir"),
                     ('["jupyter-cloudtik",', f"[{command!r},")):
        assert old in text, f"docs/hub.md's jupyterhub_config.py no longer has {old!r}"
        text = text.replace(old, new)
    # the test hub's users: admin is in the doc's admins' group
    return text + ('c.JupyterHub.load_groups["platform"] = {"users": ["admin"]}\n'
                   f'c.JupyterHub.services[0]["environment"].update({SECRETS!r})\n')


def _sidekick_config(base: Path, endpoint: str) -> str:
    text = doc_examples.block("docs/hub.md", "Set-up", 1, lang="python").text
    catalog = base / "catalog.yaml"
    yaml_text = doc_examples.block("docs/hub.md", "Set-up", lang="yaml").text
    old = f"config: {{region: {REGION}, workspace_name: research}}"
    assert old in yaml_text, f"docs/hub.md's catalogue no longer has {old!r}"
    catalog.write_text(yaml_text.replace(old, (
        f"config: {{region: {REGION}, workspace_name: research, endpoint: '{endpoint}', "
        f"retry: {RETRY}}}")))
    assert "/etc/cloudtik/catalog.yaml" in text
    return text.replace("/etc/cloudtik/catalog.yaml", str(catalog)) + (
        "c.CloudTik.operation_timeout = 240\n")


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    emu = start_emulator(tmp_path_factory.mktemp("hwc-emulator"), region=REGION,
                         bucket_release_seconds=0)
    yield emu
    left = emu.stop()
    assert not left, f"emulated server processes left behind: {left}"


@pytest.fixture(scope="module")
def hub(tmp_path_factory, emulator):
    keys = emulator.credentials()
    SECRETS.update({"HWC_AK": keys["access_key"], "HWC_SK": keys["secret_key"],
                    "HWC_PROJECT": keys["project_id"], "OBS_SK": "obs-sk-of-the-doc",
                    "OBS_RO_AK": "obs-ro-ak-of-the-doc", "OBS_RO_SK": "obs-ro-sk-of-the-doc"})
    base = tmp_path_factory.mktemp("hub-docs")
    h = start_hub(base / "hub", hub_config=_hub_config(),
                  sidekick_config=_sidekick_config(base, emulator.info["endpoint"]))
    yield h
    h.stop()


def test_the_documented_hub_gives_each_user_their_share(hub):
    api = hub.sidekick_api
    admin, alice, bob = hub.session("admin"), hub.session("alice"), hub.session("bob")

    me = admin.get(api + "hub/whoami").json()
    assert me["admin"] is True and "platform" in me["groups"], me  # admin_groups = ["platform"]
    me = alice.get(api + "hub/whoami").json()
    assert me["admin"] is False and me["groups"] == ["physics"], me
    assert me["quota"]["max_spend_per_day"] == 100  # her own row of the catalogue file

    seen = {u: sorted(r["name"] for r in s.get(api + "hub/catalog").json()["resources"])
            for u, s in (("alice", alice), ("bob", bob))}
    assert seen == {"alice": ["cluster-a", "hwc-research", "jobgw", "physics-data", "small"],
                    "bob": ["hwc-research", "small"]}, seen

    # the catalogue's secrets came from the service's environment, and no answer shows them
    full = admin.get(api + "hub/catalog/provider/hwc-research")
    assert full.status_code == 200, full.text
    assert full.json()["secrets"]["access_key"] == "<secret>"
    for value in SECRETS.values():
        assert value not in full.text
    assert alice.get(api + "hub/audit").status_code == 403
    assert admin.get(api + "hub/audit").status_code == 200
    # the sidekick's HPC backend of the doc (an SSH login node) is what cluster-a names
    r = alice.get(api + "hub/catalog/hpc/cluster-a")
    assert r.status_code == 200, r.text


def test_a_user_without_the_use_scope_is_refused(hub):
    """The doc's roles give every user the sidekick; a token without its scope is not
    enough (oauth_client_allowed_scopes)."""
    r = hub.admin_request("post", "users/alice/tokens", json={"scopes": ["read:users:name!user"]})
    assert r.status_code in (200, 201), r.text
    token = r.json()["token"]
    import requests

    r = requests.get(hub.sidekick_api + "hub/whoami", timeout=10,
                     headers={"Authorization": f"token {token}"})
    assert r.status_code == 403, r.text


def test_the_job_gateway_of_docs_hub_sidekicks_md_from_a_session(hub):
    """docs/hub-sidekicks.md's curl session against the doc hub's `jobgw`, with a session's
    environment (the doc config's CLOUDTIK_HUB_SERVICE_URL, the user's token).  The
    example's job id stands for a job of this test's; every answer is JSON, none an error
    page of the hub or the proxy."""
    import json
    import os
    import time

    api, alice = hub.sidekick_api, hub.session("alice")
    hub.start_server("alice")  # side-kicks live as long as their user's session
    try:
        r = alice.post(api + "hub/sidekicks/jobgw")
        assert r.status_code == 201 and r.json()["state"] == "running", r.text
        gw = hub.service_url + "sidekicks/alice/jobgw/"
        r = alice.post(gw + "jobs", json={"command": ["sleep", "60"]})
        assert r.status_code == 201, r.text
        job = r.json()["id"]
        import nbformat  # the example's notebook, in the side-kick's folder (its root)

        nb = nbformat.v4.new_notebook(metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3",
                           "language": "python"},
            "language_info": {"name": "python"}})
        nb.cells = [nbformat.v4.new_code_cell("n = 1", metadata={"tags": ["parameters"]}),
                    nbformat.v4.new_code_cell("print(n * 14)")]
        nbformat.write(nb, hub.state_dir / "hub" / "sidekicks" / "alice" / "jobgw" /
                       "analysis.ipynb")

        b = doc_examples.block("docs/hub-sidekicks.md", "The job gateway (example side-kick)",
                               lang="bash")
        assert b.text.count("3f2a9c1e") >= 4
        text = b.text.replace("3f2a9c1e", job).replace(
            "curl -sH", "curl -w '\\n%{http_code}\\n' -sH")
        env = {**os.environ, "JUPYTERHUB_USER": "alice",
               "CLOUDTIK_HUB_SERVICE_URL": hub.service_url,
               "JUPYTERHUB_API_TOKEN": hub.token("alice")}
        out = doc_examples.bash(b, hub.base, env, timeout=120, text=text)
        lines = out.splitlines()
        answers = [(int(lines[i + 1]), lines[i]) for i in range(0, len(lines) - 1, 2)]
        assert len(answers) == 9, out
        bodies = [json.loads(body) for _, body in answers]  # all JSON
        codes = [code for code, _ in answers]
        assert codes[0] == 201 and bodies[0]["backend"] == "local", answers[0]
        # another backend: this hub's gateway has none called arc, and says so
        assert codes[1] == 400 and bodies[1]["field"] == "backend", answers[1]
        assert "configured: dask, local" in bodies[1]["message"]
        assert codes[2] == 201 and bodies[2]["state"] in ("queued", "running"), answers[2]
        assert codes[3:] == [200, 200, 200, 200, 200, 200], answers
        assert bodies[3]["id"] == job and "state" in bodies[3]
        assert {"text", "offset", "eof", "done"} <= set(bodies[5])
        ids = {j["id"] for j in bodies[7]["jobs"]}
        assert {job, bodies[0]["id"]} <= ids
        assert "local" in json.dumps(bodies[8])
        deadline = time.monotonic() + 30
        while alice.get(gw + f"jobs/{job}", params={"refresh": "1"}).json()["state"] != \
                "cancelled":
            assert time.monotonic() < deadline, "the DELETE did not cancel the job"
            time.sleep(0.3)
        deadline = time.monotonic() + 90  # the notebook ran with the example's n = 3
        while (nb_job := alice.get(gw + f"jobs/{bodies[2]['id']}",
                                   params={"refresh": "1"}).json())["state"] in (
                "queued", "running"):
            assert time.monotonic() < deadline, nb_job
            time.sleep(0.5)
        # docs/hub.md: the side-kick from the command line of the same session
        cli = doc_examples.block("docs/hub.md", "API", lang="bash")
        out = doc_examples.bash(cli, hub.base, {**env, "PATH": f"{Path(sys.executable).parent}"
                                                f":{os.environ['PATH']}"}, timeout=120)
        assert "jobgw" in out and "jobgw: running" in out, out
        logs = alice.get(gw + f"jobs/{bodies[2]['id']}/logs").json()
        assert nb_job["state"] == "succeeded", (nb_job, logs)
    finally:
        hub.stop_server("alice")
        # a side-kick ends with its user's session; wait for it, or the hub's stop at
        # the module's end would leave the gateway (its own session) behind
        deadline = time.monotonic() + 30
        while alice.get(api + "hub/sidekicks/jobgw").json()["state"] != "stopped":
            assert time.monotonic() < deadline, "side-kick still running after its session"
            time.sleep(0.2)


@contextlib.contextmanager
def _kernel_of(session, server: str):
    """A kernel started by a user's own single-user server (as JupyterLab starts one),
    driven over ZMQ from its connection file, like a frontend of that server."""
    import time

    import psutil

    from tests.server.kernels import RunningKernel, connected_client

    r = session.post(server + "api/kernels", json={"name": "python3"})
    assert r.status_code == 201, r.text
    kid = r.json()["id"]
    try:
        connection, deadline = None, time.monotonic() + 60
        while connection is None:
            assert time.monotonic() < deadline, "the kernel's process was not found"
            for proc in psutil.process_iter(["cmdline"]):
                cmd = proc.info["cmdline"] or []
                files = [a for a in cmd if a.endswith(f"kernel-{kid}.json")]
                if files and "-f" in cmd:
                    connection = files[0]
            time.sleep(0.2)
        client = connected_client(connection)
        try:
            yield RunningKernel(client)
        finally:
            client.stop_channels()
    finally:
        session.delete(server + f"api/kernels/{kid}")


def test_the_notebook_lines_of_a_hub_session(hub, emulator):
    """docs/hub.md's lines "from a notebook of a hub session", in a kernel of alice's own
    server: a cluster of the catalogue's template ``small`` (its provider hwc-research:
    the emulator, in the doc's region, with the account of the service's environment),
    then the side-kicks she may use.  The workspace is made first by an admin, as the doc
    says."""
    import json
    import time

    # a workspace carries the cloud account: made in the admin's own browser session
    api, admin, alice = hub.sidekick_api, hub.browser("admin"), hub.session("alice")
    setup = doc_examples.block("docs/hub.md", "API", 0, lang="json")
    assert "203.0.113.7/32" in setup.text
    body = json.loads(setup.text.replace("203.0.113.7/32", "127.0.0.1/32"))  # this machine
    # the emulator's endpoint (a real region's is derived from its name), and its pace
    body["config"]["provider"].update(endpoint=emulator.info["endpoint"], retry=RETRY)
    r = alice.post(api + "workspaces", json=body)
    assert r.status_code == 403, r.text  # users may not
    r = admin.post(api + "workspaces", json=body)
    assert r.status_code == 202, r.text
    op = wait_operation(admin, api, r.json()["operation"]["id"])
    assert op["state"] == "succeeded", (op.get("reason"), op.get("error"))
    server = hub.start_server("alice")
    try:
        with _kernel_of(alice, server) as kernel:
            kernel.run("%load_ext jupyter_cloudtik")
            b = doc_examples.block("docs/hub.md", "API", lang="python")
            try:
                shown = [kernel.run(cell, timeout=400) for cell in doc_examples.cells(b)]
            except AssertionError as e:  # say how far the up came
                local = server + "cloudtik/api/"
                ops = alice.get(local + "operations", params={"cluster": "analysis"}).json()
                events = [alice.get(local + f"operations/{o['id']}/events",
                                    headers={"Accept": "application/json"}).json()
                          for o in ops["operations"][:1]]
                raise AssertionError(f"{e}\n{events}") from None
        assert "<Cluster 'analysis' running provider=huaweicloud workers=4/4" in shown[0], shown[0]
        info = alice.get(server + "cloudtik/api/clusters/analysis").json()
        assert info["owner"] == "alice" and info["state"] == "running", info
        assert info["summary"]["workers"] == 4 and info["provider"] == "huaweicloud", info
        assert "jobgw" in shown[1], shown[1]
        assert "jobgw" in shown[2] and "running" in shown[2], shown[2]
        servers = [s for s in emulator.ctl.state()["servers"]
                   if s["tags"].get("cloudtik-cluster-name") == "analysis"]
        assert len(servers) == 5, servers  # the head and 4 workers, in the doc's region
        for value in SECRETS.values():
            assert value not in "".join(shown)
    finally:
        r = alice.delete(server + "cloudtik/api/clusters/analysis")
        if r.status_code == 202:
            wait_operation(alice, server + "cloudtik/api/", r.json()["operation"]["id"])
        hub.stop_server("alice")
        deadline = time.monotonic() + 30
        while alice.get(api + "hub/sidekicks/jobgw").json().get("state") not in (
                "stopped", None):
            assert time.monotonic() < deadline, "side-kick still running after its session"
            time.sleep(0.2)
        r = admin.delete(api + "workspaces/research")
        if r.status_code == 202:
            wait_operation(admin, api, r.json()["operation"]["id"])
