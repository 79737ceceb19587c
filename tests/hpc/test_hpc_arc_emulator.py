"""The ARC emulator answers as real A-REX does, so the fast tests catch what the real CE
would (the real CE's own tests are test_hpc_arex.py; the table is in docs/hpc.md).

Each test here failed against the backend before it declared its outputs, wrote walltime
with its unit, kept stderr and read the reason phrase.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
import urllib.request

import pytest

from jupyter_cloudtik.hpc.commands import build_spec

from .conftest import CLIENT_SECRET, Service, wait_for


def _token(arc) -> str:
    form = urllib.parse.urlencode({"grant_type": "client_credentials", "client_id": "cloudtik",
                                   "client_secret": CLIENT_SECRET}).encode()
    with urllib.request.urlopen(arc.info["token_uri"], data=form, timeout=10) as resp:
        return json.loads(resp.read())["access_token"]


def _call(arc, method, path, body=None, token=None, ctype="application/json", extra=None):
    u = urllib.parse.urlsplit(arc.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    headers = {"Content-Type": ctype, "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    headers.update(extra or {})
    conn.request(method, f"/arex/rest{path}", body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, resp.reason, data


def _submit_raw(arc, token, xrsl):
    status, _, _ = _call(arc, "POST", "/1.1/delegations?action=new&type=jwt", b"", token,
                         extra={"X-Token-Delegation": f"Bearer {token}"})
    assert status == 201
    # the delegation id is in Location; the emulator lists it too
    _, _, data = _call(arc, "GET", "/1.1/delegations", token=token)
    did = json.loads(data)["delegation"][-1]["id"]
    status, _, data = _call(arc, "POST", f"/1.1/jobs?action=new&delegation_id={did}",
                            xrsl.encode(), token, "application/rsl")
    assert status == 201, data
    return json.loads(data)["job"][0]


def _wait_state(arc, token, jid, states=("FINISHED", "FAILED", "KILLED"), timeout=60):
    def state():
        _, _, data = _call(arc, "POST", "/1.1/jobs?action=status",
                           json.dumps({"job": [{"id": jid}]}).encode(), token)
        s = json.loads(data)["job"][0]["state"]
        return s if s in states else None

    return wait_for(state, timeout, 0.2, "the job to end")


def test_versions_errors_in_the_reason_phrase_and_token_refusal(arc):
    status, _, data = _call(arc, "GET", "")
    assert status == 200 and json.loads(data) == {"version": ["1.0", "1.1"]}
    status, reason, data = _call(arc, "GET", "/1.1/jobs", token="not-a-token")
    assert (status, reason, data) == (500, "User can't be assigned configuration", b"")
    token = _token(arc)
    status, reason, data = _call(arc, "GET", "/1.1/jobs/nosuch00/session/x.txt", token=token)
    assert (status, data) == (404, b"") and reason


def test_undeclared_outputs_are_wiped_and_a_bare_walltime_is_seconds(arc):
    token = _token(arc)
    undeclared = _submit_raw(arc, token, '&(executable="/bin/sh")(arguments="-c" '
                                         '"echo hi > made.txt")(stdout="o.txt")')
    declared = _submit_raw(arc, token, '&(executable="/bin/sh")(arguments="-c" '
                                       '"echo hi > made.txt")(stdout="o.txt")'
                                       '(outputfiles=("made.txt" ""))')
    short = _submit_raw(arc, token, '&(executable="/bin/sleep")(arguments="30")'
                                    '(walltime="2")')
    queue = _submit_raw(arc, token, '&(executable="/bin/true")(queue="nope")')
    assert queue == {"status-code": "500",
                     "reason": "Requested queue nope is not allowed for this user"}
    assert _wait_state(arc, token, undeclared["id"]) == "FINISHED"
    _, _, data = _call(arc, "GET", f"/1.1/jobs/{undeclared['id']}/session/", token=token)
    assert json.loads(data) == {"file": [], "dir": []}
    assert _wait_state(arc, token, declared["id"]) == "FINISHED"
    _, _, data = _call(arc, "GET", f"/1.1/jobs/{declared['id']}/session/", token=token)
    assert json.loads(data) == {"file": ["made.txt"], "dir": []}
    t0 = time.monotonic()
    assert _wait_state(arc, token, short["id"]) == "FAILED"
    assert time.monotonic() - t0 < 20  # 2 seconds, not 2 minutes


def test_command_keeps_stderr_outputs_in_subfolders_and_its_walltime(arc, backend_configs,
                                                                    make_client, tmp_path):
    config, secrets = backend_configs["arc"]()
    client = make_client({"arc": config}, secrets)
    info = client.submit(build_spec(None, command=[
        "bash", "-c", "echo out; echo err >&2; mkdir -p a/b; echo r > a/b/r.txt; sleep 3"],
        time="2m"), "arc")  # "2" alone would be 2 seconds on the CE
    info = client.wait(info.id, timeout=60)
    assert info.state == "succeeded", info.reason
    log = client.logs(info.id).text
    assert "out" in log and "err" in log
    assert [f.name for f in client.outputs(info.id)] == ["a/b/r.txt"]
    assert client.fetch(info.id, tmp_path / "f")[0].read_text() == "r\n"


def test_a_refused_token_is_a_final_failure_with_the_ces_words(arc, backend_configs,
                                                              make_client):
    config, _ = backend_configs["arc"]()
    cfg = {k: v for k, v in config.items() if k not in ("token_uri", "client_id")}
    client = make_client({"arc": cfg}, {("arc", "token"): "expired-or-foreign"})
    try:
        info = client.submit(build_spec(None, command=["true"]), "arc")
        info = client.wait(info.id, timeout=30)
        assert info.state == "failed"
        why = info.reason
    except Exception as e:  # refused at once: our limits check asks the CE first
        why = str(e)
    assert "User can't be assigned configuration" in why and "will be submitted" not in why


@pytest.fixture
def arc6_emulator(tmp_path):
    svc = Service("jupyter_cloudtik.testing.arc", tmp_path / "arc6",
                  ["--rest-versions", "1.0"]).start()
    yield svc
    svc.stop()


def test_a_rest_1_0_ce_is_not_offered_a_token(arc6_emulator, make_client):
    status, reason, _ = _call(arc6_emulator, "GET", "/1.1/jobs")
    assert (status, reason) == (404, "Version Not Supported")
    client = make_client({"arc": {"type": "arc", "url": arc6_emulator.url,
                                  "token_uri": arc6_emulator.info["token_uri"],
                                  "client_id": "cloudtik"}},
                         {("arc", "client_secret"): CLIENT_SECRET})
    try:
        info = client.submit(build_spec(None, command=["true"]), "arc")
        why = client.wait(info.id, timeout=30).reason
    except Exception as e:
        why = str(e)
    assert "REST 1.0" in why and "certificate" in why, why


def _self_signed(tmp_path, days: float):
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "expired user")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(7)
            .not_valid_before(now - dt.timedelta(days=10))
            .not_valid_after(now + dt.timedelta(days=days))
            .sign(key, hashes.SHA256()))
    c, k = tmp_path / "usercert.pem", tmp_path / "userkey.pem"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    return c, k


def test_an_expired_certificate_or_proxy_is_said_before_anything_is_sent(make_client,
                                                                        tmp_path):
    from jupyter_cloudtik.hpc.x509proxy import make_proxy, proxy_expiry

    cert, key = _self_signed(tmp_path, days=1)
    proxy = make_proxy(cert.read_text(), key.read_text(), hours=2)
    assert 0 < proxy_expiry(proxy) - time.time() <= 2 * 3600 + 5
    (tmp_path / "old").mkdir()
    old_cert, old_key = _self_signed(tmp_path / "old", days=-1)
    client = make_client({"arc": {"type": "arc", "url": "https://localhost:1/arex",
                                  "certificate": str(old_cert), "key": str(old_key)}})
    try:
        info = client.submit(build_spec(None, command=["true"]), "arc")
        why = client.wait(info.id, timeout=30).reason
    except Exception as e:
        why = str(e)
    assert "expired" in why and "will be submitted" not in why, why


def test_a_broken_off_upload_is_finished_on_retry(arc, backend_configs, make_client,
                                                  notebooks, monkeypatch, tmp_path):
    """As on the real CEs (test_hpc_arex.py): the job waits for its last input, the retry
    finds it and uploads again; it runs once."""
    from jupyter_cloudtik.hpc import arc as arc_backend

    config, secrets = backend_configs["arc"]()
    client = make_client({"arc": config}, secrets)
    real_raw = arc_backend._Rest.raw
    broken = {"n": 0}

    def raw(self, method, path, *a, **kw):
        if method == "PUT" and path.endswith(arc_backend.INPUTS_FILE) and broken["n"] == 0:
            broken["n"] += 1
            raise ConnectionResetError("connection reset by peer (injected)")
        return real_raw(self, method, path, *a, **kw)

    monkeypatch.setattr(arc_backend._Rest, "raw", raw)
    t0 = time.time()
    info = client.submit(build_spec(str(notebooks["param"]), parameters={"factor": 2},
                                    inputs=[str(notebooks["data"])]), "arc")
    assert broken["n"] == 1 and info.state == "unknown"
    info = client.wait(info.id, timeout=120)
    assert info.state == "succeeded", info.reason
    steps = [e.step for e in client.events(info.id)]
    assert steps.count("submitted") == 1
    news = [r for r in arc.requests() if r["method"] == "POST" and "action=new" in r["query"]
            and r["path"].endswith("/jobs") and r["t"] >= t0]
    assert len(news) == 1  # one job on the CE
    fetched = {p.name: p for p in client.fetch(info.id, tmp_path / "f")}
    assert fetched["result.txt"].read_text() == "12"


def test_parameters_the_notebook_cannot_receive_never_reach_the_ce(arc, backend_configs,
                                                                   make_client, notebooks):
    """papermill runs on the CE, so the check is made here, at submit: nothing is staged
    and no job is created (no request at all reaches the CE)."""
    from jupyter_cloudtik.core.errors import ConfigError

    config, secrets = backend_configs["arc"]()
    client = make_client({"arc": config}, secrets)
    t0 = time.time()
    with pytest.raises(ConfigError) as e:
        client.submit(build_spec(str(notebooks["param"]), parameters={"factr": 2},
                                 inputs=[str(notebooks["data"])]), "arc")
    assert e.value.field == "parameters.factr"
    assert "assigns: factor, input_name" in e.value.message
    assert [r for r in arc.requests() if r["t"] >= t0 and r["method"] != "GET"] == []
    assert client.list() == []
