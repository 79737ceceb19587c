"""The ``arc`` backend against real A-REX CEs from Debian packages.

* ``arc6``: this machine's ARC 6.17 (Debian 12): REST 1.0 only, X.509 proxies made here
  from the user's certificate.
* ``arc7``: ARC 7.0 from Debian 13, in a chroot built once and cached
  (``cloudtik_emulators.arex``): REST 1.1, bearer tokens from an OIDC issuer the
  test runs, which A-REX asks for its keys over HTTPS.

Both sites run the fork LRMS with a test CA (``arcctl test-ca``) and their REST interface
on a free port; they start once per session.  The scenarios are the ones the emulator's
tests cover, so what the emulator lets through and the real CE does not shows up here.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import toolz

from jupyter_cloudtik.hpc.commands import build_spec

from .conftest import CLIENT_SECRET, _nb, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.arc, pytest.mark.timeout(900)]


def _log(msg: str) -> None:
    print(f"[arex] {msg}", flush=True)


@pytest.fixture(scope="session")
def arex6():
    from cloudtik_emulators.arex import ArexSite, host_job_python, missing_arc6

    why = missing_arc6()
    if why:
        pytest.skip(why)
    t0 = time.monotonic()
    python = host_job_python(_log)
    site = ArexSite(f"cloudtik-arex6-{uuid.uuid4().hex[:8]}", log=_log)
    try:
        site.start()
    except RuntimeError:
        shutil.rmtree(site.root, ignore_errors=True)
        raise
    _log(f"ARC 6 site up in {time.monotonic() - t0:.0f}s (A-REX {site.start_seconds:.0f}s)")
    config = {"type": "arc", "url": site.url, "ca_certificates": str(site.ca_dir),
              "certificate": str(site.user_cert), "key": str(site.user_key),
              "environment": {"python": str(python), "venv": str(python.parent.parent)}}
    yield site, config, {}
    site.stop()
    shutil.rmtree(site.root, ignore_errors=True)


@pytest.fixture(scope="session")
def arex7():
    from cloudtik_emulators.arex import (
        ArexSite,
        OidcIssuer,
        build_arc7_chroot,
        missing_arc6,
    )

    why = missing_arc6()
    if why:
        pytest.skip(why)
    t0 = time.monotonic()
    root = build_arc7_chroot(log=_log)
    t_chroot = time.monotonic() - t0
    site = ArexSite(f"cloudtik-arex7-{uuid.uuid4().hex[:8]}", chroot=root, log=_log)
    issuer = None
    try:
        site.root.mkdir(parents=True, exist_ok=True)
        site.make_certificates()
        issuer = OidcIssuer(site.host_cert, site.host_key, {"cloudtik": CLIENT_SECRET})
        site.issuer = issuer.url
        site.start()
    except Exception:
        if issuer:
            issuer.stop()
        site.stop()
        shutil.rmtree(site.root, ignore_errors=True)
        raise
    _log(f"ARC 7 site up in {time.monotonic() - t0:.0f}s (chroot {t_chroot:.0f}s, "
         f"A-REX {site.start_seconds:.0f}s)")
    config = {"type": "arc", "url": site.url, "ca_certificates": str(site.ca_dir),
              "token_uri": issuer.token_uri, "client_id": "cloudtik",
              "environment": {"python": "/usr/bin/python3", "venv": ""}}
    site.oidc = issuer
    yield site, config, {("arc", "client_secret"): CLIENT_SECRET}
    site.stop()
    issuer.stop()
    shutil.rmtree(site.root, ignore_errors=True)


@pytest.fixture(params=["arc6", "arc7"])
def site(request):
    return request.param, *request.getfixturevalue(
        "arex6" if request.param == "arc6" else "arex7")


@pytest.fixture
def arc_client(site, make_client):
    kind, ce, config, secrets = site
    return kind, ce, make_client({"arc": config}, secrets)


def _executed_text(nb_bytes: bytes) -> str:
    nb = json.loads(nb_bytes)
    out = []
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                out.append("".join(o["text"]) if isinstance(o["text"], list) else o["text"])
    return "".join(out)


def _why(client, info) -> str:
    return f"{info.state}: {info.reason}\n{client.logs(info.id).text[-2000:]}"


def test_rest_version_credentials_and_queues(arc_client):
    kind, _ce, client = arc_client
    be = client.manager.registry.get("arc")
    lim = be.limits()
    assert lim.queues == ["fork"]
    assert be._version == ("1.0" if kind == "arc6" else "1.1")
    assert be.uses_x509 == (kind == "arc6")


def test_jobs_run_end_to_end(arc_client, notebooks, tmp_path):
    """A command (stdout, stderr, outputs in subfolders, 2 minutes of walltime that must
    not become 2 seconds), a parameterised notebook with an input, and a failing notebook
    — submitted together, as the CE takes minutes per round."""
    _kind, _ce, client = arc_client
    sub_nb = tmp_path / "nbs" / "sub.ipynb"
    sub_nb.write_text(json.dumps(_nb(
        ("factor = 1", ["parameters"]),
        ("import os\nos.makedirs('out/deeper', exist_ok=True)\n"
         "open('out/deeper/value.txt', 'w').write(str(int(open('data.txt').read()) * factor))\n"
         "print('wrote', factor)", []))))
    cmd = client.submit(build_spec(None, command=[
        "bash", "-c", "echo to-stdout; echo to-stderr >&2; mkdir -p res/a; "
                      "echo r > res/a/r.txt; sleep 5; echo done"], time="2m"), "arc")
    param = client.submit(build_spec(str(notebooks["param"]), parameters={"factor": 7},
                                     inputs=[str(notebooks["data"])], time="10m"), "arc")
    sub = client.submit(build_spec(str(sub_nb), parameters={"factor": 3},
                                   inputs=[str(notebooks["data"])]), "arc")
    fail = client.submit(build_spec(str(notebooks["fail"])), "arc")
    for info in (cmd, param, sub, fail):
        assert info.state in ("queued", "running", "succeeded"), info.reason

    info = client.wait(cmd.id, timeout=400)
    assert info.state == "succeeded", _why(client, info)
    log = client.logs(info.id).text
    assert "to-stdout" in log and "to-stderr" in log and "done" in log
    assert {"res/a/r.txt"} == {f.name for f in client.outputs(info.id)}
    got = client.fetch(info.id, tmp_path / "cmd")
    assert [p.read_text() for p in got] == ["r\n"]

    info = client.wait(param.id, timeout=400)
    assert info.state == "succeeded", _why(client, info)
    outputs = {f.name for f in client.outputs(info.id)}
    assert {"param.out.ipynb", "result.txt"} <= outputs and "data.txt" not in outputs
    fetched = {p.name: p for p in client.fetch(info.id, tmp_path / "param")}
    assert fetched["result.txt"].read_text() == "42"
    assert "result 42" in _executed_text(fetched["param.out.ipynb"].read_bytes())

    info = client.wait(sub.id, timeout=400)
    assert info.state == "succeeded", _why(client, info)
    assert "out/deeper/value.txt" in {f.name for f in client.outputs(info.id)}
    fetched = client.fetch(info.id, tmp_path / "sub")
    assert (tmp_path / "sub" / "out" / "deeper" / "value.txt").read_text() == "18"
    assert any(p.name == "sub.out.ipynb" for p in fetched)

    info = client.wait(fail.id, timeout=400)
    assert info.state == "failed"
    assert info.error and info.error["ename"] == "ZeroDivisionError", _why(client, info)
    assert info.error["cell"] == 2


def test_the_sessions_environment_is_built_by_the_ces_mapped_account(arex6, make_client,
                                                                     tmp_path):
    """A CE that has never seen the session's Python packages: no Python is named in the
    backend (the site's stock ``python3``, found by a probe job), the job asks for toolz,
    and the job itself builds the environment in its session folder, as the CE's mapped
    account, offline from the wheels that travel as its inputs (hpc/arc.py,
    ``_environment_files``) — then runs the notebook in it."""
    _site, config, secrets = arex6
    config = {k: v for k, v in config.items() if k != "environment"}
    client = make_client({"arc": config}, secrets)
    nb = tmp_path / "uses_toolz.ipynb"
    nb.write_text(json.dumps(_nb(
        ("n = 3", ["parameters"]),
        ("import os, sys, toolz\n"
         "print('toolz', toolz.__version__, 'in', sys.prefix, 'uid', os.getuid(),\n"
         "      'sum', sum(toolz.take(n, toolz.iterate(lambda x: x + 1, 1))))", []))))
    info = client.submit(build_spec(str(nb), parameters={"n": 4}, packages=["toolz"],
                                    time="15m"), "arc")
    assert info.state in ("queued", "running"), info.reason
    assert info.environment["mode"] == "built", info.environment
    info = client.wait(info.id, timeout=600)
    assert info.state == "succeeded", _why(client, info)
    log = client.logs(info.id).text
    assert "building environment" in log, log[-2000:]
    fetched = {p.name: p for p in client.fetch(info.id, tmp_path / "out")}
    text = _executed_text(fetched["uses_toolz.out.ipynb"].read_bytes())
    assert f"toolz {toolz.__version__} in" in text and "sum 10" in text, text
    prefix = text.split(" in ", 1)[1].split(" uid ", 1)[0]
    assert info.environment["hash"] in prefix, (prefix, info.environment)
    assert " uid 0 " not in text  # the CE's mapped account, not the session's root


def test_a_sweep_on_the_real_ce_partial_failure_retry_results_and_crates(
        arex6, make_client, tmp_path):
    """A sweep on a CE (ARC has no arrays: a bounded set of jobs): three elements, at most
    two at once; the one whose flag file is missing fails; the results table has the
    others' recorded values; ``retry`` resubmits only the failed one, which then
    succeeds; every element's provenance crate validates.  The notebook records with
    IPython's display (the documented way without jupyter_cloudtik on the system), and
    its flag is where the CE's mapped account can read it."""
    from jupyter_cloudtik.hpc.api import Job

    from .test_hpc_provenance import validate

    _site, config, secrets = arex6
    client = make_client({"arc": config}, secrets)
    shared = Path(tempfile.mkdtemp(prefix="cloudtik-arex-flag-", dir="/tmp"))
    shared.chmod(0o755)
    flag = shared / "allow3"
    scrap = "application/scrapbook.scrap.json+json"
    nb = tmp_path / "sweep.ipynb"
    nb.write_text(json.dumps(_nb(
        ("alpha = 1\nn = 2", ["parameters"]),
        ("import os\nfrom IPython.display import display\n"
         f"assert alpha != 3 or os.path.exists({str(flag)!r}), 'alpha 3 refused'\n"
         f"display({{{scrap!r}: {{'name': 'score', 'data': alpha * n, 'encoder': 'json', "
         "'version': 1}}, raw=True)\n"
         "open('out.txt', 'w').write(str(alpha * n))", []))))
    try:
        sweep = Job.sweep(str(nb), backend="arc", grid={"alpha": [1, 3, 5]},
                          parameters={"n": 2}, max_concurrent=2, client=client)
        assert sweep.info.mode == "bounded"
        info = sweep.wait(timeout=600)
        states = {e["index"]: e["state"] for e in info.elements}
        assert states == {0: "succeeded", 1: "failed", 2: "succeeded"}, (
            states, [_why(client, client.get(e["job"])) for e in info.elements
                     if e["state"] != "succeeded"])
        rows = client.sweep_results(sweep.id)
        assert [(r["alpha"], r["state"], r.get("score")) for r in rows] == [
            (1, "succeeded", 2), (3, "failed", None), (5, "succeeded", 10)], rows
        assert all("out.txt" in r["outputs"] for r in rows if r["state"] == "succeeded")
        first = {e["index"]: e["job"] for e in info.elements}
        flag.write_text("yes")
        flag.chmod(0o644)
        sweep.retry()
        info = sweep.wait(timeout=600)
        assert info.state == "succeeded", str(sweep)
        again = {e["index"]: e["job"] for e in info.elements}
        assert again[0] == first[0] and again[2] == first[2] and again[1] != first[1]
        rows = client.sweep_results(sweep.id)
        assert [(r["alpha"], r["score"]) for r in rows] == [(1, 2), (3, 6), (5, 10)], rows
        for e in info.elements:
            crate = Job(e["job"], client).crate
            assert crate is not None, e
            assert validate(crate, tmp_path / "rocv") == [], e
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_cancelling_a_sweep_on_the_real_ce(arex6, make_client, tmp_path):
    """Issue 31: a sweep on a CE (a bounded set of jobs, one at a time) cancelled while its
    first element runs: an element cancelled alone before it is submitted never reaches
    the CE; cancelling the sweep ends the running element through A-REX's kill (which
    takes its wake-ups) and the element still waiting without submitting it; the sweep
    ends cancelled, and its results table says so for every element."""
    from jupyter_cloudtik.hpc.api import Job

    _site, config, secrets = arex6
    client = make_client({"arc": config}, secrets)
    nb = tmp_path / "long.ipynb"
    nb.write_text(json.dumps(_nb(("alpha = 1", ["parameters"]),
                                 ("import time\ntime.sleep(600)", []))))
    sweep = Job.sweep(str(nb), backend="arc", grid={"alpha": [1, 2, 3]}, max_concurrent=1,
                      client=client)
    assert sweep.info.mode == "bounded"
    jobs = {e["index"]: e["job"] for e in sweep.info.elements}
    wait_for(lambda: client.get(jobs[0]).state == "running", 300, 1,
             "the first element to run on the CE")
    # the third, alone: it was never submitted, so nothing reaches the CE
    info = sweep.cancel(element=2)
    third = client.get(jobs[2])
    assert third.state == "cancelled" and third.native_id is None, third
    t0 = time.monotonic()
    info = sweep.cancel()
    info = sweep.wait(timeout=300)
    _log(f"sweep cancel on the CE: {time.monotonic() - t0:.0f}s")
    assert info.state == "cancelled", str(sweep)
    states = {e["index"]: e["state"] for e in info.elements}
    assert states == {0: "cancelled", 1: "cancelled", 2: "cancelled"}, states
    first, second = client.get(jobs[0]), client.get(jobs[1])
    assert first.native_id, first  # it ran on the CE, and the CE killed it
    assert second.native_id is None, second  # it never reached the CE
    rows = client.sweep_results(sweep.id)
    assert [(r["alpha"], r["state"]) for r in rows] == [
        (1, "cancelled"), (2, "cancelled"), (3, "cancelled")], rows


def test_the_ces_refusal_is_shown_and_final(arc_client):
    """A queue the CE does not serve: its own words, a failed job, no retry loop."""
    from jupyter_cloudtik.core.errors import ProviderError
    from jupyter_cloudtik.hpc.base import Environment, Submission

    _kind, _ce, client = arc_client
    be = client.manager.registry.get("arc")
    spec = build_spec(None, command=["true"], queue="nope")
    sub = Submission(job_id=uuid.uuid4().hex[:8], token="t", spec=spec,
                     environment=Environment.session())
    with pytest.raises(ProviderError) as e:
        be.submit(sub)  # past our own queue check: what the CE itself says
    assert "not allowed" in e.value.message and "nope" in e.value.message
    # through the job manager, our check names the queues the CE serves
    with pytest.raises(Exception) as e2:
        client.submit(spec, "arc")
    assert "fork" in str(e2.value)


def test_bad_credentials_fail_with_the_ces_message(site, make_client, tmp_path):
    kind, ce, config, secrets = site
    if kind == "arc6":  # a certificate of the right CA whose subject the site does not allow
        cert, key = ce.user_certificate("mallory")
        bad = {**config, "certificate": str(cert), "key": str(key)}
        client = make_client({"arc": bad})
    else:  # a token from another issuer's key: ARC 7 answers 500
        client = make_client({"arc": config}, {("arc", "token"): _foreign_token(ce)})
    why = _refusal(client)
    assert "refused the credentials" in why and "will be submitted" not in why
    if kind == "arc6":
        assert "User can't be assigned configuration" in why  # A-REX's own words
    client.close()  # the next client's job manager must be the one that submits
    # the CE's certificate is only trusted with the site's CA folder
    plain = {k: v for k, v in config.items() if k != "ca_certificates"}
    client = make_client({"arc2": plain}, {("arc2", k[1]): v for k, v in secrets.items()})
    why = _refusal(client, "arc2")
    assert "not trusted" in why and "ca_certificates" in why, why
    assert "will be submitted" not in why


def _refusal(client, backend: str = "arc") -> str:
    """What the user is told when the CE will not take a job: the submit is refused at
    once (our checks ask the CE first) or the job fails — never a retry loop."""
    from jupyter_cloudtik.core.errors import CloudTikError

    try:
        info = client.submit(build_spec(None, command=["true"]), backend)
    except CloudTikError as e:
        return e.message
    info = client.wait(info.id, timeout=60)
    assert info.state == "failed", info.reason
    return info.reason


def _foreign_token(ce) -> str:
    from cloudtik_emulators._service import TokenIssuer

    other = TokenIssuer({"x": "y"}, issuer=ce.oidc.url, audience="https://localhost/arex")
    return other.issue("x", "y")["access_token"]


def test_tokens_on_arc6_are_refused_before_anything_is_sent(arex6, make_client):
    _site, config, _ = arex6
    cfg = {k: v for k, v in config.items() if k not in ("certificate", "key")}
    client = make_client({"arc": {**cfg, "token_uri": "https://localhost:1/token",
                                  "client_id": "x"}}, {("arc", "token"): "abc"})
    why = _refusal(client)
    # ARC 6 refuses a token even the list of versions: its words, and what to do
    assert "User can't be assigned configuration" in why, why
    assert "REST 1.0" in why and "set certificate and key" in why, why


def test_a_broken_off_upload_is_finished_on_retry(arc_client, notebooks, monkeypatch,
                                                  tmp_path):
    """The connection breaks before the last upload; the job manager's retry finds the
    waiting job and finishes its uploads — the job runs once, with all its inputs."""
    from jupyter_cloudtik.hpc import arc

    _kind, _ce, client = arc_client
    real_raw = arc._Rest.raw
    broken = {"n": 0}

    def raw(self, method, path, *a, **kw):
        if method == "PUT" and path.endswith(arc.INPUTS_FILE) and broken["n"] == 0:
            broken["n"] += 1
            raise ConnectionResetError("connection reset by peer (injected)")
        return real_raw(self, method, path, *a, **kw)

    monkeypatch.setattr(arc._Rest, "raw", raw)
    info = client.submit(build_spec(str(notebooks["param"]), parameters={"factor": 2},
                                    inputs=[str(notebooks["data"])]), "arc")
    assert broken["n"] == 1
    info = client.wait(info.id, timeout=400)
    assert info.state == "succeeded", _why(client, info)
    steps = [e.step for e in client.events(info.id)]
    assert steps.count("submitted") == 1 and "unavailable" in steps
    fetched = {p.name: p for p in client.fetch(info.id, tmp_path / "f")}
    assert fetched["result.txt"].read_text() == "12"


def test_unreachable_ce_is_unknown_until_it_answers(arex6, make_client):
    _site, config, _ = arex6
    from cloudtik_emulators.arex import free_port

    cfg = {**config, "url": f"https://localhost:{free_port()}/arex"}
    client = make_client({"arc": cfg})
    info = client.submit(build_spec(None, command=["true"]), "arc")
    assert info.state == "unknown" and "did not answer" in info.reason
    wait_for(lambda: client.get(info.id).state == "unknown", 5)


def test_a_job_over_maxjobs_waits_prepared_and_a_kill_takes_a_while(make_client):
    """Issue 29: with arc.conf ``maxjobs`` (second number 1) the second job waits PREPARED
    (``queued``) while the first runs; a kill takes A-REX's wake-ups, and the job is not
    final while the CE says KILLING.  An ARC 6 site of its own (the shared one has no
    limit)."""
    from cloudtik_emulators.arex import ArexSite, host_job_python, missing_arc6

    why = missing_arc6()
    if why:
        pytest.skip(why)
    python = host_job_python(_log)
    site = ArexSite(f"cloudtik-arex6-{uuid.uuid4().hex[:8]}", log=_log, maxjobs=1)
    try:
        site.start()
        cfg = {"type": "arc", "url": site.url, "ca_certificates": str(site.ca_dir),
               "certificate": str(site.user_cert), "key": str(site.user_key),
               "environment": {"python": str(python), "venv": str(python.parent.parent)}}
        client = make_client({"arc": cfg})
        first = client.submit(build_spec(None, command=["sleep", "600"], name="first"), "arc")
        second = client.submit(build_spec(None, command=["true"], name="second"), "arc")
        wait_for(lambda: client.get(first.id).state == "running", 180, 1, "the first to run")
        held = wait_for(lambda: (i := client.get(second.id)).native_state == "PREPARED" and i,
                        60, 1, "the second held PREPARED")
        assert held.state == "queued"
        t0 = time.monotonic()
        info = client.cancel(first.id)
        assert not info.done, info
        seen: list = []

        def ended():
            i = client.get(first.id)
            seen.append((round(time.monotonic() - t0), i.state, i.native_state))
            return i.done and i

        info = wait_for(ended, 240, 1, "the kill")
        _log(f"kill: {time.monotonic() - t0:.0f}s; seen {sorted(set(seen))}")
        assert info.state == "cancelled", _why(client, info)
        assert not [s for s in seen if s[1] == "cancelled" and s[2] == "KILLING"], seen
        info = client.wait(second.id, timeout=240)
        assert info.state == "succeeded", _why(client, info)
    finally:
        site.stop()
        shutil.rmtree(site.root, ignore_errors=True)
