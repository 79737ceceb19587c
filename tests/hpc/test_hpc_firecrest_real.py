"""The FirecREST emulator answers as the real FirecREST v2 server did, and the backend
copes with what the real server does.

Every rule here was seen on the real server (FirecREST v2 from its public repository, run
over SSH to a real Slurm 22.05 with slurmdbd accounting, as a normal user); the table in
docs/hpc.md ("FirecREST: real server vs emulator") lists them with the test of each.
"""

from __future__ import annotations

import grp
import json
import pwd
import re
import time
from pathlib import Path

import httpx
import pytest

from jupyter_cloudtik.core.errors import CapacityError, ProviderError
from jupyter_cloudtik.hpc.base import JobRef
from jupyter_cloudtik.hpc.commands import build_spec

from .conftest import CLIENT_SECRET, F7T_USER, SITE_PYTHON, wait_for

SYS = "testsys"


@pytest.fixture
def home(firecrest):
    return f"{firecrest.info['root']}/{F7T_USER}"


def _submit(api, home, script="#!/bin/bash\nexit 3\n", **job):
    return api.post(f"/compute/{SYS}/jobs", json={"job": {
        "name": "probe", "workingDirectory": home, "script": script, **job}})


def _job(api, jid):
    return api.get(f"/compute/{SYS}/jobs/{jid}").json()["jobs"][0]


def test_partitions_have_no_default_and_no_time_limit(api):
    parts = api.get(f"/status/{SYS}/partitions").json()["partitions"]
    assert parts == [{"name": "normal", "cpus": 2, "totalNodes": 1, "partition": "UP"}]


def test_systems_say_the_direct_transfer_limit_in_snake_case(api):
    system = api.get("/status/systems").json()["systems"][0]
    assert system["dataOperation"]["max_ops_file_size"] == 5 * 1024 * 1024
    assert system["fileSystems"][0]["defaultWorkDir"] is True
    assert api.get("/status/nosuch/partitions").json()["message"] == "System not found"


def test_errors_carry_the_remote_command_and_real_statuses(api, home, firecrest):
    root = firecrest.info["root"]
    r = api.post(f"/filesystem/{SYS}/ops/mkdir", json={"path": f"{root}/cloudtik-jobs",
                                                       "parent": True})
    assert r.status_code == 403 and "Permission denied" in r.json()["message"]
    r = api.post(f"/filesystem/{SYS}/ops/mkdir", json={"path": f"{home}/x/y"})
    assert r.status_code == 404 and "No such file or directory" in r.json()["message"]
    r = api.post(f"/filesystem/{SYS}/ops/mkdir", json={"path": f"{home}/x/y", "parent": True})
    assert r.status_code == 201
    assert api.post(f"/filesystem/{SYS}/ops/mkdir",  # again: mkdir -p is fine
                    json={"path": f"{home}/x/y", "parent": True}).status_code == 201
    r = api.get(f"/filesystem/{SYS}/ops/ls", params={"path": "/etc"})
    assert r.status_code == 400 and "does not match any of the defined filesystem" in \
        r.json()["message"]
    assert set(r.json()) == {"errorType", "message", "causedBy", "data", "user"}
    r = api.post(f"/filesystem/{SYS}/ops/upload", params={"path": f"{home}/nosuch"},
                 files={"file": ("a.txt", b"a")})
    assert r.status_code == 404
    r = api.post(f"/filesystem/{SYS}/ops/upload", params={"path": f"{home}/x"},
                 files={"file": ("big", b"x" * (5 * 1024 * 1024 + 1))})
    assert (r.status_code, r.json()["message"]) == (413, "File to upload is too large.")
    assert api.get(f"/filesystem/{SYS}/ops/view", params={"path": f"{home}/x"}
                   ).status_code == 500  # dd: Is a directory
    r = api.get(f"/filesystem/{SYS}/ops/checksum", params={"path": f"{home}/x/y"})
    assert r.status_code in (200, 500)


def test_sbatch_refusals_are_500_with_slurms_words(api, home):
    r = _submit(api, home, partition="nosuch")
    assert r.status_code == 500
    assert "sbatch: error: Batch job submission failed: Invalid partition name specified" \
        in r.json()["message"]
    r = _submit(api, home, script="#!/bin/bash\n#SBATCH --bogus=1\n")
    assert r.status_code == 500 and "exit_status:255" in r.json()["message"]
    r = _submit(api, home, script="#!/bin/bash\n#SBATCH --mem=100G\n")
    assert r.status_code == 500 and "Requested node configuration is not available" in \
        r.json()["message"]
    # ...and accounting recorded the refused submission as a job that never had a node
    refused = [j for j in api.get(f"/compute/{SYS}/jobs").json()["jobs"]
               if j["nodes"] == "None assigned" and j["status"]["state"] == "FAILED"]
    assert refused and refused[-1]["status"]["exitCode"] == 1
    r = api.post(f"/compute/{SYS}/jobs", json={"job": {"script": "#!/bin/bash\n"}})
    assert r.status_code == 400 and r.json()["errorType"] == "validation"


