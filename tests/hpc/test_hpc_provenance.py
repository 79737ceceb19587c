"""Provenance crates (issue 31, point 4): every job that ends writes an RO-Crate (Process
Run Crate 0.5) next to its results, validated here with roc-validator; ``Job.rerun``
runs it again and says what differs.

Jobs really run (local processes, the real single-node Slurm); checksums are recomputed
from the files themselves, never taken from the crate.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest

from jupyter_cloudtik.hpc import provenance
from jupyter_cloudtik.hpc.api import Job
from jupyter_cloudtik.hpc.commands import build_spec

CONTEXT_URL = "https://w3id.org/ro/crate/1.1/context"


def validate(crate: Path, cache: Path) -> list[str]:
    """roc-validator's REQUIRED issues for the crate against its Process Run Crate 0.5
    profile, offline: the validator fetches the RO-Crate JSON-LD context over HTTP, and
    this machine has no network, so its HTTP cache is seeded with the context the
    ``rocrate`` package ships (RO-Crate 1.3's, which defines every 1.1 term with the
    same IRI; 1.1's own is not shipped by either package)."""
    import requests
    import rocrate
    from rocrate_validator import models, services
    from rocrate_validator.utils.http import HttpRequester
    from urllib3 import HTTPResponse

    settings = services.ValidationSettings(
        rocrate_uri=str(crate),
        profile_identifier="process-run-crate-0.5",
        requirement_severity=models.Severity.REQUIRED,
        offline=True,
        cache_path=cache,
    )
    shipped = Path(rocrate.__file__).parent / "data" / "ro-crate.jsonld"
    body = json.dumps({"@context": json.loads(shipped.read_text())["@context"]}).encode()
    resp = requests.Response()
    resp.status_code, resp.reason, resp.url, resp.encoding = 200, "OK", CONTEXT_URL, "utf-8"
    resp._content = body
    resp.headers["Content-Type"] = "application/ld+json"
    resp.request = requests.Request("GET", CONTEXT_URL).prepare()
    resp.raw = HTTPResponse(
        body=io.BytesIO(body), status=200, preload_content=False, request_url=CONTEXT_URL
    )
    HttpRequester().session.cache.save_response(resp)
    result = services.validate(settings)
    return [f"{i.severity.name}: {i.message}" for i in result.get_issues()]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def graph_of(crate: Path) -> dict[str, dict]:
    data = json.loads((crate / provenance.CRATE_FILE).read_text())
    return {e["@id"]: e for e in data["@graph"]}


def action_of(graph: dict) -> dict:
    """The run, its object and result as lists (one value stands alone in the crate)."""
    action = next(e for e in graph.values() if e["@type"] == "CreateAction")
    for key in ("object", "result"):
        if not isinstance(action.get(key), list):
            action[key] = [action[key]] if key in action else []
    return action


def run(client, spec, backend: str):
    info = client.submit(spec, backend)
    info = client.wait(info.id, timeout=180)
    job = Job(info.id, client)
    return info, job


SECRET = "pr0v-s3cret-value-do-not-record"


@pytest.mark.slow
def test_local_jobs_crates_validate_with_checksums_parameters_status_and_no_secrets(
    make_client, notebooks, tmp_path, monkeypatch, http_files
):
    """A job that succeeds and one that fails, side by side on the local backend."""
    monkeypatch.setenv("MY_STORAGE_PASSWORD", SECRET)  # in the session's environment
    www, base = http_files
    (www / "ref.txt").write_text("reference\n")
    host = base.split("//", 1)[1]
    url = f"http://user:{SECRET}@{host}/ref.txt?token={SECRET}"  # credentials in a URL
    client = make_client({"here": {"type": "local"}}, secrets={("here", "password"): SECRET})
    spec = build_spec(
        str(notebooks["param"]),
        parameters={"factor": 7},
        inputs=[str(notebooks["data"]), f"ref.txt={url}"],
        time="10m",
        env={"API_TOKEN": SECRET},
    )
    ok = client.submit(spec, "here")
    bad = client.submit(build_spec(str(notebooks["fail"])), "here")
    info = client.wait(ok.id, timeout=180)
    failed = client.wait(bad.id, timeout=180)
    assert info.state == "succeeded", info.reason
    crate = Job(info.id, client).crate
    assert crate.resolve() == (tmp_path / "hpc-jobs" / info.id).resolve()
    assert all(SECRET not in p.read_text(errors="replace") for p in crate.rglob("*") if p.is_file())
    assert validate(crate, tmp_path / "roc-cache") == []

    g = graph_of(crate)
    action = action_of(g)
    assert action["actionStatus"] == "http://schema.org/CompletedActionStatus"
    assert "error" not in action and action["startTime"] <= action["endTime"]
    nb = g[action["instrument"]["@id"]]
    assert nb["sha256"] == sha(notebooks["param"]) == sha(crate / "param.ipynb")
    # the parameter, typed
    params = [g[o["@id"]] for o in action["object"] if g[o["@id"]]["@type"] == "PropertyValue"]
    assert [(p["name"], p["value"]) for p in params] == [("factor", 7)]
    assert g[params[0]["exampleOfWork"]["@id"]]["additionalType"] == "Integer"
    # the inputs, by their source locations, with the checksums of what the job read
    data = g[notebooks["data"].as_uri()]
    assert data["url"] == str(notebooks["data"]) and data["sha256"] == sha(notebooks["data"])
    ref = g[f"http://REDACTED@{host}/ref.txt?token=REDACTED"]
    assert ref["name"] == "ref.txt" and ref["sha256"] == sha(www / "ref.txt")
    # the outputs, checksums recomputed from the fetched files
    results = {g[r["@id"]]["name"]: g[r["@id"]] for r in action["result"]}
    assert set(results) == {"param.out.ipynb", "result.txt"}
    client.fetch(info.id)
    assert (crate / "result.txt").read_text() == "42"
    for name, entity in results.items():
        assert entity["sha256"] == sha(crate / name), name
    # the environment: this interpreter and its packages; the backend and system
    pkgs = {g[r["@id"]]["name"]: g[r["@id"]]["softwareVersion"] for r in nb["softwareRequirements"]}
    assert pkgs["papermill"] == provenance.session_packages()["papermill"]
    system = g[action["location"]["@id"]]
    props = {g[p["@id"]]["name"]: g[p["@id"]]["value"] for p in system["additionalProperty"]}
    assert props["backend"] == "here" and props["backend_type"] == "local"
    assert props["exit_code"] == "0"

    # the failing job: its crate validates too, and says how it ended
    assert failed.state == "failed"
    crate = Job(failed.id, client).crate
    assert validate(crate, tmp_path / "roc-cache") == []
    action = action_of(graph_of(crate))
    assert action["actionStatus"] == "http://schema.org/FailedActionStatus"
    assert "ZeroDivisionError" in action["error"]


@pytest.mark.slow
def test_rerun_says_what_differs_from_python_the_magic_and_the_cli(ip, notebooks, capsys):
    """``Job.rerun`` (the crate's metadata file), ``%hpc rerun JOB`` and ``jupyter
    cloudtik jobs rerun CRATE --json``, after an input and then the notebook changed;
    the three reruns run side by side."""
    import os
    import subprocess
    import sys

    job = ip.run_line_magic(
        "hpc", f"submit {notebooks['param']} -p factor 3 --inputs {notebooks['data']} --wait"
    )
    assert job.state == "succeeded", job.info.reason
    notebooks["data"].write_text("10\n")  # the input changed since
    capsys.readouterr()
    again = Job.rerun(job.crate / provenance.CRATE_FILE)
    said = capsys.readouterr().out
    assert [d for d in again.differences if d.startswith("input data.txt")], again.differences
    assert "input data.txt" in said and "changed" in said
    assert not [d for d in again.differences if d.startswith("notebook")]
    # package versions that differ from the record are said too (one short line)
    recorded = provenance.read(job.crate)
    now = {**provenance.session_packages(), "papermill": "0.0.1", "brand-new": "1.0"}
    said = provenance.differences(recorded, packages=now)
    assert said[-1] == (
        f"packages: papermill {recorded['packages']['papermill']} -> 0.0.1, brand-new 1.0 new"
    ), said
    by_magic = ip.run_line_magic("hpc", f"rerun {job.id}")
    assert "input data.txt" in capsys.readouterr().out

    notebooks["param"].write_text(notebooks["param"].read_text().replace("= 1", "= 10"))
    cli = [sys.executable, "-m", "jupyter_cloudtik", "jobs", "rerun"]
    r = subprocess.run(
        [*cli, str(job.crate), "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ},
    )
    assert r.returncode == 0, r.stderr
    by_cli = json.loads(r.stdout)
    assert by_cli["parameters"] == {"factor": 3} and by_cli["backend"] == job.info.backend
    assert [d for d in by_cli["differences"] if d.startswith("notebook: param.ipynb changed")]
    assert "notebook: param.ipynb changed" in r.stderr  # said, also with --json
    r = subprocess.run(
        [*cli, "nothere"], capture_output=True, text=True, timeout=60, env={**os.environ}
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "crate: 'nothere' is not a provenance crate" in r.stderr

    for rerun in (again.id, by_magic.id, by_cli["id"]):
        info = ip.run_line_magic("hpc", f"wait {rerun}").info
        assert info.state == "succeeded", info.reason
        assert info.parameters == {"factor": 3} and info.backend == job.info.backend
    assert again.client.read_file(again.id, "result.txt") == b"30"  # the changed input
    # a crate that is not one: one line naming the field
    from jupyter_cloudtik.core.errors import NotFoundError

    with pytest.raises(NotFoundError, match=r"crate: .* is not a provenance crate .* nor a job"):
        Job.rerun(notebooks["data"].parent)


@pytest.mark.slow
def test_slurm_job_and_array_sweep_elements_get_crates_that_validate(
    make_client, notebooks, backend_configs, tmp_path
):
    """A job on the real Slurm, and a sweep's elements (tasks of one Slurm job array, each
    an ordinary job of its own), side by side."""
    config, secrets = backend_configs["slurm"]()
    client = make_client({"slurm": config}, secrets)
    spec = build_spec(
        str(notebooks["param"]),
        parameters={"factor": 2},
        inputs=[str(notebooks["data"])],
        time="10m",
    )
    info = client.submit(spec, "slurm")
    sweep = Job.sweep(
        str(notebooks["param"]),
        zip={"factor": [3, 4]},
        backend="slurm",
        inputs=[str(notebooks["data"])],
        time="10m",
        client=client,
    )
    info = client.wait(info.id, timeout=180)
    assert info.state == "succeeded", info.reason
    crate = Job(info.id, client).crate
    assert validate(crate, tmp_path / "roc-cache") == []
    g = graph_of(crate)
    action = action_of(g)
    assert action["actionStatus"] == "http://schema.org/CompletedActionStatus"
    assert g[notebooks["data"].as_uri()]["sha256"] == sha(notebooks["data"])
    client.fetch(info.id)
    results = {g[r["@id"]]["name"]: g[r["@id"]] for r in action["result"]}
    assert (crate / "result.txt").read_text() == "12"
    assert results["result.txt"]["sha256"] == sha(crate / "result.txt")
    system = g[action["location"]["@id"]]
    props = {g[p["@id"]]["name"]: g[p["@id"]]["value"] for p in system["additionalProperty"]}
    assert props["backend_type"] == "slurm" and props["native_id"] == info.native_id

    assert sweep.wait(timeout=180).state == "succeeded"
    for index, factor in ((0, 3), (1, 4)):
        element = sweep.element(index)
        crate = element.crate
        assert validate(crate, tmp_path / "roc-cache") == []
        g = graph_of(crate)
        action = action_of(g)
        params = [g[o["@id"]] for o in action["object"] if g[o["@id"]]["@type"] == "PropertyValue"]
        assert [(p["name"], p["value"]) for p in params] == [("factor", factor)]
        system = g[action["location"]["@id"]]
        props = {g[p["@id"]]["name"]: g[p["@id"]]["value"] for p in system["additionalProperty"]}
        assert props["native_id"] == element.info.native_id and "_" in props["native_id"]
        client.fetch(element.id)
        results = {g[r["@id"]]["name"]: g[r["@id"]] for r in action["result"]}
        assert (crate / "result.txt").read_text() == str(6 * factor)
        assert results["result.txt"]["sha256"] == sha(crate / "result.txt")


def test_provenance_can_be_turned_off(hpc_state):
    """``c.HPC.provenance = False``: no crate, and the backend is not even asked."""
    import asyncio

    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.hpc.jobs import JobManager
    from jupyter_cloudtik.hpc.settings import HPC

    manager = JobManager(settings=CloudTik(state_dir=str(hpc_state)), hpc=HPC(provenance=False))
    assert asyncio.run(provenance.record(manager, None, None, "succeeded", None, 0)) is None
    assert HPC().provenance is True


def test_redact_leaves_no_credentials():
    r = provenance.redact
    assert r("ref=https://u:pw@h.org/x?token=t&sig=s&a=1") == (
        "ref=https://REDACTED@h.org/x?token=REDACTED&sig=REDACTED&a=1"
    )
    assert r("/data/in.csv") == "/data/in.csv" and r("daint:/store/x") == "daint:/store/x"


def test_a_failure_message_goes_into_the_crate_redacted(tmp_path):
    """A stage-out failure names where it copied to: the crate (shared with others)
    gets that message with the URL's credentials redacted, and nothing else of it lost."""
    import time

    reason = (
        f"stage-out failed: copying results to https://alice:{SECRET}@store.example/out"
        f"?sig={SECRET}&a=1: HTTP 403 Forbidden (see s3://bob:{SECRET}@bucket/x)"
    )
    now = time.time()
    job = {"id": "j1234567", "name": "stage", "backend": "here", "backend_type": "local",
           "native_id": "1", "user": "u", "submitted_at": now - 5, "started_at": now - 4,
           "finished_at": now}
    crate = provenance.build(
        tmp_path / "crate", job=job, spec={"command": ["true"]}, plan={}, state="failed",
        reason=reason, exit_code=0, before=None, after=None, notebook=None,
        parameters_file=None,
    )
    files = [p for p in (tmp_path / "crate").rglob("*") if p.is_file()]
    assert crate.is_file()
    assert all(SECRET not in p.read_text(errors="replace") for p in files)
    action = action_of(graph_of(tmp_path / "crate"))
    assert action["error"] == (
        "stage-out failed: copying results to https://REDACTED@store.example/out"
        "?sig=REDACTED&a=1: HTTP 403 Forbidden (see s3://REDACTED@bucket/x)"
    )


def test_a_failing_jobs_reason_events_and_crate_never_quote_a_stored_secret(
        make_client, tmp_path):
    """A job's reason quotes its log's last lines, and the log says whatever the job or a
    system printed — here a credential of the state folder's secret store (a storage's
    password, as a failed copy would print it).  Every copy of the message kept for the
    user — the job's reason, its events, the crate's error — has it replaced, and a
    secret stored after the redactor first ran is known too."""
    client = make_client({"here": {"type": "local"}})
    store = client.manager.secrets
    store.put("storage:archive", "pass", "first-" + SECRET)
    client.manager.redact("warm up: the redactor reads the store once here")
    store.put("storage:later", "pass", "later-" + SECRET)  # added afterwards
    said = tmp_path / "what-the-copy-said.txt"  # what a tool printed, not the command
    said.write_text(f"copy failed for user:first-{SECRET}@host\ntoken later-{SECRET}\n")
    bad = client.submit(build_spec(command=["sh", "-c", f"cat {said} >&2; exit 3"]), "here")
    failed = client.wait(bad.id, timeout=120)
    assert failed.state == "failed"
    assert "<secret>" in failed.reason, failed.reason
    events = [e.message for e in client.manager.ops.events(
        client.manager._row(bad.id)["op_id"])]
    kept = [failed.reason, *events]
    crate = Job(bad.id, client).crate
    if crate is not None:
        kept += [p.read_text(errors="replace") for p in crate.rglob("*") if p.is_file()]
    assert not any(SECRET in text for text in kept), [t for t in kept if SECRET in t]


def test_a_crate_this_folder_did_not_write_is_not_rerun_without_trust(make_client, tmp_path):
    """A crate someone sent (or one edited after it was written) describes a run; a rerun
    of it would run their command here.  Refused with what it would run, in one line;
    ``trust=True`` runs it; this folder's own unchanged crate reruns as before."""
    import shutil

    from jupyter_cloudtik.core.errors import ConfigError

    client = make_client({"here": {"type": "local"}})
    job = client.wait(client.submit(build_spec(command=["sh", "-c", "echo mine"]),
                                    "here").id, timeout=120)
    assert job.state == "succeeded", job.reason
    crate = Job(job.id, client).crate
    again = Job.rerun(crate, client=client, quiet=True)  # ours, unchanged
    assert client.wait(again.id, timeout=120).state == "succeeded"

    sent = tmp_path / "sent-crate"  # the same crate, edited by whoever sent it
    shutil.copytree(crate, sent)
    record = json.loads((sent / provenance.JOB_FILE).read_text())
    record["command"] = ["sh", "-c", "touch " + str(tmp_path / "pwned")]
    (sent / provenance.JOB_FILE).write_text(json.dumps(record))
    before = len(client.list())
    with pytest.raises(ConfigError) as e:
        Job.rerun(sent, client=client, quiet=True)
    said = e.value.message
    assert e.value.field == "crate" and "\n" not in said
    assert str(tmp_path / "pwned") in said and "--trust" in said, said
    assert len(client.list()) == before and not (tmp_path / "pwned").exists()
    trusted = Job.rerun(sent, client=client, quiet=True, trust=True)
    assert client.wait(trusted.id, timeout=120).state == "succeeded"
    assert (tmp_path / "pwned").exists()  # read, then trusted: it runs
