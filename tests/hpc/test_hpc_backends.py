"""End to end for every script-running backend: local processes, a real Slurm, and the
FirecREST and ARC emulators (real HTTP, the official clients, jobs really run).

Each backend gets the same scenarios: a parameterised notebook reading an input and
writing a result, a failing notebook, cancelling a long job, logs while it runs, and the
job manager restarted (a new process) mid-job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from jupyter_cloudtik.hpc.commands import build_spec

from .conftest import CLIENT_SECRET, wait_for

BACKENDS = ["local", "slurm", "firecrest", "arc"]


@pytest.fixture(params=BACKENDS)
def backend(request, backend_configs):
    name = request.param
    config, secrets = backend_configs[name]()
    return name, config, secrets


@pytest.fixture
def setup(backend, make_client):
    name, config, secrets = backend
    return name, make_client({name: config}, secrets)


def _executed_text(nb_bytes: bytes) -> str:
    nb = json.loads(nb_bytes)
    out = []
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                out.append("".join(o["text"]) if isinstance(o["text"], list) else o["text"])
    return "".join(out)


def test_parameterised_notebook_runs_and_its_results_come_back(setup, notebooks, tmp_path):
    name, client = setup
    spec = build_spec(str(notebooks["param"]), parameters={"factor": 7},
                      inputs=[str(notebooks["data"])], time="10m")
    info = client.submit(spec, name)
    assert info.state in ("queued", "running", "succeeded"), info.reason
    assert info.native_id
    info = client.wait(info.id, timeout=120)
    assert info.state == "succeeded", (info.reason, client.logs(info.id).text[-2000:])
    assert info.output_notebook == "param.out.ipynb"
    outputs = {f.name for f in client.outputs(info.id)}
    assert {"param.out.ipynb", "result.txt"} <= outputs
    assert "data.txt" not in outputs  # inputs are not results
    paths = client.fetch(info.id, tmp_path / "fetched")
    fetched = {p.name: p for p in paths}
    assert fetched["result.txt"].read_text() == "42"  # 6 from the input times the parameter
    executed = fetched["param.out.ipynb"].read_bytes()
    assert "result 42" in _executed_text(executed)
    steps = [e.step for e in client.events(info.id)]
    assert "submitted" in steps and steps[-1] == "succeeded"
    assert client.manager.ops.get(info.op_id).state == "succeeded"


def test_failing_notebook_reports_its_error_cell(setup, notebooks):
    name, client = setup
    info = client.submit(build_spec(str(notebooks["fail"])), name)
    info = client.wait(info.id, timeout=120)
    assert info.state == "failed"
    assert info.error["ename"] == "ZeroDivisionError"
    assert "z = y / 0" in info.error["source"]
    assert info.error["cell"] == 2
    assert "cell 2" in info.reason and "ZeroDivisionError: division by zero" in info.reason
    assert client.manager.ops.get(info.op_id).state == "failed"


def test_cancelling_a_long_job(setup, notebooks):
    name, client = setup
    info = client.submit(build_spec(str(notebooks["long"]), parameters={"seconds": 300}), name)
    wait_for(lambda: client.get(info.id).state == "running", 90, what="the job to run")
    wait_for(lambda: "sleeping" in client.logs(info.id).text, 60, what="the job's output")
    t0 = time.monotonic()
    client.cancel(info.id)
    info = client.wait(info.id, timeout=60)
    assert info.state == "cancelled", info.reason
    assert time.monotonic() - t0 < 30
    assert client.manager.ops.get(info.op_id).state == "cancelled"


def test_logs_stream_while_the_job_runs(setup, notebooks):
    name, client = setup
    info = client.submit(build_spec(str(notebooks["ticks"]), parameters={"n": 8,
                                                                           "delay": 0.6}), name)
    seen_while_running = None
    offset, text = 0, ""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = client.get(info.id).state
        chunk = client.logs(info.id, offset)
        assert chunk.offset >= offset
        offset, text = chunk.offset, text + chunk.text
        if state == "running" and "tick 1" in text and "tick 7" not in text:
            seen_while_running = text
        if state in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.2)
    text += client.logs(info.id, offset).text
    assert seen_while_running, f"no partial log while running; got {text[-500:]!r}"
    assert all(f"tick {i}" in text for i in range(8))
    # reading again from the start gives the same text: offsets are consistent
    assert client.logs(info.id, 0).text.count("tick 7") == text.count("tick 7") == 1


RESTART_SCRIPT = """
import json, os, sys
from jupyter_cloudtik.core.settings import CloudTik
from jupyter_cloudtik.hpc.client import JobsClient
from jupyter_cloudtik.hpc.commands import build_spec
from jupyter_cloudtik.hpc.settings import HPC
backends, name, nb = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
client = JobsClient(settings=CloudTik(state_dir=os.environ["CLOUDTIK_STATE_DIR"]),
                    hpc=HPC(backends=backends))
info = client.submit(build_spec(nb, parameters={"n": 10, "delay": 0.5}), name)
print(info.id, flush=True)
os._exit(0)  # like a kernel that dies: no clean-up, no lease released
"""


def test_job_survives_a_restart_of_the_job_manager(backend, make_client, notebooks, hpc_state):
    name, config, secrets = backend
    if secrets:  # the first process needs them too: store them before it starts
        make_client({name: config}, secrets).close()
    backends = {name: config}
    proc = subprocess.run([sys.executable, "-c", RESTART_SCRIPT, json.dumps(backends), name,
                           str(notebooks["ticks"])], capture_output=True, text=True,
                          env={**os.environ}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    # a new job manager (this process) takes over the dead one's lease and operation
    client = make_client({name: config})
    info = client.wait(job_id, timeout=120)
    assert info.state == "succeeded", info.reason
    steps = [e.step for e in client.events(job_id)]
    assert "adopt" in steps  # this process took the dead one's operation over
    assert steps.count("submitted") == 1
    assert "tick 9" in client.logs(job_id).text


@pytest.mark.parametrize("backend", ["firecrest", "arc"], indirect=True)
def test_secrets_never_show(setup, notebooks, hpc_state):
    name, client = setup
    info = client.wait(client.submit(build_spec(str(notebooks["param"]),
                                                inputs=[str(notebooks["data"])]), name).id,
                       timeout=120)
    assert info.state == "succeeded"
    blob = json.dumps(info.to_dict()) + "".join(e.message + json.dumps(e.data)
                                                 for e in client.events(info.id))
    blob += json.dumps(client.backends()) + client.logs(info.id).text
    assert CLIENT_SECRET not in blob