def test_jobs_as_firecrest_shows_them(api, home):
    r = _submit(api, home)
    assert r.status_code == 201 and isinstance(r.json()["jobId"], str)
    jid = r.json()["jobId"]
    job = wait_for(lambda: (j := _job(api, jid))["status"]["state"] == "FAILED" and j, 30,
                   what="the job to fail")
    assert job["status"]["exitCode"] == 3 and job["time"]["limit"] == 3600  # seconds
    meta = api.get(f"/compute/{SYS}/jobs/{jid}/metadata").json()["jobs"][0]
    assert meta["standardOutput"] == meta["standardError"] == f"{home}/slurm-{jid}.out"
    # cancelling a finished job, or one Slurm never knew: 500 with scancel's words
    r = api.delete(f"/compute/{SYS}/jobs/{jid}")
    assert r.status_code == 500 and "already completing or completed" in r.json()["message"]
    r = api.delete(f"/compute/{SYS}/jobs/999999")
    assert r.status_code == 500 and "Invalid job id specified" in r.json()["message"]
    assert api.get(f"/compute/{SYS}/jobs/999999").status_code == 404
    assert api.get(f"/compute/{SYS}/jobs/abc").status_code == 500
    # over the partition's time limit: accepted, and pending for ever — PartitionConfig
    # first (a provisional answer, as the real server gave), PartitionTimeLimit a moment later
    over = _submit(api, home, script="#!/bin/bash\n#SBATCH --time=2:00:00\n").json()["jobId"]
    job = _job(api, over)
    assert (job["status"]["state"], job["status"]["stateReason"]) == ("PENDING",
                                                                      "PartitionConfig")
    wait_for(lambda: _job(api, over)["status"]["stateReason"] == "PartitionTimeLimit", 10,
             what="Slurm's settled reason")
    assert _job(api, over)["status"]["state"] == "PENDING"
    assert api.delete(f"/compute/{SYS}/jobs/{over}").status_code == 204
    assert _job(api, over)["status"]["state"].startswith("CANCELLED by ")
    # a working folder that is not there: accepted, PENDING (Priority) until Slurm's
    # scheduler starts it, then FAILED at once (exit 0, signal 53), as beside the real server
    gone = _submit(api, f"{home}/nosuch").json()["jobId"]
    job = _job(api, gone)
    assert (job["status"]["state"], job["status"]["stateReason"],
            job["status"]["exitCode"]) == ("PENDING", "Priority", None), job["status"]
    job = wait_for(lambda: (j := _job(api, gone))["status"]["state"] != "PENDING" and j, 10,
                   what="the job without a folder to fail")
    assert job["status"]["state"] == "FAILED" and job["status"]["interruptSignal"] == 53


def test_a_job_waits_for_the_scheduler_and_reads_exit_0_while_running(api, home):
    """Beside the real server (scripts/firecrest_beside.py): a new job is PENDING with
    reason ``None`` for a second or two (squeue's record: no exit code, signal or
    suspended time, no steps); running it is sacct's record, which wins for every state
    but PENDING (slurm_cli_client.py: "sacct has precedence") — exit code 0 and signal 0
    *while it runs*, and its batch step; ended, the step as sacct lists it, ``cluster``
    Slurm's ClusterName (not the system's name)."""
    jid = _submit(api, home, script="#!/bin/bash\nsleep 2\nexit 4\n").json()["jobId"]
    first = _job(api, jid)
    assert (first["status"], first["tasks"], first["time"]["suspended"]) == (
        {"state": "PENDING", "stateReason": "None", "exitCode": None, "interruptSignal": None},
        [], None), first
    running = wait_for(lambda: (j := _job(api, jid))["status"]["state"] == "RUNNING" and j,
                       10, what="the job to run")
    assert (running["status"]["exitCode"], running["status"]["interruptSignal"]) == (0, 0)
    assert running["time"]["suspended"] == 0
    assert [(t["id"], t["name"], t["status"]["state"], t["time"]["limit"])
            for t in running["tasks"]] == [(f"{jid}.batch", "batch", "RUNNING", None)]
    done = wait_for(lambda: (j := _job(api, jid))["status"]["state"] == "FAILED" and j, 20,
                    what="the job to end")
    assert done["status"]["exitCode"] == 4 and done["cluster"] not in ("", SYS)
    step = done["tasks"][0]
    assert (step["id"], step["status"]) == (f"{jid}.batch", {
        "state": "FAILED", "stateReason": None, "exitCode": 4, "interruptSignal": 0})
    assert step["time"]["end"] >= step["time"]["start"] and step["time"]["elapsed"] >= 1
    # a cancel ends the batch step by signal 15
    jid = _submit(api, home, script="#!/bin/bash\nsleep 30\n").json()["jobId"]
    wait_for(lambda: _job(api, jid)["status"]["state"] == "RUNNING", 10, what="a run")
    assert api.delete(f"/compute/{SYS}/jobs/{jid}").status_code == 204
    job = wait_for(lambda: (j := _job(api, jid))["status"]["state"].startswith("CANCELLED")
                   and j, 10, what="the cancel")
    assert job["tasks"][0]["status"]["state"] == "CANCELLED"
    assert job["tasks"][0]["status"]["interruptSignal"] == 15


