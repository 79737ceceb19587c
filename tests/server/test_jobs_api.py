"""HPC job routes against a real JupyterLab: shapes validated against openapi.yaml, the
whole life of a job, bad input named by field, cancel."""

from __future__ import annotations

import base64
import json
import sys
import time

import pytest

from .conftest import checked


def _nb(*cells) -> dict:
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                        "language": "python"}},
            "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {"tags": tags},
                       "execution_count": None, "outputs": [], "source": src}
                      for i, (src, tags) in enumerate(cells)]}


PARAM = _nb(("factor = 1", ["parameters"]),
            ("value = int(open('data.txt').read())\nprint('result', value * factor)\n"
             "open('result.txt', 'w').write(str(value * factor))", []))
LONG = _nb(("import time\nprint('sleeping', flush=True)\ntime.sleep(300)", []))


@pytest.fixture(scope="module")
def job_files(lab):
    d = lab.root / "jobs-api"
    d.mkdir(exist_ok=True)
    (d / "param.ipynb").write_text(json.dumps(PARAM))
    (d / "long.ipynb").write_text(json.dumps(LONG))
    (d / "data.txt").write_text("6\n")
    return d


def wait_job(lab, job_id: str, states=("succeeded", "failed", "cancelled"),
             timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = lab.get(f"jobs/{job_id}").json()
        if job["state"] in states:
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not reach {states}: {job}")


def test_job_life_cycle_over_rest(lab, spec_checker, job_files):
    backends = checked(spec_checker, lab.get("hpc/backends")).json()
    assert backends["default_backend"] == "local"
    assert {"local", "dask"} <= {b["name"] for b in backends["backends"]}

    resp = checked(spec_checker, lab.request("POST", "jobs", json={
        "notebook": "jobs-api/param.ipynb", "parameters": {"factor": 3},
        "inputs": ["jobs-api/data.txt"], "time": "10m"}))
    assert resp.status_code == 202, resp.text
    job = resp.json()["job"]
    assert resp.headers["Location"].endswith(f"/cloudtik/api/jobs/{job['id']}")
    assert job["state"] in ("submitting", "queued", "running")
    assert job["notebook"] == str(job_files / "param.ipynb")  # relative to the root folder
    assert resp.json()["operation"]["kind"] == "hpc.job"

    job = wait_job(lab, job["id"])
    assert job["state"] == "succeeded", job["reason"]
    checked(spec_checker, lab.get(f"jobs/{job['id']}"))
    checked(spec_checker, lab.get(f"jobs/{job['id'][:5]}"))  # a unique beginning is enough
    listing = checked(spec_checker, lab.get("jobs")).json()["jobs"]
    assert job["id"] in [j["id"] for j in listing]

    logs = checked(spec_checker, lab.get(f"jobs/{job['id']}/logs")).json()
    assert "result 18" in logs["text"] and logs["done"]
    more = checked(spec_checker, lab.get(f"jobs/{job['id']}/logs",
                                         params={"offset": logs["offset"]})).json()
    assert more["text"] == "" and more["offset"] == logs["offset"]

    outputs = checked(spec_checker, lab.get(f"jobs/{job['id']}/outputs")).json()
    assert {o["name"] for o in outputs["outputs"]} == {"param.out.ipynb", "result.txt"}
    raw = lab.get(f"jobs/{job['id']}/files/result.txt")
    assert raw.status_code == 200 and raw.content == b"18"

    fetched = checked(spec_checker, lab.request("POST", f"jobs/{job['id']}/fetch",
                                                json={})).json()
    assert fetched["dest"] == f"hpc-jobs/{job['id']}"
    assert fetched["output_notebook"] == f"hpc-jobs/{job['id']}/param.out.ipynb"
    assert (lab.root / "hpc-jobs" / job["id"] / "result.txt").read_text() == "18"
    # the executed notebook is a real notebook the contents API serves
    nb = lab.session.get(lab.url + "api/contents/" + fetched["output_notebook"],
                         headers=lab.headers()).json()
    assert "result 18" in json.dumps(nb["content"])

    events = lab.get(f"operations/{job['op_id']}/events").json()["events"]
    assert [e["step"] for e in events][-1] == "succeeded"
    assert lab.get("operations/" + job["op_id"]).json()["owner_pid"] == lab.proc.pid


def test_bad_job_requests_name_the_field(lab, spec_checker, job_files):
    cases = [
        ({"notebook": "jobs-api/param.ipynb", "backend": "nope"}, 400, "backend"),
        ({"notebook": "jobs-api/missing.ipynb"}, 404, "notebook"),
        ({"notebook": "jobs-api/param.ipynb", "cpus": 4096}, 409, "cpus"),
        ({"notebook": "jobs-api/param.ipynb", "nodes": 0}, 400, "nodes"),
        ({"notebook": "jobs-api/param.ipynb", "time": "soon"}, 400, "time"),
        ({"notebook": "jobs-api/param.ipynb", "command": ["true"]}, 400, "command"),
        ({"notebook": "jobs-api/param.ipynb", "inputs": ["jobs-api/absent.csv"]}, 404,
         "inputs"),
        ({"notebook": "jobs-api/param.ipynb", "surprise": 1}, 400, "body"),
        # parameters the notebook cannot receive (papermill would run it without them)
        ({"notebook": "jobs-api/param.ipynb", "parameters": {"alpha": 2}}, 400,
         "parameters.alpha"),
        ({"notebook": "jobs-api/long.ipynb", "parameters": {"seconds": 1}}, 400,
         "parameters.seconds"),
        ({"command": ["true"], "parameters": {"n": 1}}, 400, "parameters.n"),
        ({}, 400, "notebook"),
    ]
    before = len(lab.get("jobs").json()["jobs"])
    for body, status, field in cases:
        resp = checked(spec_checker, lab.request("POST", "jobs", json=body))
        assert resp.status_code == status, (body, resp.text)
        assert resp.json()["field"] == field, (body, resp.json())
        assert "Traceback" not in resp.text
    assert len(lab.get("jobs").json()["jobs"]) == before  # nothing was recorded
    assert checked(spec_checker, lab.get("jobs/feedbeef0")).status_code == 404
    assert lab.get("jobs/feedbeef0/logs").json()["reason"] == "not_found"


def test_parameters_the_notebook_cannot_receive_over_rest(lab, spec_checker, job_files):
    resp = lab.request("POST", "jobs", json={"notebook": "jobs-api/param.ipynb",
                                             "parameters": {"factor": 2, "alpha": 2}})
    assert resp.status_code == 400
    assert resp.json()["message"] == (
        "parameters.alpha: alpha=2 is not a parameter of 'param.ipynb'; its cell tagged "
        "`parameters` assigns: factor (or pass --allow-unknown-parameters "
        "(allow_unknown_parameters: true) to inject it anyway)")
    resp = checked(spec_checker, lab.request("POST", "jobs", json={
        "notebook": "jobs-api/param.ipynb", "parameters": {"factor": 2, "alpha": 2},
        "inputs": ["jobs-api/data.txt"], "allow_unknown_parameters": True}))
    assert resp.status_code == 202, resp.text
    job = resp.json()["job"]
    assert job["warnings"] == [
        "parameters: alpha=2 is not a parameter of 'param.ipynb' (its cell tagged "
        "`parameters` assigns: factor); papermill injects it after that cell anyway"]
    job = wait_job(lab, job["id"])
    assert job["state"] == "succeeded" and job["warnings"]  # still there when it ended
    events = lab.get(f"operations/{job['op_id']}/events").json()["events"]
    assert [e["message"] for e in events if e["level"] == "warning"] == job["warnings"]

    # a notebook sent as content (how a user's server hands it to the hub's sidekick) is
    # checked the same way, before anything is written or staged
    small = json.dumps(_nb(("alpha = 1\nprint('alpha', alpha)", []))).encode()
    resp = checked(spec_checker, lab.request("POST", "jobs", json={
        "notebook": "small.ipynb", "parameters": {"alpha": 2},
        "files": {"small.ipynb": base64.b64encode(small).decode()}}))
    assert resp.status_code == 400 and resp.json()["field"] == "parameters.alpha"
    assert "'small.ipynb' has no cell tagged 'parameters'" in resp.json()["message"]
    content = lab.state_dir / "hpc" / "content"
    assert not content.exists() or not any(content.iterdir())


def test_cancel_over_rest(lab, spec_checker, job_files):
    job = lab.request("POST", "jobs", json={"notebook": "jobs-api/long.ipynb"}).json()["job"]
    wait_job(lab, job["id"], ("running",), 90)
    deadline = time.monotonic() + 60
    while "sleeping" not in lab.get(f"jobs/{job['id']}/logs").json()["text"]:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    resp = checked(spec_checker, lab.request("DELETE", f"jobs/{job['id']}"))
    assert resp.status_code == 200
    assert wait_job(lab, job["id"], timeout=60)["state"] == "cancelled"
    outside = lab.request("POST", f"jobs/{job['id']}/fetch", json={"dest": "/tmp"})
    assert outside.status_code == 403 and outside.json()["field"] == "dest"


ENV_NB = _nb(("import json, sys, importlib.metadata as md\n"
               "json.dump({'executable': sys.executable, 'toolz': md.version('toolz')},\n"
               "          open('env.json', 'w'))", []))


def _env_of(lab, job_id: str) -> dict:
    r = lab.get(f"jobs/{job_id}/files/env.json")
    assert r.status_code == 200, r.text
    return json.loads(r.content)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_requirements_over_rest_build_the_jobs_environment(lab, spec_checker, job_files,
                                                           tmp_path):
    """POST /jobs takes a requirements or lock file's contents (``requirements``): bad
    lines are a one-line 400 naming the field and the line, nothing recorded; a good one
    builds the job's environment on the (local) system with the requested package, a
    lock's --hash is checked against the wheel the session made, and the REST client of a
    kernel sends its file's contents (its wheel lines refused before anything is sent)."""
    import hashlib
    import importlib.metadata as md

    from jupyter_cloudtik.clusters.rest import RestBackend
    from jupyter_cloudtik.core.errors import ConfigError
    from jupyter_cloudtik.hpc.base import Environment, JobSpec
    from jupyter_cloudtik.hpc.rest import RestJobsClient

    (job_files / "env.ipynb").write_text(json.dumps(ENV_NB))
    toolz = md.version("toolz")
    nb = {"notebook": "jobs-api/env.ipynb", "backend": "local"}
    bad = {
        "-r other.txt\n": "requirements line 1: '-r' is a pip option",
        "# lock\ntoolz==1\n--index-url https://evil.example/simple\n":
            "requirements line 3: '--index-url' is a pip option",
        "toolz-1.0.0-py3-none-any.whl": "requirements line 1: 'toolz-1.0.0-py3-none-any.whl'"
                                        " is a file or folder of the side that sent it",
        f"{lab.state_dir}\n": "is a file or folder of the side that sent it",
        "evil @ https://evil.example/evil-1.0.tar.gz":
            "requirements line 1: 'evil @ https://evil.example/evil-1.0.tar.gz' is a direct "
            "reference (NAME @ URL)",
        "toolz===": "requirements line 1: 'toolz===' is not a requirement (",
        "requirements.txt": "requirements line 1: 'requirements.txt' is a file name; send "
                            "the file's contents",
        "# nothing but a comment\n": "requirements: no requirement in the text",
        f"toolz=={toolz} --hash=sha256:{'0' * 64}\n":
            f"requirements line 1: the session's toolz {toolz} is the wheel toolz-",
    }
    before = len(lab.get("jobs", params={"limit": 1000}).json()["jobs"])
    for text, expected in bad.items():
        r = checked(spec_checker, lab.request("POST", "jobs", json={**nb, "requirements": text}))
        assert r.status_code == 400, (text, r.text)
        assert r.json()["field"] == "requirements", (text, r.json())
        assert expected in r.json()["message"] and "\n" not in r.json()["message"], (
            text, r.json()["message"])
    r = lab.request("POST", "jobs", json={**nb, "requirements": ["toolz"]})
    assert r.status_code == 400 and r.json()["field"] == "requirements", r.text
    assert len(lab.get("jobs", params={"limit": 1000}).json()["jobs"]) == before

    # a plain requirements text: the environment is built, with the session's toolz
    r = checked(spec_checker, lab.request("POST", "jobs", json={
        **nb, "requirements": f"# the job's packages\ntoolz=={toolz}  # pinned\n"}))
    assert r.status_code == 202, r.text
    job = wait_job(lab, r.json()["job"]["id"], timeout=600)
    assert job["state"] == "succeeded", (job, lab.get(f"jobs/{job['id']}/logs").json())
    assert job["environment"]["mode"] == "built", job["environment"]
    h = job["environment"]["hash"]
    got = _env_of(lab, job["id"])
    assert got["toolz"] == toolz
    assert f"/.cloudtik-envs/{h}/" in got["executable"], got
    assert got["executable"] != sys.executable

    # a lock with the wheel's own hash (and another platform's): checked and accepted,
    # the same files, so the same environment, reused
    wheel = next((lab.state_dir / "hpc" / "wheels").glob("toolz-*.whl"))
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    lock = (f"toolz=={toolz} \\\n    --hash=sha256:{'1' * 64} \\\n"
            f"    --hash=sha256:{sha}\n    # via -r requirements.in\n"
            "pywin32==306 ; sys_platform == 'win32' \\\n"
            f"    --hash=sha256:{'2' * 64}\n")
    r = checked(spec_checker, lab.request("POST", "jobs", json={**nb, "requirements": lock}))
    assert r.status_code == 202, r.text
    again = wait_job(lab, r.json()["job"]["id"], timeout=300)
    assert again["state"] == "succeeded", again
    assert again["environment"]["hash"] == h
    assert "building environment" not in lab.get(f"jobs/{again['id']}/logs").json()["text"]

    # the kernel's REST client: the file's contents travel (the server never reads the
    # kernel's path); a wheel line in it is refused before anything is sent
    client = RestJobsClient(RestBackend(lab.api_url, lab.token))
    req = tmp_path / "requirements.txt"
    req.write_text(f"toolz=={toolz}\n")
    info = client.submit(JobSpec(notebook=str(job_files / "env.ipynb"),
                                 environment=Environment(requirements=str(req))), "local")
    done = wait_job(lab, info.id, timeout=300)
    assert done["state"] == "succeeded" and done["environment"]["hash"] == h, done
    assert _env_of(lab, info.id)["toolz"] == toolz
    req.write_text("./wheels/toolz-1.0.0-py3-none-any.whl\n")
    count = len(client.list(limit=1000))
    for call in (lambda: client.submit(JobSpec(notebook=str(job_files / "env.ipynb"),
                                               environment=Environment(requirements=str(req))),
                                       "local"),
                 lambda: client.sweep(JobSpec(notebook=str(job_files / "param.ipynb"),
                                              environment=Environment(requirements=str(req))),
                                      "local", grid={"factor": [1, 2]})):
        with pytest.raises(ConfigError) as e:
            call()
        assert e.value.field == "environment.requirements", e.value.message
        assert e.value.message.startswith(
            "environment.requirements (requirements.txt) line 1: "
            "'./wheels/toolz-1.0.0-py3-none-any.whl' is a file or folder"), e.value.message
    assert len(client.list(limit=1000)) == count
