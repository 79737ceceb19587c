"""Issue 33, point 3: the session's storages from an HPC kernel on its node (``%storage``).

A real Jupyter server with a WebDAV storage whose password only the server holds, and a
kernel on the project's Slurm: ``%storage ls`` and ``%storage cp`` in a cell copy
between the storage and the kernel's working folder on the node, through the server; the
node's token works for its own kernel only, and ends with it; paths stay in the working
folder.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import uuid

import doc_examples
import pytest
import requests

from jupyter_cloudtik.storage.servers import start_server

from .conftest import wait_for
from .test_hpc_docs_kernels import _execute, _job_ids

pytestmark = pytest.mark.slow
PASSWORD = f"dav-{uuid.uuid4().hex}"
HEADING = "Interactive kernels: the session's storages on the node"


@pytest.fixture
def served(slurm, tmp_path):
    from tests.server.conftest import _stop

    data = tmp_path / "dav"
    (data / "results").mkdir(parents=True)
    (data / "results" / "run1.csv").write_text("x,y\n1,2\n")
    (data / "inputs" / "set").mkdir(parents=True)
    (data / "inputs" / "set" / "a.txt").write_text("a")
    dav = start_server("webdav", data, workdir=tmp_path / "davw", password=PASSWORD)
    daint = {"type": "slurm", "env": slurm.env, "workdir": str(tmp_path / "daint-jobs"),
             "environment": {"python": __import__("sys").executable}}
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "jupyter_server_config.py").write_text(
        "c.ServerApp.kernel_spec_manager_class = "
        "'jupyter_cloudtik.hpc.kernels.HPCKernelSpecManager'\n"
        f"c.HPC.backends = {{'daint': {daint!r}}}\n"
        "c.HPCKernels.profiles = [{'name': 'debug', 'backend': 'daint', 'cores': 1, "
        "'time': '30m'}]\nc.HPCKernels.poll_interval = 0.5\n")
    server = _server_with_storage(tmp_path, dav)
    try:
        yield server, data, tmp_path / "daint-jobs"
    finally:
        problems = _stop(server)
        dav.stop()
    assert not problems, problems


def _server_with_storage(tmp_path, dav):
    """A Jupyter server of ``tmp_path/config`` with the WebDAV storage ``data``."""
    from tests.server.conftest import _start_server, _stop

    server = _start_server(tmp_path, "server", [
        "--ServerApp.jpserver_extensions={'jupyter_cloudtik': True}"], {})
    r = server.request("POST", "storages", json={
        "name": "data", "backend": "webdav", "options": dav.storage_options(),
        "read_only": False})
    if r.status_code != 201:
        _stop(server)
        raise AssertionError(r.text)
    return server


def _start(server) -> str:
    r = requests.post(server.url + "api/kernels", headers=server.headers(),
                      json={"name": "cloudtik-hpc-daint-debug"}, timeout=300)
    assert r.status_code == 201, r.text[:2000]
    return r.json()["id"]


def test_storage_magic_on_the_node(served, slurm):
    server, data, jobs = served
    kid = _start(server)
    (st,) = [k for k in server.get("hpc/kernels").json()["kernels"] if k["id"] == kid]
    assert st.get("storages") == "reachable", st

    run = lambda code: asyncio.run(_execute(server, kid, code))  # noqa: E731
    status, out = run("import os\nos.makedirs('plots', exist_ok=True)\n"
                      "open('plots/p.txt', 'w').write('plotted')\n"
                      "print(os.environ['SLURM_JOB_ID'])")
    assert status == "ok", out
    job = out.strip()
    # the doc's cell, as written
    cell = doc_examples.block("docs/hpc.md", HEADING, 0, lang="python").text
    status, out = run(cell + "\nprint(open('run1.csv').read().replace('\\n', ';'), "
                             "sorted(os.listdir('in')))")
    assert status == "ok", out
    lines = out.strip().splitlines()
    assert lines[0] == "run1.csv\t8", out  # the ls
    assert lines[-4].startswith("data:results/run1.csv -> run1.csv (8 bytes)"), out
    assert lines[-3].startswith("data:inputs/set -> in ("), out
    assert lines[-2] == "plots -> data:results/run7 (7 bytes)", out
    assert lines[-1] == "x,y;1,2; ['a.txt']", out
    assert (data / "results" / "run7" / "plots" / "p.txt").read_text() == "plotted"
    # the functions, as a script in the kernel would use them
    status, out = run("import cloudtik_node as s\nprint([e['name'] for e in s.ls('data:')])")
    assert status == "ok" and "'results'" in out, out

    # the node's file: the job's account only; the password never on the node's disk
    (folder,) = [p for p in jobs.iterdir() if (p / "cloudtik-api.json").exists()]
    api = json.loads((folder / "cloudtik-api.json").read_text())
    assert stat.S_IMODE((folder / "cloudtik-api.json").stat().st_mode) == 0o600
    for path in folder.rglob("*"):
        if path.is_file():
            assert PASSWORD not in path.read_text(errors="replace"), path

    # paths leave the working folder, storages that are not the session's: refused, said
    # (the doc's lines, exactly)
    doc_lines = [ln for b in doc_examples.parse(doc_examples.ROOT / "docs/hpc.md")
                 if b.heading == HEADING and b.lang == "text" for ln in b.text.splitlines()]
    assert len(doc_lines) == 2, doc_lines
    for code in ("%storage cp data:results/run1.csv ../escape.csv",
                 "%storage cp run1.csv nosuch:results"):
        status, out = run(code)
        assert out.strip() in doc_lines, (code, out)
    for code, said in (
            ("%storage cp data:results/run1.csv ../escape.csv", "leaves the kernel's"),
            ("%storage cp data:results/run1.csv /tmp/x.csv", "is not a path"),
            ("%storage cp data:results/run1.csv kernel.json", "the kernel's own files"),
            ("%storage cp ../../etc/passwd data:results", "leaves the kernel's"),
            ("%storage cp run1.csv nosuch:results", "is not NAME:path of a storage"),
            ("%storage cp /etc/passwd x", "one of SRC and DST must be"),
            ("%storage get data:results/run1.csv", "usage: %storage ls"),
            ("%storage ls nosuch:", "is not NAME:path of a storage")):
        status, out = run(code)
        assert status == "ok" and said in out, (code, out)
    assert not (folder.parent / "escape.csv").exists()

    # the node's token: its own kernel only; a server token or nothing gets nothing
    base = api["url"].rsplit("/node/", 1)[0].rsplit("/", 1)[0]
    for headers, url in (({}, api["url"] + "ls?path=data:"),
                         ({"Authorization": f"token {api['token']}"},
                          f"{base}/{uuid.uuid4()}/node/ls?path=data:"),
                         (server.headers(), api["url"] + "ls?path=data:")):
        r = requests.get(url, headers=headers, timeout=30)
        assert r.status_code == 403, (url, r.status_code, r.text)
    r = requests.get(api["url"] + "ls?path=data:", timeout=30,
                     headers={"Authorization": f"token {api['token']}"})
    assert r.status_code == 200, r.text

    # shut down: the token ends, the file goes
    r = requests.delete(server.url + f"api/kernels/{kid}", headers=server.headers(),
                        timeout=120)
    assert r.status_code == 204
    wait_for(lambda: job not in _job_ids(slurm.env), 60, what="the kernel's job to end")
    r = requests.get(api["url"] + "ls?path=data:", timeout=30,
                     headers={"Authorization": f"token {api['token']}"})
    assert r.status_code == 403, r.text
    assert not (folder / "cloudtik-api.json").exists()
    assert PASSWORD not in server.log_text()
    assert os.path.exists(folder / "run1.csv")


# --- over SSH: the server's port reaches the node through the kernel's own connection ------
from . import test_hpc_environment as _site  # noqa: E402

job_account, env_sshd, site_slurm = _site.job_account, _site.env_sshd, _site.site_slurm


def test_storage_magic_over_ssh(site_slurm, env_sshd, job_account, tmp_path):
    """The job as the site's own account, the login and compute node over SSH: the
    server's port is forwarded to the node's loopback (ssh -R) on the kernel's connection,
    and nothing listens on the network for it."""
    import subprocess
    import sys

    import yaml

    from tests.server.conftest import _stop

    data = tmp_path / "dav"
    (data / "results").mkdir(parents=True)
    (data / "results" / "run1.csv").write_text("x,y\n1,2\n")
    dav = start_server("webdav", data, workdir=tmp_path / "davw", password=PASSWORD)
    workdir = f"{job_account.pw_dir}/ks-{uuid.uuid4().hex[:8]}"
    site = {"type": "slurm", "host": "127.0.0.1", "port": env_sshd.port, "user": _site.ACCOUNT,
            "known_hosts": str(env_sshd.folder / "known_hosts"), "env": site_slurm.env,
            "workdir": workdir, "environment": {"packages": ["ipykernel"]},
            "kernel_node_address": "127.0.0.1", "kernel_node_port": env_sshd.port}
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "jupyter_server_config.py").write_text(
        "c.ServerApp.kernel_spec_manager_class = "
        "'jupyter_cloudtik.hpc.kernels.HPCKernelSpecManager'\n"
        f"c.HPC.backends = {{'site': {site!r}}}\n"
        "c.HPCKernels.profiles = [{'name': 'small', 'backend': 'site', 'time': '10m'}]\n"
        "c.HPCKernels.poll_interval = 0.5\n")
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "hpc.yaml").write_text(yaml.safe_dump({"backends": {"site": site}}))
    (tmp_path / "id").write_text(env_sshd.private_key)
    r = subprocess.run([sys.executable, "-m", "jupyter_cloudtik", "jobs", "secret", "site",
                        "ssh_key", "--from-file", str(tmp_path / "id")], capture_output=True,
                       text=True, env={**os.environ, "CLOUDTIK_STATE_DIR": str(tmp_path / "state"),
                                       "CLOUDTIK_HPC_CONFIG": str(tmp_path / "hpc.yaml")})
    assert r.returncode == 0, r.stderr
    (tmp_path / "id").unlink()
    server = _server_with_storage(tmp_path, dav)
    try:
        r = requests.post(server.url + "api/kernels", headers=server.headers(),
                          json={"name": "cloudtik-hpc-site-small"}, timeout=600)
        assert r.status_code == 201, (r.text[:2000], server.log_text()[-3000:])
        kid = r.json()["id"]
        (st,) = [k for k in server.get("hpc/kernels").json()["kernels"] if k["id"] == kid]
        assert st.get("storages") == "reachable", st
        status, out = asyncio.run(_execute(
            server, kid, "%storage cp data:results/run1.csv .\nimport getpass, json, os\n"
            "print(open('run1.csv').read().strip().replace('\\n', ';'), getpass.getuser(), "
            "json.load(open(os.environ['CLOUDTIK_NODE_API']))['url'])"))
        assert status == "ok", out
        said, last = out.strip().splitlines()
        assert said.startswith("data:results/run1.csv -> run1.csv ("), out
        text, user, url = last.split()
        assert text == "x,y;1,2" and user == _site.ACCOUNT, out
        # the node reaches the server on a port of its loopback that is not the server's
        port = int(url.split(":")[2].split("/")[0])
        server_port = int(server.url.rstrip("/").rsplit(":", 1)[1])
        assert url.startswith("http://127.0.0.1:") and port != server_port, url
        status, out = asyncio.run(_execute(
            server, kid, "open('out.txt', 'w').write('from the node')\n"
            "%storage cp out.txt data:results/ssh"))
        assert status == "ok" and "data:results/ssh" in out, out
        assert (data / "results" / "ssh" / "out.txt").read_text() == "from the node"
        r = requests.delete(server.url + f"api/kernels/{kid}", headers=server.headers(),
                            timeout=120)
        assert r.status_code == 204
    finally:
        problems = _stop(server)
        dav.stop()
    assert not problems, problems