def test_the_backend_reads_a_running_job_with_exit_0_as_running(make_client,
                                                                backend_configs, firecrest):
    """sacct's exit code 0 of a running job is no result: the backend says running, and
    the job's own exit code only once it has ended."""
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": config}, secrets)
    info = client.submit(build_spec(command="sh -c 'sleep 3; exit 5'"), "firecrest")
    seen = wait_for(lambda: (i := client.get(info.id)).state != "queued" and i, 30,
                    what="the job to leave the queue")
    assert seen.state == "running", seen
    done = client.wait(info.id, 60)
    assert done.state == "failed" and done.exit_code == 5, (done.reason, client.logs(info.id).text)


def test_status_answers_as_the_real_server_words_them(api, home, firecrest):
    """userinfo lists the accounts the user is associated with (sacctmgr, with the
    default marked); the staged transfer's settings are camel case with the keys
    masked; no token is FastAPI's "Not authenticated"; scancel refuses an id that is not
    one; an unknown #SBATCH option is quoted without its value; mkdir names the whole
    path; listings name the file's Unix owner; stat of nothing says statx (all seen
    beside the real server, scripts/firecrest_beside.py)."""
    info = api.get(f"/status/{SYS}/userinfo").json()
    assert info["accounts"] == [{"name": "default", "default": True}]
    transfer = api.get("/status/systems").json()["systems"][0]["dataOperation"][
        "data_transfer"]
    assert transfer["serviceType"] == "s3" and transfer["publicUrl"]
    assert {transfer[k] for k in ("privateUrl", "accessKeyId", "secretAccessKey")} == {
        "**********"}
    assert transfer["multipart"]["max_part_size"] > 0
    assert "service_type" not in transfer and "public_url" not in transfer
    r = httpx.get(f"{firecrest.url}/status/{SYS}/userinfo")
    assert (r.status_code, r.json()["message"]) == (401, "Not authenticated")
    r = api.delete(f"/compute/{SYS}/jobs/abc")
    assert r.status_code == 500 and r.json()["message"].endswith(
        "std_err:scancel: error: Invalid job id abc\n"), r.json()
    assert "exit_status:1" in r.json()["message"]
    r = _submit(api, home, script="#!/bin/bash\n#SBATCH --bogus=1\n")
    assert "unrecognized option '--bogus'\n" in r.json()["message"], r.json()
    made = api.post(f"/filesystem/{SYS}/ops/mkdir",
                    json={"path": f"{home}/named/here", "parent": True}).json()["output"]
    assert made["name"] == f"{home}/named/here"
    st = Path(home).stat()
    listed = api.get(f"/filesystem/{SYS}/ops/ls", params={"path": home}).json()["output"]
    mine = next(e for e in listed if e["name"] == "named")
    assert (mine["user"], mine["group"]) == (pwd.getpwuid(st.st_uid).pw_name,
                                             grp.getgrgid(st.st_gid).gr_name)
    r = api.get(f"/filesystem/{SYS}/ops/stat", params={"path": f"{home}/nosuch"})
    assert r.status_code == 404 and "stat: cannot statx" in r.json()["message"]


