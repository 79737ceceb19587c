"""Bad input is refused before anything is submitted; a backend that is down leaves its
jobs ``unknown`` and they recover; an interrupted submit is never run twice; the poller
asks each backend once per interval for all of its jobs."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from jupyter_cloudtik.core.errors import (
    CapacityError,
    ConfigError,
    NotFoundError,
    ProviderError,
)
from jupyter_cloudtik.hpc.commands import build_spec

from .conftest import CLIENT_SECRET, wait_for


def _nothing_recorded(client):
    assert client.list() == []
    assert [o for o in client.manager.ops.list() if o.kind == "hpc.job"] == []


def test_bad_input_is_refused_before_anything_is_recorded(make_client, notebooks, tmp_path):
    client = make_client({"local": {"type": "local"}})
    nb = str(notebooks["param"])
    cases = [
        (dict(notebook=nb), "nope", ConfigError, "unknown backend 'nope'; configured: dask, "
                                                 "local"),
        (dict(notebook=str(tmp_path / "missing.ipynb")), None, NotFoundError,
         "missing.ipynb' does not exist"),
        (dict(notebook=str(notebooks["data"])), None, ConfigError, "is not a version-4 notebook"),
        (dict(notebook=nb, cpus=4096), None, CapacityError, "cpus: 4096 per node is more"),
        (dict(notebook=nb, nodes=3), None, CapacityError, "nodes: 3 is more than"),
        (dict(notebook=nb, memory="900TiB"), None, CapacityError, "memory: 900.0 TiB"),
        (dict(notebook=nb, inputs=[str(tmp_path / "absent.csv")]), None, NotFoundError,
         "inputs: "),
        (dict(notebook=nb, inputs=["mystore:bucket/data.csv"]), None, NotFoundError,
         "inputs: no storage named 'mystore'"),
        (dict(notebook=nb, inputs=[str(notebooks["data"]), f"data.txt={notebooks['data']}"]),
         None, ConfigError, "named 'data.txt'"),
        (dict(notebook=nb, output="ftp://example.org/out"), None, ConfigError,
         "cannot write to 'ftp://example.org/out'"),
    ]
    for kwargs, backend, exc, text in cases:
        with pytest.raises(exc) as e:
            client.submit(build_spec(**kwargs), backend)
        assert text in e.value.message, (kwargs, e.value.message)
        assert e.value.field
    with pytest.raises(ConfigError, match="time: 'soon' is not a duration"):
        build_spec(nb, time="soon")
    with pytest.raises(ConfigError, match="memory: 'lots'"):
        build_spec(nb, memory="lots")
    _nothing_recorded(client)


def test_slurm_limits_come_from_the_cluster(make_client, backend_configs, notebooks):
    config, _ = backend_configs["slurm"]()
    client = make_client({"hpc": config})
    nb = str(notebooks["param"])
    with pytest.raises(CapacityError, match=r"time: 02:00:00 is longer than backend 'hpc', "
                                            r"queue 'debug', allows \(at most 01:00:00\)"):
        client.submit(build_spec(nb, time="2h"), "hpc")
    with pytest.raises(ConfigError, match="queue: 'gpu' is not a partition/queue of backend "
                                          "'hpc'; available: debug"):
        client.submit(build_spec(nb, queue="gpu"), "hpc")
    with pytest.raises(CapacityError, match="memory"):
        client.submit(build_spec(nb, memory="8GiB"), "hpc")
    with pytest.raises(CapacityError, match="cpus: 3 per node"):
        client.submit(build_spec(nb, cpus=3), "hpc")
    _nothing_recorded(client)


def test_slurm_script_carries_resources_environment_and_staging(make_client, backend_configs,
                                                                 notebooks):
    config, _ = backend_configs["slurm"]()
    client = make_client({"hpc": config})
    info = client.submit(build_spec(str(notebooks["param"]), nodes=1, cpus=2, memory="512MiB",
                                    time="1:30", queue="debug", parameters={"factor": 3},
                                    inputs=[str(notebooks["data"])], env={"MY_FLAG": "on"}),
                         "hpc")
    text = client.read_file(info.id, "job.sh").decode()
    for line in ("#SBATCH --nodes=1", "#SBATCH --cpus-per-task=2", "#SBATCH --mem=512M",
                 "#SBATCH --time=00:02:00", "#SBATCH --partition=debug",
                 "#SBATCH --job-name=param", "#SBATCH --comment=cloudtik:",
                 "export MY_FLAG=on",
                 # papermill with the kernel on IPC sockets (hpc/papermill_runner.py),
                 # between the provenance snapshots, in one interpreter
                 "' .cloudtik/prov-before.json .cloudtik/prov-after.json param.ipynb "
                 "param.out.ipynb parameters.json python3 \"$CT_JOB_DIR\"",
                 f"cp -R -- {notebooks['data']} data.txt"):
        assert line in text, line
    import sys

    assert f"CT_PYTHON={sys.executable}" in text  # the session's interpreter by default
    info = client.wait(info.id, 120)
    assert info.state == "succeeded", info.reason


def _jobs_with_comment(slurm, token: str) -> list[str]:
    out = slurm.run("squeue", "--me", "--states=all", "-h", "-o", "%i|%k").stdout
    return [line for line in out.splitlines() if line.endswith(f"cloudtik:{token}")]


def test_slurm_controller_down_job_is_unknown_then_recovers(make_client, backend_configs,
                                                            notebooks, slurm):
    config, _ = backend_configs["slurm"]()
    client = make_client({"hpc": config})
    info = client.submit(build_spec(str(notebooks["ticks"]), parameters={"n": 12,
                                                                        "delay": 0.5}), "hpc")
    wait_for(lambda: client.get(info.id).state == "running", 60, what="running")
    slurm.stop_controller()
    try:
        down = wait_for(lambda: (j := client.get(info.id)).state == "unknown" and j, 30,
                        what="unknown")
        assert "did not answer" in down.reason and "squeue" in down.reason
    finally:
        slurm.start_controller()
    info = client.wait(info.id, 120)
    assert info.state == "succeeded", info.reason
    steps = [e.step for e in client.events(info.id)]
    assert "unavailable" in steps and steps.count("submitted") == 1
    token = client.manager._row(info.id)["client_token"]
    assert len(_jobs_with_comment(slurm, token)) == 1


def test_slurm_down_at_submit_is_submitted_once_when_it_returns(make_client, backend_configs,
                                                                notebooks, slurm):
    config, _ = backend_configs["slurm"]()
    client = make_client({"hpc": config})
    slurm.stop_controller()
    try:
        info = client.submit(build_spec(str(notebooks["param"]),
                                        inputs=[str(notebooks["data"])]), "hpc")
        assert info.state == "unknown" and info.native_id is None
        assert "will be submitted when it does" in info.reason
        time.sleep(1.5)  # the poller retries (and fails) a few times meanwhile
    finally:
        slurm.start_controller()
    info = client.wait(info.id, 120)
    assert info.state == "succeeded", info.reason
    token = client.manager._row(info.id)["client_token"]
    assert len(_jobs_with_comment(slurm, token)) == 1


@pytest.mark.parametrize("service", ["firecrest", "arc"])
def test_lost_answer_to_a_submit_is_not_submitted_twice(service, make_client, backend_configs,
                                                        notebooks, request):
    """The service ran the submit but its answer was lost (a gateway timeout): the next
    attempt finds the job by its folder/name instead of submitting again."""
    config, secrets = backend_configs[service]()
    svc = request.getfixturevalue(service)
    client = make_client({service: config}, secrets)
    path = "/compute/testsys/jobs" if service == "firecrest" else "/arex/rest/1.1/jobs"
    svc.faults(fail=[{"method": "POST", "path": f"^{path}$", "status": 504, "after": True,
                      "count": 1}])
    before = len([r for r in svc.requests() if r["method"] == "POST" and r["path"] == path])
    assert before >= 0
    info = client.submit(build_spec(str(notebooks["param"]),
                                    inputs=[str(notebooks["data"])]), service)
    assert info.state == "unknown" and info.native_id is None, info
    info = client.wait(info.id, 120)
    assert info.state == "succeeded", info.reason
    posts = [r for r in svc.requests() if r["method"] == "POST" and r["path"] == path]
    creations = [r for r in posts[before:] if service == "firecrest" or
                 "action=new" in r["query"]]
    assert len(creations) == 1  # submitted once, although the first answer was lost
    assert client.manager._row(info.id)["submit_attempts"] == 2
    steps = [e.step for e in client.events(info.id)]
    assert "unavailable" in steps


def test_firecrest_down_then_back(make_client, backend_configs, notebooks, firecrest):
    config, _ = backend_configs["firecrest"]()
    client = make_client({"f7t": config}, {("f7t", "client_secret"): CLIENT_SECRET})
    info = client.submit(build_spec(str(notebooks["ticks"]), parameters={"n": 14,
                                                                        "delay": 0.5}), "f7t")
    wait_for(lambda: client.get(info.id).state == "running", 60, what="running")
    firecrest.faults(down=True)
    j = wait_for(lambda: (j := client.get(info.id)).state == "unknown" and j, 30,
                 what="unknown")
    assert "503" in j.reason
    firecrest.faults(down=False)
    wait_for(lambda: client.get(info.id).state != "unknown", 30, what="recovery")
    # now a real outage: the service process dies (jobs on the system go on) and returns
    firecrest.stop(crash=True)
    j = wait_for(lambda: (j := client.get(info.id)).state == "unknown" and j, 30,
                 what="unknown after the crash")
    assert "cannot reach" in j.reason
    firecrest.start()
    info = client.wait(info.id, 120)
    assert info.state == "succeeded", info.reason
    assert "tick 13" in client.logs(info.id).text


def test_firecrest_wrong_credentials_are_refused_before_submitting(make_client,
                                                                   backend_configs, notebooks):
    config, _ = backend_configs["firecrest"]()
    client = make_client({"f7t": config}, {("f7t", "client_secret"): "not-the-secret"})
    with pytest.raises(ProviderError, match="refused the client credentials of backend 'f7t'"):
        client.submit(build_spec(str(notebooks["param"])), "f7t")
    _nothing_recorded(client)
    client2 = make_client({"f7t2": config})
    with pytest.raises(ConfigError, match="has no client secret; set it with `jupyter cloudtik "
                                          "jobs secret f7t2 client_secret`"):
        client2.submit(build_spec(str(notebooks["param"])), "f7t2")


def test_firecrest_throttling_and_revoked_tokens(make_client, backend_configs, notebooks,
                                                 firecrest):
    config, _ = backend_configs["firecrest"]()
    client = make_client({"f7t": config}, {("f7t", "client_secret"): CLIENT_SECRET})
    firecrest.faults(throttle={"count": 2, "retry_after": 1})
    info = client.submit(build_spec(str(notebooks["param"]),
                                    inputs=[str(notebooks["data"])]), "f7t")
    issued = firecrest.admin("tokens")["issued"]
    firecrest.faults(revoke=True)  # every token issued so far is refused from now on
    info = client.wait(info.id, 120)
    assert info.state == "succeeded", info.reason
    assert firecrest.admin("tokens")["issued"] > issued  # a fresh token was fetched


def test_firecrest_large_input_goes_through_the_staged_transfer(make_client, backend_configs,
                                                                notebooks, firecrest, tmp_path):
    config, _ = backend_configs["firecrest"]()
    client = make_client({"f7t": config}, {("f7t", "client_secret"): CLIENT_SECRET})
    big = tmp_path / "big.bin"
    # over the server's 5 MiB direct limit (max_ops_file_size, which the backend reads
    # from /status/systems); two parts: S3 takes parts under 5 MiB only as the last one
    size = 6 * 1024 * 1024 + 17
    big.write_bytes(b"x" * size)
    nb = tmp_path / "size.ipynb"
    nb.write_text(json.dumps({
        "nbformat": 4, "nbformat_minor": 5, "metadata": {},
        "cells": [{"cell_type": "code", "id": "a", "metadata": {}, "execution_count": None,
                   "outputs": [], "source": "import os\nprint('size', os.path.getsize("
                                            "'big.bin'))"}]}))
    t0 = time.time()  # the emulator is shared by the worker's tests: only this one's
    info = client.wait(client.submit(build_spec(str(nb), inputs=[str(big)]), "f7t").id, 120)
    assert info.state == "succeeded", info.reason
    assert f"size {size}" in client.logs(info.id).text
    paths = [r["path"] for r in firecrest.requests() if r["t"] >= t0]
    assert "/filesystem/testsys/transfer/upload" in paths
    assert any(p.startswith("/s3/") for p in paths)


def test_poller_asks_each_backend_once_per_interval_for_all_jobs(make_client, backend_configs,
                                                                 notebooks, firecrest):
    config, _ = backend_configs["firecrest"]()
    client = make_client({"f7t": config}, {("f7t", "client_secret"): CLIENT_SECRET},
                         poll_interval=0.2, poll_interval_max=1.0, poll_backoff=2.0)
    jobs = [client.submit(build_spec(str(notebooks["long"]), parameters={"seconds": 60}),
                          "f7t") for _ in range(3)]
    wait_for(lambda: all(client.get(j.id).state == "running" for j in jobs), 60,
             what="three running jobs")
    start = len(firecrest.requests())
    time.sleep(4.0)
    window = firecrest.requests()[start:]
    lists = [r for r in window if r["method"] == "GET" and r["path"] == "/compute/testsys/jobs"]
    singles = [r for r in window if r["path"].startswith("/compute/testsys/jobs/")]
    # one list call per poll for all three jobs, backing off to 1 s while nothing changes
    assert 2 <= len(lists) <= 8, len(lists)
    assert singles == []
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(lists)]
    assert max(gaps) >= 0.9  # it backed off to the maximum interval
    for j in jobs:
        client.cancel(j.id)
    for j in jobs:
        assert client.wait(j.id, 60).state == "cancelled"


def test_arc_fetches_url_inputs_itself_and_checks_queue_limits(make_client, backend_configs,
                                                               notebooks, arc, http_files):
    folder, base = http_files
    (folder / "remote.txt").write_text("5\n")
    config, secrets = backend_configs["arc"]()
    client = make_client({"arc": config}, secrets)
    with pytest.raises(CapacityError, match="queue 'main', allows"):
        client.submit(build_spec(str(notebooks["param"]), time="3h"), "arc")
    info = client.submit(build_spec(str(notebooks["param"]), parameters={"factor": 3,
                                                                          "input_name": "r.txt"},
                                    inputs=[f"r.txt={base}/remote.txt"]), "arc")
    assert info.inputs == [{"name": "r.txt", "source": f"{base}/remote.txt", "mode": "direct",
                            "size": None}]
    info = client.wait(info.id, 120)
    assert info.state == "succeeded", info.reason
    assert "result 15" in client.logs(info.id).text
    puts = [r["path"] for r in arc.requests() if r["method"] == "PUT"]
    assert not any(p.endswith("/r.txt") for p in puts)  # the CE fetched it, nobody uploaded
