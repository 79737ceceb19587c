"""docs/hpc.md's "Interactive kernels", run on the project's test Slurm through a real
Jupyter server: the doc's config block is the server's ``jupyter_server_config.py`` (with
the test Slurm on this machine as ``daint`` in place of the doc's SSH backend, one line
appended), the launcher's entries are what ``GET /api/kernelspecs`` answers, the doc's
cell runs in a kernel the server started as a Slurm job (over the server's kernel
websocket, as JupyterLab talks to it), and every refusal the doc quotes is the one the
server logs or answers for the same request; while the kernel's job waits in the queue,
``GET /cloudtik/api/hpc/kernels`` says so, with Slurm's reason."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import doc_examples
import pytest
import requests

from .conftest import wait_for, write_hpc_kernel_config

DOC = "docs/hpc.md"
HEADING = "Interactive kernels"


def _texts() -> list[str]:
    """The section's ``text`` blocks: the launcher's entries, then the refusals."""
    found = [b.text for b in doc_examples.parse(doc_examples.ROOT / DOC)
             if b.heading == HEADING and b.lang == "text"]
    assert len(found) == 2, found
    return found


async def _execute(server, kernel_id: str, code: str, timeout: float = 120) -> tuple[str, str]:
    """Run ``code`` over the server's kernel websocket; (reply status, what it printed)."""
    from jupyter_client.jsonutil import json_default
    from jupyter_client.session import Session
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    session = Session()
    ws_url = server.url.replace("http://", "ws://") + \
        f"api/kernels/{kernel_id}/channels?session_id={session.session}"
    ws = await websocket_connect(HTTPRequest(ws_url, headers=server.headers()))
    try:
        msg = session.msg("execute_request", {"code": code, "silent": False,
                                              "store_history": True, "user_expressions": {},
                                              "allow_stdin": False, "stop_on_error": True})
        msg["channel"] = "shell"
        await ws.write_message(json.dumps(msg, default=json_default))
        out, status, idle = [], None, False
        while status is None or not idle:
            raw = await asyncio.wait_for(ws.read_message(), timeout)
            assert raw is not None, "the server closed the kernel's websocket"
            m = json.loads(raw)
            if m.get("parent_header", {}).get("msg_id") != msg["header"]["msg_id"]:
                continue
            kind = m["msg_type"]
            if kind == "stream":
                out.append(m["content"]["text"])
            elif kind == "error":
                out.append(f"{m['content']['ename']}: {m['content']['evalue']}")
            elif kind == "execute_reply":
                status = m["content"]["status"]
            elif kind == "status" and m["content"]["execution_state"] == "idle":
                idle = True
        return status, "".join(out)
    finally:
        ws.close()


def _sbatch(env: dict, *argv: str) -> str:
    r = subprocess.run(["sbatch", "--parsable", *argv], capture_output=True, text=True,
                       env={**os.environ, **env}, check=True)
    return r.stdout.strip().split(";")[0]


def _scancel(env: dict, job: str) -> None:
    subprocess.run(["scancel", job], env={**os.environ, **env}, check=False)


def _job_ids(env: dict) -> set[str]:
    return {ln.split()[0] for ln in _squeue(env).splitlines()}


def _squeue(env: dict) -> str:
    r = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True,
                       env={**os.environ, **env})
    return r.stdout