def test_arrays_as_firecrest_shows_them(api, home):
    """``#SBATCH --array=0-3%2`` goes to sbatch as is; GET /jobs (sacct and squeue
    without --array/-r) lists started tasks as ``<id>_<i>`` and the pending rest as ONE
    entry under the bare id ``<id>`` (squeue's raw id); ``GET /jobs/<id>`` shows the
    combined ``<id>_[2-3%2]`` — from about a second after submit, before which only the
    bare id; ``123_4`` in the path is a 400 validation error (compute/router.py:
    ``job_id`` has ``pattern="^[a-zA-Z0-9]+$"``); ``scancel <id>`` ends every task.  Seen
    on the real FirecREST v2 run beside the emulator (scripts/firecrest_beside.py)."""
    Path(home).mkdir(parents=True, exist_ok=True)  # the site makes <mount>/<user>
    script = "#!/bin/bash\n#SBATCH --array=0-3%2\n#SBATCH --output=%a.out\nsleep 30\n"
    t0 = time.monotonic()
    jid = _submit(api, home, script=script).json()["jobId"]
    first = [j["jobId"] for j in api.get(f"/compute/{SYS}/jobs/{jid}").json()["jobs"]]
    if time.monotonic() - t0 < 0.8:  # not split yet: the waiting tasks under the bare id
        assert jid in first and not [x for x in first if "[" in x], first

    def listed():
        return {j["jobId"]: (j["status"]["state"], j["status"]["stateReason"])
                for j in api.get(f"/compute/{SYS}/jobs").json()["jobs"]
                if j["jobId"].split("_")[0] == jid}

    def both_running():  # one scheduling pass starts both; whose process is up first varies
        x = listed()
        return all(x.get(f"{jid}_{i}", ("",))[0] == "RUNNING" for i in (0, 1)) and x

    seen = wait_for(both_running, 30, what="two tasks running")
    assert seen == {f"{jid}_0": ("RUNNING", "None"), f"{jid}_1": ("RUNNING", "None"),
                    jid: ("PENDING", "JobArrayTaskLimit")}, seen
    def split():  # GET /jobs/<id>: the combined form, about a second after submit
        x = [j["jobId"] for j in api.get(f"/compute/{SYS}/jobs/{jid}").json()["jobs"]]
        return any("[" in i for i in x) and x

    one = wait_for(split, 10, what="the array split")
    assert one == [f"{jid}_0", f"{jid}_1", f"{jid}_[2-3%2]"], one
    task = f"/compute/{SYS}/jobs/{jid}_1"
    for r in (api.get(task), api.delete(task)):
        body = r.json()
        assert r.status_code == 400 and body["errorType"] == "validation", body
        assert body["data"]["fields"][0]["name"] == "job_id", body
    assert len(api.get(f"/compute/{SYS}/jobs/{jid}").json()["jobs"]) == 3  # the array
    assert api.delete(f"/compute/{SYS}/jobs/{jid}").status_code == 204

    def all_cancelled():
        now = listed()
        return all(v[0].startswith("CANCELLED") for v in now.values()) and now

    done = wait_for(all_cancelled, 15, what="every task cancelled")
    assert set(done) == {f"{jid}_0", f"{jid}_1", jid}, done


def test_tokens_with_less_than_30_s_left_are_refused(firecrest, make_client,
                                                     backend_configs, notebooks):
    firecrest.faults(token_ttl=20)
    tok = httpx.post(firecrest.info["token_uri"], data={
        "grant_type": "client_credentials", "client_id": "cloudtik",
        "client_secret": CLIENT_SECRET}).json()["access_token"]
    r = httpx.get(f"{firecrest.url}/status/{SYS}/partitions",
                  headers={"Authorization": f"Bearer {tok}"})
    assert (r.status_code, r.json()["message"]) == (
        401, "Access token expires too soon (less than 30s remaining).")
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": config}, secrets)
    with pytest.raises(ProviderError, match="expires too soon"):
        client.submit(build_spec(str(notebooks["param"])), "firecrest")
    # 60 s tokens work: the backend renews them 45 s before they expire
    firecrest.faults(token_ttl=60)
    client2 = make_client({"f7t2": config}, {("f7t2", "client_secret"): CLIENT_SECRET})
    info = client2.wait(client2.submit(build_spec(command="echo hi"), "f7t2").id, 60)
    assert info.state == "succeeded", info.reason


def test_default_work_folder_is_the_users_own(make_client, backend_configs, firecrest,
                                              notebooks):
    config, secrets = backend_configs["firecrest"]()
    config.pop("workdir")
    client = make_client({"firecrest": config}, secrets)
    backend = client.manager.backend("firecrest")
    assert backend.workdir == f"{firecrest.info['root']}/{F7T_USER}/cloudtik-jobs"
    info = client.wait(client.submit(build_spec(str(notebooks["param"]),
                                                inputs=[str(notebooks["data"])]),
                                     "firecrest").id, 120)
    assert info.state == "succeeded", info.reason
    # the mount itself is not writable: the user is told, and what to set
    bad = dict(config, workdir=f"{firecrest.info['root']}/cloudtik-jobs")
    client2 = make_client({"bad": bad}, {("bad", "client_secret"): CLIENT_SECRET})
    info = client2.submit(build_spec(command="echo hi"), "bad")
    assert info.state == "failed" and info.native_id is None, info
    assert re.search(r"Permission denied.*set backends\.bad\.workdir", info.reason), info


def test_a_refused_submit_fails_at_once_with_slurms_message(make_client, backend_configs,
                                                            firecrest):
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": config}, secrets)
    before = len([r for r in firecrest.requests() if r["method"] == "POST"
                  and r["path"] == f"/compute/{SYS}/jobs"])
    info = client.submit(build_spec(command="echo hi", memory="100G"), "firecrest")
    assert info.state == "failed", info
    assert "Slurm refused the job: sbatch: error: Memory specification can not be " \
        "satisfied" in info.reason
    time.sleep(1.5)  # no retry comes, and nothing is adopted
    posts = [r for r in firecrest.requests() if r["method"] == "POST"
             and r["path"] == f"/compute/{SYS}/jobs"]
    assert len(posts) - before == 1
    jobs = client.list()
    assert [(j.state, j.native_id) for j in jobs] == [("failed", None)], jobs
    assert "Requested node configuration is not available" in jobs[0].reason


