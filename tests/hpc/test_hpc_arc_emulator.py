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

from .conftest import CLIENT_SECRET, SITE_PYTHON, Service, wait_for


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
    svc = Service("cloudtik_emulators.arc", tmp_path / "arc6",
                  ["--rest-versions", "1.0"]).start()
    yield svc
    svc.stop()


def test_a_rest_1_0_ce_is_not_offered_a_token(arc6_emulator, make_client):
    status, reason, _ = _call(arc6_emulator, "GET", "/1.1/jobs")
    assert (status, reason) == (404, "Version Not Supported")
    client = make_client({"arc": {"type": "arc", **SITE_PYTHON, "url": arc6_emulator.url,
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
    client = make_client({"arc": {"type": "arc", **SITE_PYTHON, "url": "https://localhost:1/arex",
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


# --- issue 29: what the real CEs (A-REX 6.17 with X.509, 7 with tokens) showed ---------------

def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _exp(token: str) -> float:
    import base64

    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["exp"]


@pytest.fixture
def silent_port():
    """A real listening socket that accepts connections and never says a word (a CE
    whose TLS never completes)."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    held: list = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield server.getsockname()[1], held
    stop.set()
    t.join(5)
    for c in held:
        c.close()
    server.close()


def test_a_ce_that_never_completes_tls_costs_one_short_wait(silent_port, make_client):
    """Was: two 30 s timeouts in a row (61 s) in the caller's thread.  Now the connect and
    handshake have their own limit (``connect_timeout``, 5 s by default, never more than
    ``timeout``) and a CE that just failed it is not waited for again at once."""
    port, held = silent_port
    url = f"https://127.0.0.1:{port}/arex"
    for config, n in (({"timeout": 2}, "2"), ({"connect_timeout": 1}, "1")):
        client = make_client({"arc": {"type": "arc", **SITE_PYTHON, "url": url, **config}},
                             {("arc", "token"): "a-token"})
        t0 = time.monotonic()
        info = client.submit(build_spec(None, command=["true"]), "arc")
        took = time.monotonic() - t0
        assert info.state == "unknown", info
        assert f"the CE at {url} did not complete TLS within {n} s" in info.reason, info.reason
        assert "\n" not in info.reason
        assert took < float(n) + 1.5, took  # one wait, not one per call
        client.close()
    assert held  # the connections were accepted: it is TLS that never came


def test_a_token_service_that_never_completes_tls_costs_connect_timeout(arc, silent_port,
                                                                       make_client):
    """Was: the token fetch from ``token_uri`` waited the 30 s ``timeout`` (urlopen) in
    the caller's thread.  Now its connect and handshake have ``connect_timeout`` too; the
    job waits ``unknown`` with the cause and goes on once the service answers."""
    port, held = silent_port
    uri = f"https://127.0.0.1:{port}/token"
    client = make_client({"arc": {"type": "arc", **SITE_PYTHON, "url": arc.url, "token_uri": uri,
                                  "client_id": "cloudtik", "connect_timeout": 1}},
                         {("arc", "client_secret"): CLIENT_SECRET})
    t0 = time.monotonic()
    info = client.submit(build_spec(None, command=["true"]), "arc")
    took = time.monotonic() - t0
    assert info.state == "unknown", info
    assert f"the token service at {uri} did not complete TLS within 1 s" in info.reason, \
        info.reason
    assert "\n" not in info.reason and CLIENT_SECRET not in info.reason
    assert took < 2.5, took  # connect_timeout (1 s), not timeout (30 s)
    assert held  # accepted: it is TLS that never came
    client.close()


def test_an_expired_token_is_said_and_a_new_one_resumes_the_job(arc, make_client):
    """Was: the CE's refusal ("refused the credentials", as "did not answer"), without
    saying the token expired.  Now its exp is read: the job waits ``unknown`` with "the
    token expired at T" and goes on once a new token is set."""
    arc.faults(token_ttl=3)
    short = _token(arc)
    arc.faults(token_ttl=300)
    client = make_client({"arc": {"type": "arc", **SITE_PYTHON, "url": arc.url}},
                         {("arc", "token"): short}, retry_interval_max=0.5)
    info = client.submit(build_spec(None, command=["sleep", "5"]), "arc")
    assert info.state in ("queued", "running"), info.reason
    info = wait_for(lambda: (i := client.get(info.id)).state == "unknown" and i, 15,
                    what="the token to expire")
    assert f"the token expired at {_utc(_exp(short))}; set a new one" in info.reason
    assert "did not answer" not in info.reason and "refused" not in info.reason, info.reason
    client.manager.secrets.put("hpc:arc", "token", _token(arc))
    info = client.wait(info.id, timeout=60)
    assert info.state == "succeeded", info.reason
    steps = [e.step for e in client.events(info.id)]
    assert steps.count("unavailable") == 1 and steps.count("available") == 1, steps


def test_an_expired_proxy_is_said_with_its_time_and_a_renewed_one_is_used(arc, make_client,
                                                                          tmp_path):
    """Was: a ProviderError (or, from the real CE, a job ``unknown`` for good as "did not
    answer").  Now the proxy's notAfter is read before anything is sent: the job waits
    with "your proxy certificate expired at T; renew it (arcproxy ...)" and the renewed
    file is used by itself.  (The emulator takes no X.509, so after the renewal the CE's
    refusal is what the job ends with: it was asked again.)"""
    from jupyter_cloudtik.hpc.x509proxy import make_proxy, proxy_expiry

    cert, key = _self_signed(tmp_path, days=1)
    proxy = tmp_path / "x509up"
    proxy.write_text(make_proxy(cert.read_text(), key.read_text(), hours=-0.01))
    until = proxy_expiry(proxy.read_text())
    client = make_client({"arc": {"type": "arc", **SITE_PYTHON, "url": arc.url,
                                  "proxy": str(proxy)}}, retry_interval_max=0.5)
    t0 = time.time()
    info = client.submit(build_spec(None, command=["true"]), "arc")
    assert info.state == "unknown", info
    assert info.reason.startswith(
        f"backend 'arc': your proxy certificate expired at {_utc(until)}; renew it "
        f"(arcproxy --proxy={proxy})"), info.reason
    assert "did not answer" not in info.reason
    assert [r for r in arc.requests() if r["t"] >= t0] == []  # nothing was sent
    proxy.write_text(make_proxy(cert.read_text(), key.read_text(), hours=1))
    info = client.wait(info.id, timeout=30)
    assert [r for r in arc.requests() if r["t"] >= t0]
    assert info.state == "failed" and "refused the credentials" in info.reason, info.reason


def test_an_arc_outage_is_one_event_each_way_and_a_cancel_meanwhile_is_said_at_once(
        arc, backend_configs, make_client):
    config, secrets = backend_configs["arc"]()
    client = make_client({"arc": config}, secrets, retry_interval_max=0.3)
    job = client.submit(build_spec(None, command=["sleep", "60"], name="long"), "arc")
    try:
        wait_for(lambda: client.get(job.id).state == "running", 30, what="running")
        arc.faults(down=True)
        wait_for(lambda: client.get(job.id).state == "unknown", 10, what="unknown")
        t0 = time.monotonic()
        info = client.cancel(job.id)
        assert time.monotonic() - t0 < 2 and info.state == "unknown", info
        (pending,) = [e for e in client.events(job.id) if (e.data or {}).get("pending")]
        assert pending.message == ("cancel requested; backend 'arc' is unavailable, the job "
                                   "will be cancelled when it answers"), pending.message
        time.sleep(1.5)  # polls go on while it is down, without an event each
    finally:
        arc.faults(down=False)
    info = client.wait(job.id, timeout=30)
    assert info.state == "cancelled", info.reason
    steps = [e.step for e in client.events(job.id)]
    assert steps.count("unavailable") == 1 and steps.count("available") == 1, steps


@pytest.mark.parametrize("native,state", [
    ("ACCEPTING", "queued"), ("ACCEPTED", "queued"), ("PREPARING", "queued"),
    ("PREPARED", "queued"), ("SUBMITTING", "queued"), ("QUEUING", "queued"),
    ("HELD", "queued"), ("OTHER", "queued"), ("RUNNING", "running"),
    ("EXITINGLRMS", "running"), ("EXECUTED", "running"), ("FINISHING", "running"),
    ("KILLING", "running"), ("CANCELING", "running"), ("FINISHED", "succeeded"),
    ("FAILED", "failed"), ("WIPED", "failed"), ("KILLED", "cancelled"), ("None", "unknown")])
def test_every_rest_state_is_mapped(native, state):
    """A-REX's REST states (ARC1ClusterInfo.pm): KILLING/CANCELING is not final (a
    failed job passes it on its way to FAILED), EXITINGLRMS is still running, PREPARED
    (held by the CE's job limit) is queued."""
    from jupyter_cloudtik.hpc.arc import common_state

    assert common_state(native) == state


@pytest.fixture
def arc_limited(tmp_path):
    """A CE that runs one job at a time (arc.conf ``maxjobs`` number2 = 1) and takes 2 s
    to kill one (61 s on A-REX 6.17, test_hpc_arex.py)."""
    svc = Service("cloudtik_emulators.arc", tmp_path / "arc-limited",
                  ["--max-running", "1", "--kill-delay", "2"]).start()
    yield svc
    svc.stop()


def _watch(client, job_id, seen):
    info = client.get(job_id)
    seen.append((info.state, info.native_state))
    return info.done and info


def test_a_job_over_the_ces_limit_waits_prepared_and_a_cancel_takes_a_while(arc_limited,
                                                                           make_client):
    svc = arc_limited
    client = make_client({"arc": {"type": "arc", **SITE_PYTHON, "url": svc.url,
                                  "token_uri": svc.info["token_uri"], "client_id": "cloudtik"}},
                         {("arc", "client_secret"): CLIENT_SECRET})
    first = client.submit(build_spec(None, command=["sleep", "60"], name="first"), "arc")
    second = client.submit(build_spec(None, command=["true"], name="second"), "arc")
    wait_for(lambda: client.get(first.id).state == "running", 30, what="the first to run")
    held = wait_for(lambda: (i := client.get(second.id)).native_state == "PREPARED" and i,
                    10, what="the second held PREPARED")
    assert held.state == "queued"
    time.sleep(1)
    assert client.get(second.id).native_state == "PREPARED"  # still held
    t0 = time.monotonic()
    info = client.cancel(first.id)
    assert info.state == "running", info  # asked; the CE has not killed it yet
    seen: list = []
    info = wait_for(lambda: _watch(client, first.id, seen), 20, 0.1, "the kill")
    assert info.state == "cancelled" and time.monotonic() - t0 >= 1.9
    # as on A-REX 6.17: RUNNING until KILLED (KILLING, if seen at all, is not final)
    assert seen.count(("running", "RUNNING")) >= 10, seen
    assert set(seen) <= {("running", "RUNNING"), ("running", "KILLING"),
                         ("cancelled", "KILLED")}, seen
    info = client.wait(second.id, timeout=30)  # its turn once the first is gone
    assert info.state == "succeeded", info.reason


def test_a_job_the_lrms_ends_passes_killing_and_fails(arc_limited, make_client):
    svc = arc_limited
    client = make_client({"arc": {"type": "arc", **SITE_PYTHON, "url": svc.url,
                                  "token_uri": svc.info["token_uri"], "client_id": "cloudtik"}},
                         {("arc", "client_secret"): CLIENT_SECRET})
    job = client.submit(build_spec(None, command=["sleep", "30"], time="2s"), "arc")
    seen: list = []
    info = wait_for(lambda: _watch(client, job.id, seen), 30, 0.1, "the job to end")
    assert info.state == "failed" and "wall time" in info.reason, info.reason
    assert ("running", "KILLING") in seen, seen


def _test_ca(folder):
    """A CA, a user certificate and a certificate for 127.0.0.1, all issued by it."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    now = dt.datetime.now(dt.timezone.utc)

    def issue(subject, issuer_name, issuer_key, key, ca=False, san=None):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(hours=1))
             .not_valid_after(now + dt.timedelta(days=2))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    def name(cn):
        return x509.Name([x509.NameAttribute(x509.oid.NameOID.ORGANIZATION_NAME, "Test Grid"),
                          x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, cn)])

    def pem(obj):
        if isinstance(obj, rsa.RSAPrivateKey):
            return obj.private_bytes(serialization.Encoding.PEM,
                                     serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption())
        return obj.public_bytes(serialization.Encoding.PEM)

    ca_key, user_key, host_key = (rsa.generate_private_key(public_exponent=65537,
                                                           key_size=2048) for _ in range(3))
    ca = issue(name("Test Grid CA"), name("Test Grid CA"), ca_key, ca_key, ca=True)
    user = issue(name("Grid User"), ca.subject, ca_key, user_key)
    host = issue(name("127.0.0.1"), ca.subject, ca_key, host_key,
                 san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    out = {}
    for label, obj in (("ca", ca), ("user", user), ("user_key", user_key), ("host", host),
                       ("host_key", host_key)):
        out[label] = folder / f"{label}.pem"
        out[label].write_bytes(pem(obj))
    return out


@pytest.fixture
def arc_x509(tmp_path):
    """The emulator over HTTPS taking X.509 proxies in the handshake (as ARC 6 does)."""
    pki = _test_ca(tmp_path)
    svc = Service("cloudtik_emulators.arc", tmp_path / "arc-x509",
                  ["--tls-cert", str(pki["host"]), "--tls-key", str(pki["host_key"]),
                   "--client-ca", str(pki["ca"])]).start()
    yield svc, pki
    svc.stop()


def test_a_proxy_that_expires_while_the_job_runs_is_said_and_a_renewed_one_resumes_it(
        arc_x509, make_client, tmp_path):
    """Was (real A-REX 6.17): the job ``unknown`` for good, "did not answer".  Now: the
    proxy's notAfter is read before each call; the job waits with "your proxy
    certificate expired at T; renew it (arcproxy --proxy=FILE)" and, once the file is
    renewed, goes on by itself (one ``unavailable`` event, one ``available``)."""
    from jupyter_cloudtik.hpc.x509proxy import make_proxy, proxy_expiry

    svc, pki = arc_x509
    cert, key = pki["user"].read_text(), pki["user_key"].read_text()
    proxy = tmp_path / "x509up"
    proxy.write_text(make_proxy(cert, key, hours=4 / 3600))  # 4 seconds
    until = proxy_expiry(proxy.read_text())
    client = make_client({"arc": {"type": "arc", **SITE_PYTHON, "url": svc.url, "proxy": str(proxy),
                                  "ca_certificates": str(pki["ca"])}},
                         retry_interval_max=0.5)
    info = client.submit(build_spec(None, command=["sleep", "6"]), "arc")
    assert info.state in ("queued", "running"), info.reason
    info = wait_for(lambda: (i := client.get(info.id)).state == "unknown" and i, 15,
                    what="the proxy to expire")
    assert info.reason == (f"backend 'arc': your proxy certificate expired at {_utc(until)}; "
                           f"renew it (arcproxy --proxy={proxy}) and the backend goes on by "
                           "itself"), info.reason
    proxy.write_text(make_proxy(cert, key, hours=1))
    info = client.wait(info.id, timeout=60)
    assert info.state == "succeeded", info.reason
    steps = [e.step for e in client.events(info.id)]
    assert steps.count("unavailable") == 1 and steps.count("available") == 1, steps