@pytest.mark.slow
def test_interactive_kernels_section_through_a_real_server(slurm, tmp_path):
    from jupyter_cloudtik.hpc.kernels import HPCKernelSpecManager, Profile
    from jupyter_cloudtik.hpc.kernels.specs import spec_dict
    from tests.server.conftest import _start_server, _stop

    config_block = doc_examples.block(DOC, HEADING, 0, lang="python")
    cell_block = doc_examples.block(DOC, HEADING, 1, lang="python")
    launcher_text, refusals_text = _texts()
    assert "c.ServerApp.kernel_spec_manager_class" in config_block.text
    daint = {"type": "slurm", "env": slurm.env, "workdir": str(tmp_path / "daint-jobs")}
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "jupyter_server_config.py").write_text(
        config_block.text + "\n# the test: the project's Slurm on this machine as daint\n"
        f"c.HPC.backends['daint'] = {daint!r}\nc.HPCKernels.poll_interval = 0.5\n")
    # kernel specs a user (or an old install) has on disk: one whose profile the admin
    # removed, one for the FirecREST backend (which the manager itself leaves out)
    kernels = tmp_path / "data" / "kernels"
    for p in (Profile(name="huge", backend="daint"), Profile(name="cscs", backend="eiger")):
        (kernels / p.spec_name).mkdir(parents=True)
        (kernels / p.spec_name / "kernel.json").write_text(json.dumps(spec_dict(p)))

    server = _start_server(tmp_path, "server", [
        "--ServerApp.jpserver_extensions={'jupyter_cloudtik': True}"], {})
    try:
        # the launcher's entries, as the doc lists them (and not the FirecREST profile's)
        specs = requests.get(server.url + "api/kernelspecs", headers=server.headers(),
                             timeout=60).json()["kernelspecs"]
        shown = {name: s["spec"]["display_name"] for name, s in specs.items()
                 if name.startswith("cloudtik-hpc-") and name not in
                 ("cloudtik-hpc-daint-huge", "cloudtik-hpc-eiger-cscs")}
        assert sorted(shown.values()) == launcher_text.strip().splitlines(), shown
        assert set(shown) == {"cloudtik-hpc-daint-debug", "cloudtik-hpc-daint-large"}
        assert "python3" in specs  # beside the installed kernels
        assert specs["cloudtik-hpc-daint-debug"]["spec"]["metadata"]["kernel_provisioner"][
            "provisioner_name"] == "cloudtik-hpc"

        refused = refusals_text.strip().splitlines()
        assert len(refused) == 4, refused
        # the FirecREST profile: left out, said once in the server's log
        assert refused[0] in server.log_text(), server.log_text()[-3000:]
        # starting the others: the server answers the one line (and starts nothing)
        for name, line, code in (("cloudtik-hpc-daint-huge", refused[1], 400),
                                 ("cloudtik-hpc-daint-large", refused[2], 409),
                                 ("cloudtik-hpc-eiger-cscs", refused[3], 400)):
            r = requests.post(server.url + "api/kernels", headers=server.headers(),
                              json={"name": name}, timeout=120)
            assert r.status_code == code, (name, r.status_code, r.text[:500])
            assert r.json().get("message") == line, (name, r.text[:2000])
        assert "kernel-" not in _squeue(slurm.env)
        listed = requests.get(server.url + "api/kernels", headers=server.headers(),
                              timeout=60).json()
        assert listed == [], listed

        # the debug profile: a Slurm job, which waits while the node is full; the REST API
        # (GET hpc/kernels) says why meanwhile, as the doc says
        blocker = _sbatch(slurm.env, "-c", "2", "-t", "10", "-o", "/dev/null",
                          "--chdir", str(tmp_path), "--wrap", "sleep 600")
        try:
            with ThreadPoolExecutor(1) as pool:
                starting = pool.submit(requests.post, server.url + "api/kernels",
                                       headers=server.headers(),
                                       json={"name": "cloudtik-hpc-daint-debug"}, timeout=300)
                (queued,) = wait_for(lambda: [k for k in server.get("hpc/kernels").json()[
                    "kernels"] if k["state"] == "queued" and k.get("reason")], 60,
                    what="GET hpc/kernels to show the kernel queued with a reason")
                assert queued["backend"] == "daint" and queued["profile"] == "debug", queued
                assert queued["native_state"] == "PENDING" and queued["reason"] in (
                    "Resources", "Priority"), queued
                assert not starting.done()  # JupyterLab still shows it as starting
                _scancel(slurm.env, blocker)
                r = starting.result(300)
        finally:
            _scancel(slurm.env, blocker)
        assert r.status_code == 201, (r.status_code, r.text[:2000],
                                      server.log_text()[-3000:])
        kid = r.json()["id"]
        assert queued["id"] == kid
        (running,) = server.get("hpc/kernels").json()["kernels"]
        assert running["state"] == "running" and running["job"] == queued["job"], running
        assert running["node"] and running["deadline"] > time.time() + 25 * 60, running
        queue = _squeue(slurm.env)
        (job,) = [ln.split()[0] for ln in queue.splitlines() if "kernel-debug" in ln]
        status, out = asyncio.run(_execute(server, kid, cell_block.text))
        assert status == "ok", out
        _host, job_id, cpus = out.split()
        assert job_id == job and cpus == "1", out
        # the server's log tells the job's story (queue state included)
        log = server.log_text()
        assert f"HPC kernel {kid}: job {job} submitted to daint" in log, log[-3000:]
        assert re.search(rf"HPC kernel {kid}: job {job} PENDING \((Resources|Priority)\)",
                         log), log[-3000:]
        r = requests.delete(server.url + f"api/kernels/{kid}", headers=server.headers(),
                            timeout=120)
        assert r.status_code == 204, r.text
        wait_for(lambda: job not in _job_ids(slurm.env), 60, what="the kernel's job to end")
        assert server.get("hpc/kernels").json() == {"kernels": []}
        # shut down: the kernel was asked to exit, which ends the job (else scancel)
        assert re.search(rf"HPC kernel {kid}: job {job} (ended \(COMPLETED\): the kernel "
                         "exited|cancelled)", server.log_text()), server.log_text()[-2000:]

        _custom_sizes(server, slurm, cell_block.text)

        # a server stopped cleanly (SIGTERM) shuts its kernels down: their jobs end
        r = requests.post(server.url + "api/kernels", headers=server.headers(),
                          json={"name": "cloudtik-hpc-daint-debug"}, timeout=300)
        assert r.status_code == 201, r.text[:2000]
        (last,) = [k["job"] for k in server.get("hpc/kernels").json()["kernels"]]
        assert last in _job_ids(slurm.env)
    finally:
        problems = _stop(server)
    assert not problems, problems
    wait_for(lambda: last not in _job_ids(slurm.env), 60,
             what="the job of a kernel of the stopped server to end")
    # a profile's own mistake: that profile left out, one line naming the field in the
    # log (as the doc quotes it); the good profile and the installed kernels stay listed
    import logging

    bad = [{"name": "debug", "backend": "daint"}, {"name": "none", "backend": "daint",
                                                   "cores": 0}]
    from traitlets.config import Config

    said: list[str] = []

    class Said(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    ksm = HPCKernelSpecManager(config=Config({"HPC": {"backends": {"daint": daint}},
                                              "HPCKernels": {"profiles": bad}}))
    ksm.log.addHandler(Said())
    listed = ksm.get_all_specs()
    assert "cloudtik-hpc-daint-debug" in listed and "python3" in listed, sorted(listed)
    assert not any(n.endswith("-none") for n in listed), sorted(listed)
    quoted = re.search(r"`(HPCKernels\.profiles\[1\]\.cores: [^`]*)`",
                       " ".join((doc_examples.ROOT / DOC).read_text().split()))
    assert quoted and any(quoted.group(1) in line for line in said), said


def _custom_sizes(server, slurm, cell: str) -> None:
    """docs/hpc.md "Interactive kernels: custom sizes": the form's request, its answer,
    the kernel it names (a job of that size), the refusals; nothing else submitted."""
    sub = "Interactive kernels: custom sizes"
    asked = json.loads(doc_examples.block(DOC, sub, 0, lang="json").text)
    answer_text, refusals_text = [b.text for b in doc_examples.parse(doc_examples.ROOT / DOC)
                                  if b.heading == sub and b.lang == "text"]
    before = _job_ids(slurm.env)
    for body, line in zip(({**asked, "cores": 4}, {**asked, "profile": "large"},
                           {**asked, "time": "2h"}),
                          refusals_text.strip().splitlines(), strict=True):
        r = server.request("POST", "hpc/kernel-sizes", json=body)
        assert r.status_code == 400 and r.json()["message"] == line, (body, r.text[:500])
    # a size the bounds allow but the partition has not (no bounds: custom true) is the
    # partition's one line and a 409; not reached with the doc's bounds of 2 cores
    r = server.request("POST", "hpc/kernel-sizes", json={**asked, "memory": "3GiB"})
    assert r.status_code == 400 and r.json()["message"].startswith("memory: 3.0 GiB is more"), \
        r.text[:500]
    r = server.request("POST", "hpc/kernel-sizes", json=asked)
    assert r.status_code == 200, r.text[:1000]
    assert r.json() == json.loads(answer_text), r.text
    name = r.json()["name"]
    assert _job_ids(slurm.env) == before  # checking submits nothing
    # the kernel picker lists the chosen size from now on
    specs = requests.get(server.url + "api/kernelspecs", headers=server.headers(),
                         timeout=60).json()["kernelspecs"]
    assert specs[name]["spec"]["display_name"] == json.loads(answer_text)["display_name"]
    r = requests.post(server.url + "api/kernels", headers=server.headers(),
                      json={"name": name}, timeout=300)
    assert r.status_code == 201, (r.text[:2000], server.log_text()[-3000:])
    kid = r.json()["id"]
    (k,) = [k for k in server.get("hpc/kernels").json()["kernels"] if k["id"] == kid]
    status, out = asyncio.run(_execute(server, kid, cell))
    assert status == "ok", out
    _host, job, cpus = out.split()
    assert job == k["job"] and cpus == "2", out
    limit = subprocess.run(["squeue", "-h", "-j", job, "-o", "%l"], capture_output=True,
                           text=True, env={**os.environ, **slurm.env}).stdout.strip()
    assert limit == "45:00", limit
    r = requests.delete(server.url + f"api/kernels/{kid}", headers=server.headers(),
                        timeout=120)
    assert r.status_code == 204, r.text
    wait_for(lambda: job not in _job_ids(slurm.env), 60, what="the custom kernel's job to end")


@pytest.mark.slow
def test_the_next_server_ends_and_reports_the_kernels_of_a_killed_one(slurm, tmp_path):
    """A server killed (SIGKILL: no shutdown) while its HPC kernel runs: the kernel's job
    would hold its allocation until the wall time, and no later server could reach it.
    The next server on the same state folder cancels the job, removes the kernel's key
    from the job folder, and says so in its log and in ``GET hpc/kernels``, as the doc
    says; a kernel it starts itself is listed beside it and left alone."""
    import signal

    from tests.server.conftest import _start_server, _stop

    workdir = write_hpc_kernel_config(tmp_path, slurm)
    args = ["--ServerApp.jpserver_extensions={'jupyter_cloudtik': True}"]
    first = _start_server(tmp_path, "server", args, {})
    try:
        r = requests.post(first.url + "api/kernels", headers=first.headers(),
                          json={"name": "cloudtik-hpc-daint-debug"}, timeout=300)
        assert r.status_code == 201, (r.status_code, r.text[:2000])
        kid = r.json()["id"]
        (k,) = first.get("hpc/kernels").json()["kernels"]
        job = k["job"]
        assert k["state"] == "running" and job in _job_ids(slurm.env), k
        keys = list(workdir.glob("*/kernel.json"))
        assert len(keys) == 1, keys
        os.killpg(first.proc.pid, signal.SIGKILL)  # the server and anything it started
        first.proc.wait(30)
    finally:
        _stop(first)
    time.sleep(2)
    assert job in _job_ids(slurm.env), "the job should outlive its killed server"

    second = _start_server(tmp_path, "server", args, {})
    try:
        # the server's start alone (its kernel spec manager) looks for such jobs
        wait_for(lambda: job not in _job_ids(slurm.env), 60,
                 what="the killed server's kernel job to be cancelled by the next server")
        listed = wait_for(lambda: [x for x in second.get("hpc/kernels").json()["kernels"]
                                   if x["id"] == kid and x["state"] == "dead"], 30,
                          what="GET hpc/kernels to report the killed server's kernel")
        (gone,) = listed
        assert gone["orphaned"] is True and gone["job"] == job, gone
        assert re.fullmatch(rf"its server \(pid {first.proc.pid} on \S+\) stopped without "
                            rf"shutting it down; job {job} on daint was cancelled",
                            gone["reason"]), gone
        assert f"HPC kernel {kid}: {gone['reason']}" in second.log_text()
        assert not keys[0].exists(), "the kernel's key stays in its job folder"
        # the doc says the same
        doc = " ".join((doc_examples.ROOT / DOC).read_text().split())
        assert "stopped without shutting it down; job 1234 on daint was cancelled" in doc

        # a kernel of this server: listed beside it, and not taken for an orphan
        r = requests.post(second.url + "api/kernels", headers=second.headers(),
                          json={"name": "cloudtik-hpc-daint-debug"}, timeout=300)
        assert r.status_code == 201, (r.status_code, r.text[:2000])
        states = {x["id"]: x["state"] for x in second.get("hpc/kernels").json()["kernels"]}
        assert states == {kid: "dead", r.json()["id"]: "running"}, states
        (mine,) = [x["job"] for x in second.get("hpc/kernels").json()["kernels"]
                   if x["state"] == "running"]
        assert mine in _job_ids(slurm.env)
    finally:
        problems = _stop(second)
    assert not problems, problems
    wait_for(lambda: mine not in _job_ids(slurm.env), 60, what="the second kernel's job to end")