def test_a_job_slurm_never_starts_is_failed_not_left_pending(make_client, backend_configs,
                                                             firecrest):
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": config}, secrets)
    info = client.submit(build_spec(command="echo hi", time="2h"), "firecrest")
    info = client.wait(info.id, 30)
    assert info.state == "failed" and "PartitionTimeLimit" in info.reason, info
    # the final message names the job's time limit and the partition
    assert "its time limit 02:00:00 is longer than partition 'normal' allows" in \
        info.reason, info
    # the first answer (PartitionConfig) was shown as provisional, not taken for the end
    assert "PartitionConfig" not in info.reason, info
    assert any("pending: PartitionConfig (may change" in (e.message or "")
               for e in client.events(info.id)), client.events(info.id)
    # ...and it is cancelled on the system, not left in the queue
    backend = client.manager.backend("firecrest")
    st = backend._call("job_info", SYS, info.native_id)[0]["status"]["state"]
    assert st.startswith("CANCELLED")
    # with the limit in the config, it is refused before anything is submitted
    limited = dict(config, limits={"max_time": "1h"})
    client2 = make_client({"lim": limited}, {("lim", "client_secret"): CLIENT_SECRET})
    with pytest.raises(CapacityError, match="time: 02:00:00 is longer than"):
        client2.submit(build_spec(command="echo hi", time="2h"), "lim")


def test_cancelling_a_finished_job_is_done(make_client, backend_configs, firecrest):
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": config}, secrets)
    info = client.wait(client.submit(build_spec(command="true"), "firecrest").id, 60)
    assert info.state == "succeeded", info.reason
    backend = client.manager.backend("firecrest")
    backend.cancel(JobRef(info.id, info.native_id))  # the server answers 500; that is fine
    backend.cancel(JobRef(info.id, "999999"))


def test_slurm_down_is_try_again_not_a_refusal(make_client, backend_configs, firecrest, api,
                                               home):
    """sbatch's "Unable to contact slurm controller" also comes as a 500 with Slurm's text:
    that one means later, not no."""
    firecrest.admin("slurm", {"down": True})
    r = _submit(api, home)
    assert r.status_code == 500 and "Unable to contact slurm controller" in \
        r.json()["message"]
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": config}, secrets)
    info = client.submit(build_spec(command="echo back"), "firecrest")
    assert info.state == "unknown" and info.native_id is None, info
    firecrest.admin("slurm", {"down": False})
    info = client.wait(info.id, 60)
    assert info.state == "succeeded", info.reason


@pytest.mark.parametrize("route,size", [("/ops/upload$", 1000),
                                        ("^/s3/", 6 * 1024 * 1024 + 5)])
def test_a_broken_off_upload_is_done_again_on_retry(route, size, make_client,
                                                    backend_configs, firecrest, tmp_path):
    """The connection breaks during an upload (direct, or a part of a staged one): the
    submit is tried again from the start and the job runs once, with the whole file."""
    data = tmp_path / "data.bin"
    data.write_bytes(b"y" * size)
    firecrest.faults(fail=[{"method": "PUT" if route.startswith("^/s3") else "POST",
                            "path": route, "status": 503, "count": 1}])
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": config}, secrets)
    info = client.submit(build_spec(command="wc -c data.bin", inputs=[str(data)]),
                         "firecrest")
    info = client.wait(info.id, 120)
    assert info.state == "succeeded", info.reason
    assert f"{size} data.bin" in client.logs(info.id).text
    posts = [r for r in firecrest.requests() if r["method"] == "POST"
             and r["path"] == f"/compute/{SYS}/jobs"]
    assert len([r for r in posts if r["t"] >= info.created_at]) >= 1
    assert client.manager._row(info.id)["submit_attempts"] >= 2


def test_without_a_staged_transfer_files_over_the_limit_are_refused_first(
        make_client, tmp_path, tmp_path_factory):
    """A FirecREST with no ``data_transfer`` answers 500 to /transfer/*: files under its
    5 MiB direct limit (over pyfirecrest's own 1 MiB) go directly; bigger ones are refused
    before anything is uploaded, with what to do instead."""
    from .conftest import Service

    svc = Service("cloudtik_emulators.firecrest", tmp_path_factory.mktemp("f7t-nos3"),
                  ["--system", SYS, "--no-staging"]).start()
    try:
        config = {"type": "firecrest", "url": svc.url, "token_uri": svc.info["token_uri"],
                  "client_id": "cloudtik", "system": SYS, **SITE_PYTHON}
        client = make_client({"nos3": config}, {("nos3", "client_secret"): CLIENT_SECRET})
        mid = tmp_path / "mid.bin"
        mid.write_bytes(b"m" * (2 * 1024 * 1024))
        info = client.wait(client.submit(build_spec(command="wc -c mid.bin",
                                                    inputs=[str(mid)]), "nos3").id, 60)
        assert info.state == "succeeded", info.reason
        assert f"{2 * 1024 * 1024} mid.bin" in client.logs(info.id).text
        big = tmp_path / "big.bin"
        big.write_bytes(b"b" * (5 * 1024 * 1024))
        info = client.submit(build_spec(command="wc -c big.bin", inputs=[str(big)]), "nos3")
        assert info.state == "failed" and "offers no staged transfer" in info.reason, info
        assert not any(r["path"].startswith(f"/filesystem/{SYS}/transfer")
                       for r in svc.requests())
    finally:
        svc.stop()


