"""HPC job routes against a real JupyterLab: shapes validated against openapi.yaml, the
whole life of a job, bad input named by field, cancel."""

from __future__ import annotations

import base64
import json
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


def test_requirements_are_refused_by_the_rest_client_not_dropped(lab, job_files, tmp_path):
    """The REST body has no requirements: the real REST client against the real server
    refuses a spec with a requirements file in one line (before, it was dropped and the
    job ran with other packages than asked), and nothing reaches the server."""
    from jupyter_cloudtik.clusters.rest import RestBackend
    from jupyter_cloudtik.core.errors import ConfigError
    from jupyter_cloudtik.hpc.base import Environment, JobSpec
    from jupyter_cloudtik.hpc.rest import RestJobsClient

    req = tmp_path / "requirements.txt"
    req.write_text("numpy==1.26.4\n")
    client = RestJobsClient(RestBackend(lab.api_url, lab.token))
    before = len(client.list(limit=1000))
    nb = str(job_files / "param.ipynb")
    spec = JobSpec(notebook=nb, environment=Environment(requirements=str(req)))
    for call in (lambda: client.submit(spec, "local"),
                 lambda: client.sweep(spec, "local", grid={"factor": [1, 2]})):
        with pytest.raises(ConfigError) as e:
            call()
        assert e.value.field == "environment.requirements", e.value.message
        assert str(req) in e.value.message and "\n" not in e.value.message
    assert len(client.list(limit=1000)) == before
    # the same spec without the file is sent and runs
    info = client.submit(JobSpec(notebook=nb, parameters={"factor": 2},
                                 inputs=[str(job_files / "data.txt")]), "local")
    done = wait_job(lab, info.id)
    assert done["state"] == "succeeded", done
