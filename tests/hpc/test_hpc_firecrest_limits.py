"""Limits the real FirecREST v2 enforces, as the emulator models them (with the source of
each rule in eth-cscs/firecrest-v2) and as the backend tells them: one line naming the
limit, neither a traceback, nor a retry loop, nor a wrong reading (an empty folder, a
vanished job).  The table in docs/hpc.md lists each rule with its source and its test.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jupyter_cloudtik.core.errors import BackendUnavailable, ProviderError
from jupyter_cloudtik.hpc.base import JobRef
from jupyter_cloudtik.hpc.commands import build_spec

from .conftest import F7T_USER, wait_for

SYS = "testsys"


@pytest.fixture
def home(firecrest):
    folder = Path(firecrest.info["root"]) / F7T_USER  # the site makes it for each user
    folder.mkdir(exist_ok=True)
    return str(folder)


def _posts(firecrest, since: float) -> int:
    return len([r for r in firecrest.requests() if r["t"] >= since and r["method"] == "POST"
                and r["path"] == f"/compute/{SYS}/jobs"])


# --- 1. a submit over the QOS's limits ------------------------------------------------------

def test_a_submit_over_the_qos_limit_is_a_403_told_in_one_line(make_client, backend_configs,
                                                               firecrest, api, home):
    """sbatch over MaxSubmitJobsPerUser says QOSMaxSubmitJobPerUserLimit; FirecREST's
    SbatchCommand.parse_output makes that a SlurmQuotaError, answered 403 (not the 500 of
    other sbatch refusals).  The backend fails the job at once in one line naming the
    limit, and does not submit it again."""
    # the limit counts every job of the user that Slurm still holds: none from other tests
    for j in api.get(f"/compute/{SYS}/jobs").json()["jobs"]:
        if j["status"]["state"] in ("PENDING", "RUNNING"):
            api.delete(f"/compute/{SYS}/jobs/{str(j['jobId']).split('_')[0]}")
    firecrest.admin("slurm", {"qos": {"max_submit_jobs": 1}})
    first = api.post(f"/compute/{SYS}/jobs", json={"job": {
        "name": "hold", "workingDirectory": home, "script": "#!/bin/bash\nsleep 60\n"}})
    assert first.status_code == 201, first.text
    try:
        r = api.post(f"/compute/{SYS}/jobs", json={"job": {
            "name": "over", "workingDirectory": home, "script": "#!/bin/bash\ntrue\n"}})
        assert r.status_code == 403, (r.text, api.get(f"/compute/{SYS}/jobs").json())
        assert r.json()["message"].startswith(
            "Job submission rejected: accounting/QOS policy limit exceeded. sbatch: error: "
            "QOSMaxSubmitJobPerUserLimit"), r.json()
        config, secrets = backend_configs["firecrest"]()
        client = make_client({"firecrest": config}, secrets)
        start = time.time()
        info = client.submit(build_spec(command="echo hi"), "firecrest")
        assert info.state == "failed" and info.native_id is None, info
        assert "QOSMaxSubmitJobPerUserLimit" in info.reason, info.reason
        assert "MaxSubmitJobsPerUser" in info.reason and "\n" not in info.reason, info.reason
        assert "Traceback" not in info.reason and "403" not in info.reason, info.reason
        time.sleep(1.5)  # no retry comes
        assert _posts(firecrest, start) == 1
        assert client.get(info.id).state == "failed"
    finally:
        api.delete(f"/compute/{SYS}/jobs/{first.json()['jobId']}")
    # the limit counts jobs still held: with the first one gone, a job is taken again
    time.sleep(0.5)
    r = api.post(f"/compute/{SYS}/jobs", json={"job": {
        "name": "again", "workingDirectory": home, "script": "#!/bin/bash\ntrue\n"}})
    assert r.status_code == 201, r.text


def test_a_time_limit_over_the_qos_max_wall_is_refused_naming_it(make_client, backend_configs,
                                                                 firecrest):
    """MaxWall with DenyOnLimit: sbatch says QOSMaxWallDurationPerJobLimit, FirecREST 403."""
    firecrest.admin("slurm", {"qos": {"max_wall": 600}})
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": config}, secrets)
    info = client.submit(build_spec(command="echo hi", time="30m"), "firecrest")
    assert info.state == "failed" and info.native_id is None, info
    assert "QOSMaxWallDurationPerJobLimit (MaxWall: the longest time limit" in info.reason, \
        info.reason
    assert "\n" not in info.reason


# --- 2. a listing over ls's limits ----------------------------------------------------------

def test_a_listing_over_the_output_limit_is_walked_folder_by_folder_then_told(
        make_client, backend_configs, firecrest, api):
    """FirecREST's ls goes through the SSH reader that stops at max_ops_file_size: a
    listing whose ``ls -l`` text reaches it is a 413 (OutputLimitExceeded).  The backend
    then lists folder by folder (each under the limit: every file is found), and a
    single folder still over it is told in one line naming the folder and the limit —
    never read as an empty folder."""
    limit = 64 * 1024
    firecrest.admin("system", {"max_ops_file_size": limit})
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": config}, secrets)
    backend = client.manager.backend("firecrest")
    spread = client.wait(client.submit(build_spec(
        command=["bash", "-c", "for d in $(seq 10); do mkdir -p out/d$d; for i in "
                 "$(seq 150); do : > out/d$d/file-$i.txt; done; done"]), "firecrest").id, 120)
    assert spread.state == "succeeded", spread.reason
    folder = backend.folder(spread.id)
    r = api.get(f"/filesystem/{SYS}/ops/ls", params={"path": folder, "recursive": "true"})
    assert r.status_code == 413, r.text
    assert r.json()["message"] == "Command output exceeded buffer limit."
    outs = backend.list_outputs(JobRef(spread.id, spread.native_id))
    assert len([o for o in outs if o.name.startswith("out/d")]) == 1500, len(outs)
    assert "out/d7/file-150.txt" in {o.name for o in outs}

    crowded = client.wait(client.submit(build_spec(
        command=["bash", "-c", "mkdir -p out; for i in $(seq 1200); do : > "
                 "out/file-$i.txt; done"]),
        "firecrest").id, 120)
    assert crowded.state == "succeeded", crowded.reason
    with pytest.raises(ProviderError) as got:
        backend.list_outputs(JobRef(crowded.id, crowded.native_id))
    msg = got.value.message
    assert f"cannot list {backend.folder(crowded.id)}/out on '{SYS}'" in msg, msg
    assert f"413, its 'ls -l' output reached the {limit}-byte limit" in msg, msg
    assert "\n" not in msg and not isinstance(got.value, BackendUnavailable)


def test_a_listing_over_the_command_timeout_is_a_408_told_not_waited_for(
        make_client, backend_configs, firecrest, api, home):
    """ls runs under ``timeout <commandExecution>`` and the SSH client's own timeout of
    the same seconds: a slow file system's listing is a 408 (TimeoutLimitExceeded).  The
    backend says so in one line with the limit; it is neither an empty folder nor an
    outage (``unknown``, asked again forever)."""
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": config}, secrets)
    backend = client.manager.backend("firecrest")
    info = client.wait(client.submit(build_spec(command=["bash", "-c", "echo hi > result.txt"]),
                                     "firecrest").id, 120)
    assert info.state == "succeeded", info.reason
    assert "result.txt" in {o.name for o in backend.list_outputs(JobRef(info.id,
                                                                        info.native_id))}
    firecrest.admin("system", {"command_timeout": 1, "fs_delay": 2})
    backend._system_info = None  # the site changed its config: read it again
    start = time.monotonic()
    r = api.get(f"/filesystem/{SYS}/ops/ls", params={"path": home})
    assert r.status_code == 408, r.text
    assert r.json()["message"] == "Command execution timeout limit exceeded."
    assert 0.9 < time.monotonic() - start < 1.9  # after the timeout, not the slow ls
    with pytest.raises(ProviderError) as got:
        backend.list_outputs(JobRef(info.id, info.native_id))
    msg = got.value.message
    assert f"cannot list {backend.folder(info.id)} on '{SYS}'" in msg, msg
    assert "408, its 'ls' ran over the 1.0 s command limit" in msg, msg
    assert "Command execution timeout limit exceeded." in msg, msg
    assert "\n" not in msg and not isinstance(got.value, BackendUnavailable)


# --- 3. the job listing's time_window -------------------------------------------------------

def test_the_job_listing_shows_finished_jobs_of_its_time_window_only(api, home, firecrest):
    """GET /compute/{system}/jobs: pending and running jobs always, finished ones from
    ``sacct --starttime=now-<time_window>`` (24h unless asked; 1h, 8h, 24h, 3d or 7d,
    anything else a 400); GET /jobs/{id} (sacct --jobs) finds a job however old."""
    r = api.post(f"/compute/{SYS}/jobs", json={"job": {
        "name": "old", "workingDirectory": home, "script": "#!/bin/bash\ntrue\n"}})
    jid = r.json()["jobId"]
    deadline = time.time() + 30
    while api.get(f"/compute/{SYS}/jobs/{jid}").json()["jobs"][0]["status"]["state"] != \
            "COMPLETED" and time.time() < deadline:
        time.sleep(0.1)

    def listed(**params):
        got = api.get(f"/compute/{SYS}/jobs", params=params)
        assert got.status_code == 200, got.text
        return jid in [j["jobId"] for j in got.json()["jobs"]]

    assert listed() and listed(time_window="1h")
    firecrest.admin("slurm", {"age": 2 * 3600})  # it ended two hours ago
    assert not listed(time_window="1h") and listed(time_window="8h") and listed()
    firecrest.admin("slurm", {"age": 2 * 86400})  # two days ago
    assert not listed() and not listed(time_window="24h")
    assert listed(time_window="3d") and listed(time_window="7d")
    assert api.get(f"/compute/{SYS}/jobs/{jid}").json()["jobs"][0]["status"]["state"] == \
        "COMPLETED"
    r = api.get(f"/compute/{SYS}/jobs", params={"time_window": "30days"})
    assert r.status_code == 400 and r.json()["errorType"] == "validation", r.text


@pytest.mark.parametrize("days", [4, 8])  # within the widest window (7d); past it
def test_a_lost_submit_whose_job_ended_before_the_window_is_found_not_run_again(
        days, make_client, backend_configs, firecrest):
    """The submit ran but its answer was lost, and FirecREST stayed down until the job
    had ended long ago: the job is no longer in the listing's window.  The next attempt
    must not read "not listed" as "never submitted" (the job would run twice): the widest
    window is asked, then the job's own folder gives its id; the poller then reads its
    end from GET /jobs/{id}, not from its absence in the listing."""
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": config}, secrets)
    backend = client.manager.backend("firecrest")
    jobs = f"/compute/{SYS}/jobs"
    firecrest.faults(fail=[{"method": "POST", "path": f"^{jobs}$", "status": 504,
                            "after": True, "count": 1}])
    start = time.time()
    info = client.submit(build_spec(command=["bash", "-c", "echo ran >> runs.txt"]),
                         "firecrest")
    assert info.state == "unknown" and info.native_id is None, info
    folder = Path(backend.folder(info.id))
    firecrest.faults(down=True)  # the retries wait while the job runs and ends
    wait_for(lambda: (folder / ".cloudtik" / "exitcode").exists(), 30, what="the job's end")
    firecrest.admin("slurm", {"age": days * 86400})  # ...days ago: past the 24h default
    firecrest.faults(down=False)
    info = client.wait(info.id, 60)
    assert info.state == "succeeded", info.reason
    assert (folder / "runs.txt").read_text() == "ran\n"  # it ran once
    reqs = [r for r in firecrest.requests() if r["t"] >= start]
    assert len([r for r in reqs if r["method"] == "POST" and r["path"] == jobs]) == 1
    assert any(r["path"] == jobs and "time_window=7d" in r["query"] for r in reqs), reqs
    assert any(r["path"] == f"{jobs}/{info.native_id}" for r in reqs)