def test_a_provisional_reason_keeps_the_job_queued(make_client, backend_configs, firecrest,
                                                   api, home):
    """More CPUs per node than a node has: the real server left the job pending.  The
    backend shows PartitionConfig as provisional and keeps the job queued; it does not
    cancel it (Slurm's reason may still change)."""
    jid = _submit(api, home, script="#!/bin/bash\n#SBATCH --cpus-per-task=4\n"
                  ).json()["jobId"]
    time.sleep(1.1)  # past the emulator's provisional second: this reason stays
    assert _job(api, jid)["status"]["stateReason"] == "PartitionConfig"
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": config}, secrets)
    backend = client.manager.backend("firecrest")
    st = backend.poll([JobRef("x", jid)])[jid]
    assert (st.state, st.native_state) == ("queued", "PENDING"), st
    assert st.message.startswith("pending: PartitionConfig (may change"), st
    assert _job(api, jid)["status"]["state"] == "PENDING"  # not cancelled
    assert api.delete(f"/compute/{SYS}/jobs/{jid}").status_code == 204


def test_a_partition_config_that_lasts_is_final(make_client, backend_configs, firecrest,
                                                api, home):
    """More CPUs than the partition has: Slurm's scheduler keeps PartitionConfig for good
    (job_limits_check: ESLURM_TOO_MANY_REQUESTED_CPUS has no reason of its own).  Once
    the reason has lasted ``settle_time``, the backend applies its never-starts rule:
    the job is cancelled and failed, and the message says why and for how long."""
    jid = _submit(api, home, script="#!/bin/bash\n#SBATCH --cpus-per-task=4\n"
                  ).json()["jobId"]
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": dict(config, settle_time=1.5)}, secrets)
    backend = client.manager.backend("firecrest")
    first = backend.poll([JobRef("x", jid)])[jid]
    assert first.state == "queued" and first.message.startswith(
        "pending: PartitionConfig (may change"), first
    time.sleep(0.5)
    assert backend.poll([JobRef("x", jid)])[jid].state == "queued"  # not settled yet
    time.sleep(1.2)
    st = backend.poll([JobRef("x", jid)])[jid]
    assert (st.state, st.native_state) == ("failed", "PENDING"), st
    assert st.message.startswith("Slurm will never start it: PartitionConfig (the "
                                 "partition cannot take the job as asked: more CPUs"), st
    assert re.search(r"; Slurm kept this reason for \d+ s\)$", st.message), st
    assert "\n" not in st.message
    assert _job(api, jid)["status"]["state"].startswith("CANCELLED")


def test_cpus_and_nodes_over_the_partition_as_slurm_decides(tmp_path_factory):
    """Slurm on a partition of two 2-CPU nodes (EnforcePartLimits=NO): more CPUs than the
    whole partition is PENDING PartitionConfig for good (_part_access_check:
    ESLURM_TOO_MANY_REQUESTED_CPUS, which job_limits_check makes WAIT_PART_CONFIG); more
    per node than a node has but within the partition is refused by sbatch (no node fits:
    ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE); more nodes than it has is PartitionConfig
    at first (the submit's answer) and PartitionNodeLimit once the scheduler has looked
    (job_limits_check: ESLURM_INVALID_NODE_COUNT)."""
    from .conftest import Service

    svc = Service("cloudtik_emulators.firecrest", tmp_path_factory.mktemp("f7t-2n"),
                  ["--system", SYS, "--partitions", json.dumps(
                      {"two": {"max_time": 3600, "cpus": 2, "nodes": 2, "default": True}})]
                  ).start()
    try:
        tok = httpx.post(svc.info["token_uri"], data={
            "grant_type": "client_credentials", "client_id": "cloudtik",
            "client_secret": CLIENT_SECRET}).json()["access_token"]
        home = f"{svc.info['root']}/{F7T_USER}"
        with httpx.Client(base_url=svc.url, timeout=30,
                          headers={"Authorization": f"Bearer {tok}"}) as api:
            Path(home).mkdir(exist_ok=True)
            r = _submit(api, home, script="#!/bin/bash\n#SBATCH --cpus-per-task=3\n")
            assert r.status_code == 500, r.text
            assert "Batch job submission failed: Requested node configuration is not " \
                "available" in r.json()["message"]
            wide = _submit(api, home, script="#!/bin/bash\n#SBATCH --nodes=2\n"
                           "#SBATCH --cpus-per-task=3\n").json()["jobId"]
            many = _submit(api, home, script="#!/bin/bash\n#SBATCH --nodes=3\n"
                           ).json()["jobId"]
            assert _job(api, many)["status"]["stateReason"] == "PartitionConfig"
            time.sleep(1.1)
            assert (_job(api, wide)["status"]["state"],
                    _job(api, wide)["status"]["stateReason"]) == ("PENDING",
                                                                  "PartitionConfig")
            assert (_job(api, many)["status"]["state"],
                    _job(api, many)["status"]["stateReason"]) == ("PENDING",
                                                                  "PartitionNodeLimit")
    finally:
        svc.stop()


def test_system_names_match_in_any_case(make_client, backend_configs, firecrest, api):
    """The real server takes "TestSys" for its "testsys"; the backend uses the server's
    spelling in its calls."""
    assert api.get("/status/TestSys/partitions").status_code == 200
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": dict(config, system="TestSys")}, secrets)
    start = time.time()
    info = client.wait(client.submit(build_spec(command="echo hi"), "firecrest").id, 60)
    assert info.state == "succeeded", info.reason
    paths = [r["path"] for r in firecrest.requests() if r["t"] >= start]
    assert any(f"/{SYS}/" in p for p in paths), paths
    assert not any("/TestSys/" in p for p in paths), paths


def test_an_unknown_account_is_refused_in_one_line_naming_it(make_client, backend_configs,
                                                             firecrest, api, home):
    """The real server answers 500 for an account Slurm's accounting does not know: a
    refusal (not an outage), told in one line with the account's name."""
    r = _submit(api, home, account="nosuch")
    assert r.status_code == 500 and "Invalid account" in r.json()["message"]
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": config}, secrets)
    info = client.submit(build_spec(command="echo hi", account="nosuch"), "firecrest")
    assert info.state == "failed" and info.native_id is None, info
    assert "refused account 'nosuch'" in info.reason and "\n" not in info.reason, info
    assert "Invalid account" in info.reason, info
    # ...and names the accounts the user may charge (userinfo's sacctmgr associations)
    assert info.reason.endswith("; you may charge: default (default)"), info.reason


def test_an_unknown_account_of_a_transfer_job_is_refused_in_one_line(
        make_client, backend_configs, firecrest, tmp_path):
    """A file over the direct limit goes through a transfer job, which FirecREST submits
    with the backend's account: an account Slurm does not know is the same 500 with
    sbatch's words there, and the same one line naming it (not an outage, no retry)."""
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": dict(config, account="nosuch")}, secrets)
    big = tmp_path / "big.bin"
    big.write_bytes(b"b" * (5 * 1024 * 1024))
    start = time.time()
    info = client.submit(build_spec(command="wc -c big.bin", inputs=[str(big)]),
                         "firecrest")
    assert info.state == "failed" and info.native_id is None, info
    assert "refused account 'nosuch'" in info.reason and "\n" not in info.reason, info
    assert "Invalid account" in info.reason, info
    reqs = [r for r in firecrest.requests() if r["t"] >= start]
    transfers = [r for r in reqs if r["path"] == f"/filesystem/{SYS}/transfer/upload"]
    assert len(transfers) == 1, [r["path"] for r in reqs]  # refused once, not retried
    assert not any(r["path"] == f"/compute/{SYS}/jobs" for r in reqs)


def test_viewing_a_whole_file_over_the_limit(make_client, backend_configs, firecrest, api,
                                             home):
    """``view`` without ``size`` of a file over the direct limit is a 413 on the real
    server; the backend reads such a file through the transfer path."""
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": config}, secrets)
    backend = client.manager.backend("firecrest")
    folder = Path(backend.folder("bigjob"))
    (folder / ".cloudtik").mkdir(parents=True)
    names = [f"input-{i:07d}" for i in range(600_000)]  # 8.4 MB of input names
    (folder / ".cloudtik" / "inputs").write_text("\n".join(names) + "\n")
    (folder / "result.txt").write_text("r\n")
    (folder / "input-0000001").write_text("i\n")
    r = api.get(f"/filesystem/{SYS}/ops/view",
                params={"path": str(folder / ".cloudtik" / "inputs")})
    assert r.status_code == 413, r.text[:200]
    assert api.get(f"/filesystem/{SYS}/ops/view", params={
        "path": str(folder / ".cloudtik" / "inputs"), "size": 100}).status_code == 200
    start = time.time()
    outputs = backend.list_outputs(JobRef("bigjob", "1"))
    assert [o.name for o in outputs] == ["result.txt"], outputs
    assert any(r["path"] == f"/filesystem/{SYS}/transfer/download"
               for r in firecrest.requests() if r["t"] >= start)


def test_view_answers_413_when_its_two_blocks_reach_the_limit(api, home, firecrest):
    """FirecREST's view runs ``dd bs=size skip=offset/size count=2`` (DdCommand) and its
    SSH reader stops at ``max_ops_file_size`` (5 MiB): an output that reaches it is
    OutputLimitExceeded, 413 (SSHClient.execute).  ``size`` defaults to 5 MiB and may not
    be over the limit (400, ops/router.py get_view)."""
    limit = 5 * 1024 * 1024
    f = Path(home) / "viewme.bin"
    f.write_bytes(b"v" * limit)  # exactly the limit: the output reaches it
    view = f"/filesystem/{SYS}/ops/view"
    r = api.get(view, params={"path": str(f)})
    assert (r.status_code, r.json()["message"]) == (413, "Command output exceeded buffer "
                                                         "limit."), r.text[:200]
    f.write_bytes(b"v" * (limit - 1))  # one byte less: the whole file comes back
    assert len(api.get(view, params={"path": str(f)}).json()["output"]) == limit - 1
    f.write_bytes(b"v" * (6 * 1024 * 1024))
    # a size of its own does not help when two blocks of it reach the limit...
    assert api.get(view, params={"path": str(f), "size": limit // 2}).status_code == 413
    # ...two blocks under it do; the answer is one block from the offset
    r = api.get(view, params={"path": str(f), "size": (limit - 1) // 2, "offset": 7})
    assert r.status_code == 200 and len(r.json()["output"]) == (limit - 1) // 2
    assert api.get(view, params={"path": str(f), "size": limit + 1}).status_code == 400


def test_the_backend_never_asks_view_for_more_than_it_may_answer(
        make_client, backend_configs, firecrest):
    """Every ``view`` the backend sends (a job's small files, its log) asks for at most
    half the limit, so its two blocks stay under it: no 413 to recover from."""
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": config}, secrets)
    backend = client.manager.backend("firecrest")
    folder = Path(backend.folder("viewjob"))
    (folder / ".cloudtik").mkdir(parents=True)
    (folder / ".cloudtik" / "inputs").write_text("a.txt\n")
    (folder / ".cloudtik" / "exitcode").write_text("0\n")
    (folder / "result.txt").write_text("r\n")
    (folder / "a.txt").write_text("a\n")
    start = time.time()
    assert [o.name for o in backend.list_outputs(JobRef("viewjob", "1"))] == ["result.txt"]
    assert backend._forgotten(JobRef("viewjob", "1")).state == "succeeded"
    views = [r for r in firecrest.requests()
             if r["t"] >= start and r["path"] == f"/filesystem/{SYS}/ops/view"]
    assert len(views) == 2, views
    sizes = [int(dict(re.findall(r"(\w+)=([^&]*)", v["query"])).get("size", 0) or 0)
             for v in views]
    assert all(0 < n <= (5 * 1024 * 1024 - 1) // 2 for n in sizes), views


def test_logs_read_in_bytes_though_view_cuts_in_characters(make_client, backend_configs,
                                                           firecrest):
    """The real view decodes dd's output and cuts it in characters
    (DdCommand.parse_output), so an offset inside a block counts characters: the
    backend reads aligned blocks and keeps its offsets in bytes, characters cut at a
    block's end included."""
    from jupyter_cloudtik.hpc import script

    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": config}, secrets)
    backend = client.manager.backend("firecrest")
    folder = Path(backend.folder("logjob"))
    folder.mkdir(parents=True)
    text = "".join(f"{i} ünïcødé → ✓ 🚀\n" for i in range(40))
    (folder / script.LOG_NAME).write_text(text)
    got, offset = "", 0
    for _ in range(1000):
        chunk = backend.logs(JobRef("logjob", "1"), offset, limit=13)
        got, offset = got + chunk.text, chunk.offset
        if chunk.eof:
            break
    assert got == text
    assert offset == len(text.encode())


def test_direct_downloads_stop_where_their_base64_reaches_the_limit(
        make_client, backend_configs, firecrest, api, home):
    """FirecREST sends a direct download as ``base64`` over SSH (get_download,
    Base64Command): 4 bytes per 3 of the file, and an output reaching
    ``max_ops_file_size`` is a 413.  The backend sends a 4 MiB file (under the limit,
    over 3/4 of it) through the staged transfer instead."""
    four = Path(home) / "four.bin"
    four.write_bytes(bytes(range(256)) * (4 * 1024 * 4))  # 4 MiB
    r = api.get(f"/filesystem/{SYS}/ops/download", params={"path": str(four)})
    assert (r.status_code, r.json()["message"]) == (413, "Command output exceeded buffer "
                                                         "limit.")
    small = Path(home) / "small.bin"
    small.write_bytes(b"s" * (3 * 1024 * 1024))  # its base64 is 4 MiB: direct
    assert api.get(f"/filesystem/{SYS}/ops/download",
                   params={"path": str(small)}).status_code == 200
    config, secrets = backend_configs["firecrest"]()
    client = make_client({"firecrest": config}, secrets)
    backend = client.manager.backend("firecrest")
    folder = Path(backend.folder("dljob"))
    folder.mkdir(parents=True)
    (folder / "four.bin").write_bytes(four.read_bytes())
    start = time.time()
    assert backend.read_file(JobRef("dljob", "1"), "four.bin") == four.read_bytes()
    reqs = [r["path"] for r in firecrest.requests() if r["t"] >= start]
    assert f"/filesystem/{SYS}/transfer/download" in reqs, reqs
    assert f"/filesystem/{SYS}/ops/download" not in reqs, reqs
