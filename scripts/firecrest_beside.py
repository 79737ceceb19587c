"""Run the real FirecREST v2 server beside the project and compare it with the emulator.

Issue 29, point 5.  Starts, all on loopback and all under ``--work`` (default
``/tmp/f7t-beside``), nothing inside the repository:

* a real Slurm 22.05 with slurmdbd accounting (``cloudtik_emulators.slurm.SlurmCluster``),
  its munge socket opened to a normal Unix user (``--user``, made with ``useradd -m`` if
  missing; needs root);
* a real ``sshd`` that lets that user in with a fresh key and sets ``SLURM_CONF``;
* a small OIDC stand-in: a JWKS (``/certs``) and a client-credentials token endpoint
  (``/token``, for FirecREST's own health probes), RS256 JWTs with ``preferred_username``;
* ``moto`` as the S3 stage (if it is installed in the FirecREST venv);
* the real FirecREST v2 (``uvicorn firecrest.main:app`` from ``--source``: a checkout, or
  the bare mirror, exported with ``git archive``) in a venv under ``--venv`` (made with
  the source's ``requirements.txt`` from PyPI if missing);
* the project's emulator (``python -m cloudtik_emulators.firecrest``) with the same
  partition as the Slurm cluster.

Then it sends the same requests to both — the calls ``jupyter_cloudtik/hpc/firecrest*.py``
makes through pyfirecrest — and prints the differences: status codes, JSON shapes (keys),
values (states, reasons, messages), and the time line of a job's states and pending
reasons.  Paths, user names, job ids and times are normalised before comparing
(``$HOME``, ``$USER``, ``$JOB``).  Secrets (keys, tokens) are never printed.

    sudo python scripts/firecrest_beside.py --source /work/.mirror/eth-cscs+firecrest-v2/repo

Run with the project's interpreter, ``PYTHONPATH=<repo>:<repo>/emulators``.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import http.server
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from jupyter_cloudtik.core import ports

SYS = "testsys"
PARTITION = "normal"
EMU_USER = "service-account-cloudtik"


def free_port() -> int:
    return ports.free_port()


def wait_port(port: int, timeout: float, proc: subprocess.Popen | None = None,
              what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}") from None
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {port}")


# --- the FirecREST source and venv -----------------------------------------------------
def firecrest_source(source: Path, work: Path) -> Path:
    if (source / "src" / "firecrest" / "main.py").exists():
        return source
    out = work / "firecrest-src"
    if not (out / "src" / "firecrest" / "main.py").exists():
        out.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(source), "archive", "HEAD"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def firecrest_venv(venv: Path, src: Path) -> Path:
    py = venv / "bin" / "python"
    if not (venv / "bin" / "uvicorn").exists():
        subprocess.run([sys.executable if shutil.which("python3") is None else "python3",
                        "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "-r",
                        str(src / "requirements.txt"), "moto[server]"], check=True)
    return venv


# --- Unix user, Slurm, sshd ------------------------------------------------------------
def ensure_user(name: str) -> pwd.struct_passwd:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True)
    # a new account is locked ("!" in /etc/shadow), which sshd refuses even for keys
    # (UsePAM no): "*" = no password, not locked
    subprocess.run(["usermod", "-p", "*", name], check=True)
    return pwd.getpwnam(name)


def open_path(p: Path) -> None:
    """Let other users traverse down to ``p`` (the munge socket, slurm.conf)."""
    for part in [p, *p.parents]:
        if str(part) in ("/", "/tmp"):
            continue
        part.chmod(part.stat().st_mode | 0o711)


def enforce_accounts(slurm: Any, user: str) -> None:
    """As real sites run Slurm: an association per user (account ``beside``), and
    ``AccountingStorageEnforce=associations``, so an unknown account is refused."""
    for argv in (["sacctmgr", "-i", "add", "account", "beside"],
                 ["sacctmgr", "-i", "add", "user", user, "account=beside"],
                 ["sacctmgr", "-i", "add", "user", "root", "account=beside"]):
        r = slurm.run(*argv, check=False)
        print(f"{' '.join(argv[:4])}...: rc={r.returncode} "
              f"{(r.stdout + r.stderr).strip()[-160:]!r}", flush=True)
    with open(slurm.conf, "a") as f:
        f.write("AccountingStorageEnforce=associations\n")
    slurm.stop_controller()
    slurm.start_controller()


def end_user_jobs(slurm: Any, user: str) -> None:
    """scancel the user's jobs (SlurmCluster.stop cancels its own user's only), then end
    what is left of their scripts (job steps outlive slurmd by design)."""
    import psutil

    slurm.run("scancel", f"--user={user}", check=False)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = slurm.run("squeue", "-h", f"--user={user}", check=False)
        if r.returncode != 0 or not r.stdout.strip():
            break
        time.sleep(0.2)
    for proc in psutil.process_iter(["username", "name"]):
        try:
            # the user's scripts, and the steps' slurmstepd (root's: it outlived slurmd)
            if (proc.info["username"] == user or proc.info["name"] == "slurmstepd") and \
                    proc.environ().get("SLURM_CONF") == str(slurm.conf):
                proc.kill()
        except (psutil.Error, OSError):
            continue


class Sshd:
    """sshd on loopback letting ``user`` in with a fresh key (as tests/hpc's Sshd)."""

    def __init__(self, folder: Path, user: str, slurm_conf: str) -> None:
        import asyncssh

        self.folder, self.user, self.port = folder, user, free_port()
        folder.mkdir(parents=True, exist_ok=True)
        host_key = asyncssh.generate_private_key("ssh-ed25519")
        (folder / "host_key").write_bytes(host_key.export_private_key())
        (folder / "host_key").chmod(0o600)
        self.client_key = asyncssh.generate_private_key("ssh-ed25519")
        (folder / "user_key").write_bytes(self.client_key.export_private_key())
        (folder / "user_key").chmod(0o600)
        (folder / "authorized_keys").write_bytes(self.client_key.export_public_key())
        (folder / "authorized_keys").chmod(0o644)
        (folder / "sshd_config").write_text(f"""\
Port {self.port}
ListenAddress 127.0.0.1
HostKey {folder}/host_key
PidFile {folder}/sshd.pid
AuthorizedKeysFile {folder}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
AllowUsers {user}
StrictModes no
UsePAM no
MaxSessions 100
MaxStartups 100:30:200
SetEnv SLURM_CONF={slurm_conf}
Subsystem sftp internal-sftp
""")
        open_path(folder)
        self.proc: subprocess.Popen | None = None

    def start(self) -> Sshd:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f",
                                      str(self.folder / "sshd_config")],
                                     stdout=subprocess.DEVNULL,
                                     stderr=open(self.folder / "sshd.log", "ab"))  # noqa: SIM115
        wait_port(self.port, 10, self.proc, "sshd")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)


# --- OIDC stand-in: JWKS + client-credentials tokens ---------------------------------
class Oidc:
    def __init__(self, user: str) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        self.user = user
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.pem = self.key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())
        nums = self.key.public_key().public_numbers()

        def b64(n: int) -> str:
            raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
            return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

        self.jwks = {"keys": [{"kty": "RSA", "kid": "beside", "use": "sig", "alg": "RS256",
                               "n": b64(nums.n), "e": b64(nums.e)}]}
        self.port = free_port()
        oidc = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._send(oidc.jwks)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._send({"access_token": oidc.token(), "token_type": "Bearer",
                            "expires_in": 600})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def token(self, ttl: int = 600) -> str:
        import jwt

        now = int(time.time())
        return jwt.encode({"sub": self.user, "preferred_username": self.user, "iat": now,
                           "exp": now + ttl, "iss": f"http://127.0.0.1:{self.port}"},
                          self.pem, algorithm="RS256", headers={"kid": "beside"})


def firecrest_config(path: Path, oidc: Oidc, user: str, key_file: Path, sshd: Sshd,
                     s3_port: int | None) -> None:
    import yaml

    data_op: dict[str, Any] = {"max_ops_file_size": 5 * 1024 * 1024,
                               "datatransfer_jobs_directives": ["#SBATCH --nodes=1",
                                                                "#SBATCH --time=0-00:15:00"]}
    if s3_port:
        data_op["data_transfer"] = {
            "name": "s3-storage", "service_type": "s3",
            "private_url": f"http://127.0.0.1:{s3_port}",
            "public_url": f"http://127.0.0.1:{s3_port}",
            "access_key_id": "beside", "secret_access_key": "beside-secret",
            "region": "us-east-1", "ttl": 3600,
            "multipart": {"use_split": False, "max_part_size": 5 * 1024 * 1024,
                          "parallel_runs": 2, "tmp_folder": "tmp"}}
    cfg = {
        "auth": {"authentication": {
            "tokenUrl": f"http://127.0.0.1:{oidc.port}/token",
            "tokenEndpointAuthMethod": "client_secret_post",
            "publicCerts": [f"http://127.0.0.1:{oidc.port}/certs"],
            "usernameClaim": "preferred_username"}},
        "ssh_credentials": {"type": "SSHStaticKeys",
                            "keys": {user: {"private_key": f"secret_file:{key_file}"}}},
        "clusters": [{
            "name": SYS,
            "ssh": {"host": "127.0.0.1", "port": sshd.port, "max_clients": 50},
            "scheduler": {"type": "slurm", "connection_mode": "ssh", "version": "22.05",
                          "timeout": 10},
            "service_account": {"client_id": "firecrest-health", "secret": "unused"},
            "probing": {"interval_check": 60, "services": {
                "scheduler": {"timeout": 10}, "filesystem": {"timeout": 10},
                "ssh": {"timeout": 10}}},
            "file_systems": [{"path": "/home", "data_type": "users",
                              "default_work_dir": True}],
            "data_operation": data_op,
        }],
    }
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)


# --- the two servers as HTTP clients -------------------------------------------------
class Side:
    def __init__(self, name: str, url: str, token: str, home: str, user: str,
                 uid: int | None = None) -> None:
        self.name, self.url, self.home, self.user, self.uid = name, url, home, user, uid
        self.http = httpx.Client(base_url=url, timeout=60,
                                 headers={"Authorization": f"Bearer {token}"})
        self.ids: dict[str, str] = {}
        self.short_token: Any = None  # makes a token with 20 s left (real side only)

    def req(self, method: str, path: str, **kw: Any) -> tuple[int, Any]:
        r = self.http.request(method, path, **kw)
        try:
            body = r.json()
        except ValueError:
            body = r.text
        return r.status_code, body

    def norm(self, value: Any) -> Any:
        """Replace this side's paths, user, ids and times with placeholders (in strings
        only; secrets are masked)."""
        if isinstance(value, dict):
            return {k: "<masked>" if SECRET.search(k) and value[k] is not None
                    else self.norm(x) for k, x in value.items()}
        if isinstance(value, list):
            return [self.norm(x) for x in value]
        if not isinstance(value, str):
            return value
        text = value.replace(self.home, "$HOME").replace(self.user, "$USER")
        # job ids are small numbers: replace them only where they are ids
        for jid, label in sorted(self.ids.items(), key=lambda kv: -len(kv[0])):
            if text == jid:
                return label
            text = re.sub(rf"^{jid}(?=_)", label, text)
            text = re.sub(rf"(job(?: id)? ){jid}(?![0-9])", rf"\g<1>{label}", text)
        return re.sub(r"CANCELLED by [0-9]+", "CANCELLED by $UID", text)


SECRET = re.compile(r"secret|accessKey|access_key|privateKey|private_key|password|token",
                    re.I)


def shape(v: Any, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(v, dict):
        out[prefix or "."] = "object"
        for k, x in v.items():
            out.update(shape(x, f"{prefix}.{k}"))
    elif isinstance(v, list):
        out[prefix or "."] = "list"
        if v:
            out.update(shape(v[0], f"{prefix}[]"))
    else:
        out[prefix or "."] = type(v).__name__
    return out


VOLATILE = re.compile(r"(time|lastChecked|latency|lastModified|start|end|elapsed|"
                      r"submit|suspended|uploadUrl|partsUploadUrls|completeUploadUrl|"
                      r"maxPartSize|downloadUrl|transferJob|numParts|jobId)", re.I)


def flatten(v: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(v, dict):
        for k, x in v.items():
            out.update(flatten(x, f"{prefix}.{k}"))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out.update(flatten(x, f"{prefix}[{i}]"))
    else:
        out[prefix or "."] = v
    return out


class Report:
    def __init__(self) -> None:
        self.diffs: list[str] = []
        self.same: list[str] = []

    def compare(self, what: str, real: tuple[int, Any], emu: tuple[int, Any],
                values: bool = True) -> None:
        found: list[str] = []
        if real[0] != emu[0]:
            found.append(f"status: real {real[0]} | emulator {emu[0]}")
        rs, es = shape(real[1]), shape(emu[1])
        for k in sorted(set(rs) | set(es)):
            if rs.get(k) != es.get(k):
                found.append(f"shape {k}: real {rs.get(k)} | emulator {es.get(k)}")
        if values:
            rf, ef = flatten(real[1]), flatten(emu[1])
            for k in sorted(set(rf) & set(ef)):
                if VOLATILE.search(k.rsplit(".", 1)[-1]):
                    continue
                if rf[k] != ef[k]:
                    found.append(f"value {k}: real {short(rf[k])} | emulator {short(ef[k])}")
        if found:
            self.diffs.append(what)
            print(f"\n## DIFF {what}")
            for line in found[:40]:
                print(f"   {line}")
            if len(found) > 40:
                print(f"   ... {len(found) - 40} more")
        else:
            self.same.append(what)
            print(f"\n## same {what}  (status {real[0]})")

    def note(self, what: str, real: Any, emu: Any, n: int = 600) -> None:
        same = real == emu
        (self.same if same else self.diffs).append(what)
        print(f"\n## {'same' if same else 'DIFF'} {what}")
        print(f"   real     : {short(real, n)}")
        print(f"   emulator : {short(emu, n)}")


def short(v: Any, n: int = 240) -> str:
    s = json.dumps(v) if not isinstance(v, str) else repr(v)
    return s if len(s) <= n else s[:n] + "..."


def both(fn, real: Side, emu: Side) -> tuple[Any, Any]:
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        a, b = ex.submit(fn, real), ex.submit(fn, emu)
        return a.result(), b.result()


# --- the probes ------------------------------------------------------------------------
def submit(side: Side, label: str, script: str, wd: str | None = None,
           **job: Any) -> tuple[int, Any]:
    body = {"job": {"name": label, "workingDirectory": wd or side.home, "script": script,
                    **job}}
    st, res = side.req("POST", f"/compute/{SYS}/jobs", json=body)
    if st == 201 and isinstance(res, dict) and "jobId" in res:
        side.ids[str(res["jobId"])] = f"$JOB:{label}"
    return st, res


def timeline(side: Side, jid: str, seconds: float, step: float = 0.5,
             until_final: bool = True) -> list[tuple[float, str, str]]:
    """(seconds since submit, state, reason) each time either changes."""
    out: list[tuple[float, str, str]] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        st, body = side.req("GET", f"/compute/{SYS}/jobs/{jid}")
        if st == 200 and body.get("jobs"):
            j = body["jobs"][0]
            s = j.get("status") or {}
            cur = (s.get("state"), s.get("stateReason"), s.get("exitCode"))
        else:
            cur = (f"HTTP {st}", short(body, 80), None)
        if not out or out[-1][1:] != cur:
            out.append((round(time.monotonic() - t0, 1), *cur))
        if (until_final and cur[0] in ("COMPLETED", "FAILED", "TIMEOUT")) or \
                (cur[0] or "").startswith("CANCELLED"):
            break
        time.sleep(step)
    return out


def states(tl: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [x[1:] for x in tl]


def run_probes(real: Side, emu: Side, rep: Report, s3: bool) -> None:
    # status ----------------------------------------------------------------------------
    def systems(s: Side):
        st, b = s.req("GET", "/status/systems")
        return st, s.norm(b)
    r, e = both(systems, real, emu)
    rep.compare("GET /status/systems", r, e)
    raw = real.http.get("/status/systems").text
    rep.note("/status/systems shows the configured S3 secret key in clear",
             "beside-secret" in raw, False)
    for path in (f"/status/{SYS}/userinfo", f"/status/{SYS}/partitions",
                 "/status/nosuch/partitions", f"/status/{SYS.upper()}/partitions"):
        r, e = both(lambda s, p=path: (lambda x: (x[0], s.norm(x[1])))(s.req("GET", p)),
                    real, emu)
        rep.compare(f"GET {path}", r, e)

    # jobs over their life -----------------------------------------------------------
    ok_script = "#!/bin/bash\n#SBATCH --time=00:05:00\nsleep 4\necho out-line\nexit 3\n"

    def life(s: Side):
        st, res = submit(s, "life", ok_script)
        if st != 201:
            return (st, s.norm(res)), [], None, None
        jid = str(res["jobId"])
        seen = s.norm(s.req("GET", f"/compute/{SYS}/jobs/{jid}"))
        tl = timeline(s, jid, 40)
        final = s.req("GET", f"/compute/{SYS}/jobs/{jid}")
        meta = s.req("GET", f"/compute/{SYS}/jobs/{jid}/metadata")
        listing = s.req("GET", f"/compute/{SYS}/jobs")
        mine = [j for j in (listing[1].get("jobs") or []) if str(j.get("jobId")) == jid] \
            if listing[0] == 200 else listing
        return (st, s.norm(res)), tl, (final[0], s.norm(final[1])), \
            (meta[0], s.norm(meta[1]), listing[0], s.norm(mine), seen)
    (rs, rtl, rfin, rmeta), (es, etl, efin, emeta) = both(life, real, emu)
    rep.compare("POST /compute/jobs (ok job): answer", rs, es)
    rep.note("job life: (state, reason) sequence", states(rtl), states(etl))
    print(f"   real timeline     : {rtl}")
    print(f"   emulator timeline : {etl}")
    if rfin and efin:
        rep.compare("GET /compute/jobs/{id} (final)", rfin, efin)
        rep.compare("GET /compute/jobs/{id} (first answer after submit)",
                    rmeta[4], emeta[4])
        rep.compare("GET /compute/jobs/{id}/metadata (final)", rmeta[:2], emeta[:2])
        rep.compare("GET /compute/jobs (list entry of the job)", (rmeta[2], rmeta[3]),
                    (emeta[2], emeta[3]))

    # refusals and limits ------------------------------------------------------------
    def over_time(s: Side):
        st, res = submit(s, "overtime", "#!/bin/bash\n#SBATCH --time=02:00:00\nsleep 1\n")
        if st != 201:
            return (st, s.norm(res)), []
        jid = str(res["jobId"])
        first = s.req("GET", f"/compute/{SYS}/jobs/{jid}")
        s.ids[jid] = "$JOB:overtime"
        tl = timeline(s, jid, 25, 0.25, until_final=False)
        tl.insert(0, (first[0], s.norm(first[1])))
        s.req("DELETE", f"/compute/{SYS}/jobs/{jid}")
        return (st, s.norm(res)), tl
    (rs, rtl), (es, etl) = both(over_time, real, emu)
    rep.compare("POST job over the partition's time limit", rs, es)
    if rtl and etl:
        rep.compare("GET /compute/jobs/{id} of a PENDING job (first answer)", rtl.pop(0),
                    etl.pop(0))
    rep.note("over-time job: (state, reason) sequence (25 s)", states(rtl), states(etl))
    print(f"   real timeline     : {rtl}")
    print(f"   emulator timeline : {etl}")

    def refused_later(label: str, directive: str, seconds: float, what: str) -> None:
        """A job Slurm takes and leaves pending on a reason: the submit answer and its
        (state, reason) sequence for ``seconds``, on both sides."""
        def probe(s: Side):
            st, res = submit(s, label, f"#!/bin/bash\n#SBATCH {directive}\nsleep 1\n")
            if st != 201:
                return (st, s.norm(res)), []
            jid = str(res["jobId"])
            tl = timeline(s, jid, seconds, 0.25, until_final=False)
            s.req("DELETE", f"/compute/{SYS}/jobs/{jid}")
            return (st, s.norm(res)), tl
        (rs, rtl), (es, etl) = both(probe, real, emu)
        rep.compare(f"POST job with more {what} than the partition", rs, es)
        rep.note(f"too-many-{what} job: (state, reason) sequence ({seconds:.0f} s)",
                 states(rtl), states(etl))
        print(f"   real timeline     : {rtl}")
        print(f"   emulator timeline : {etl}")

    refused_later("cpus", "--cpus-per-task=4", 15, "CPUs")
    refused_later("nodes", "--nodes=2", 10, "nodes")

    def per_node(s: Side):
        st, res = submit(s, "pernode", "#!/bin/bash\n#SBATCH --ntasks-per-node=3\n"
                                       "#SBATCH --nodes=1\nsleep 1\n")
        return st, s.norm(res)
    r, e = both(per_node, real, emu)
    rep.compare("POST job with more tasks per node than a node has", r, e)

    for label, script, extra in (
            ("badpart", "#!/bin/bash\n#SBATCH --partition=nosuch\ntrue\n", {}),
            ("badmem", "#!/bin/bash\n#SBATCH --mem=900000\ntrue\n", {}),
            ("badopt", "#!/bin/bash\n#SBATCH --no-such-option\ntrue\n", {}),
            ("badacct", "#!/bin/bash\n#SBATCH --account=nosuchacct\ntrue\n", {}),
            ("nowd", "#!/bin/bash\ntrue\n", {"workingDirectory": None})):
        def refused(s: Side, label=label, script=script, extra=extra):
            if extra.get("workingDirectory", "") is None:
                st, b = s.req("POST", f"/compute/{SYS}/jobs",
                              json={"job": {"name": label, "script": script}})
                return st, s.norm(b)
            st, b = submit(s, label, script)
            return st, s.norm(b)
        r, e = both(refused, real, emu)
        rep.compare(f"POST job refused? ({label})", r, e)

    def missing_wd(s: Side):
        st, res = submit(s, "missingwd", "#!/bin/bash\ntrue\n", wd=f"{s.home}/no/such")
        if st != 201:
            return (st, s.norm(res)), []
        return (st, s.norm(res)), timeline(s, str(res["jobId"]), 20)
    (rs, rtl), (es, etl) = both(missing_wd, real, emu)
    rep.compare("POST job with a missing working folder", rs, es)
    rep.note("missing-workdir job: sequence", states(rtl), states(etl))

    # cancel ---------------------------------------------------------------------------
    def cancel(s: Side):
        st, res = submit(s, "cancel", "#!/bin/bash\nsleep 120\n")
        if st != 201:
            return [(st, s.norm(res))]
        jid = str(res["jobId"])
        time.sleep(3)
        out = [s.req("DELETE", f"/compute/{SYS}/jobs/{jid}")]
        tl = timeline(s, jid, 20)
        out.append([list(x) for x in states(tl)])
        out.append(s.req("DELETE", f"/compute/{SYS}/jobs/{jid}"))  # again: finished
        return [s.norm(x) for x in out]
    r, e = both(cancel, real, emu)
    rep.compare("DELETE running job", tuple(r[0]), tuple(e[0]))
    if len(r) > 1 and len(e) > 1:
        rep.note("cancelled job: sequence", r[1], e[1])
        rep.compare("DELETE finished job", tuple(r[2]), tuple(e[2]))
    for path in (f"/compute/{SYS}/jobs/999999", f"/compute/{SYS}/jobs/abc",
                 f"/compute/{SYS}/jobs/123_4"):
        r, e = both(lambda s, p=path: (lambda x: (x[0], s.norm(x[1])))(s.req("GET", p)),
                    real, emu)
        rep.compare(f"GET {path}", r, e)
        r, e = both(lambda s, p=path: (lambda x: (x[0], s.norm(x[1])))(s.req("DELETE", p)),
                    real, emu)
        rep.compare(f"DELETE {path}", r, e)
    for window in ("7d", "2d"):
        r, e = both(lambda s, w=window: (lambda x: (x[0], shape(s.norm(x[1]))))(
            s.req("GET", f"/compute/{SYS}/jobs", params={"time_window": w})), real, emu)
        rep.compare(f"GET /compute/jobs?time_window={window} (shape)", r, e, values=False)

    # job array ----------------------------------------------------------------------
    def array(s: Side):
        st, res = submit(s, "array", "#!/bin/bash\n#SBATCH --array=0-3%2\n"
                                     "#SBATCH --time=00:05:00\nsleep 3\n"
                                     "exit $SLURM_ARRAY_TASK_ID\n")
        if st != 201:
            return (st, s.norm(res)), [], None
        jid = str(res["jobId"])
        seen: list[list[tuple[str, str, str, Any]]] = []
        seen_by_id: list[Any] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 45:
            lst = s.req("GET", f"/compute/{SYS}/jobs")
            # every entry of the array: by its name (a task split off the array gets a
            # job id of its own in squeue)
            rows = sorted((str(j.get("jobId")), (j.get("status") or {}).get("state"),
                           (j.get("status") or {}).get("stateReason"),
                           (j.get("status") or {}).get("exitCode"))
                          for j in (lst[1].get("jobs") or []) if lst[0] == 200
                          and j.get("name") == "array")
            rows = [tuple(s.norm(list(x))) for x in rows]
            one = s.req("GET", f"/compute/{SYS}/jobs/{jid}")  # the whole array, by its id
            by_id = sorted(tuple(s.norm([str(j.get("jobId")),
                                         (j.get("status") or {}).get("state"),
                                         (j.get("status") or {}).get("stateReason")]))
                           for j in (one[1].get("jobs") or []) if one[0] == 200) \
                if one[0] == 200 else [(one[0],)]
            if not seen or seen[-1] != rows:
                seen.append(rows)
            if not seen_by_id or seen_by_id[-1] != by_id:
                seen_by_id.append(by_id)
            if rows and all(x[1] in ("COMPLETED", "FAILED") for x in rows) and len(rows) >= 4:
                break
            time.sleep(0.5)
        one = s.req("GET", f"/compute/{SYS}/jobs/{jid}")
        return (st, s.norm(res)), seen, (one[0], s.norm(one[1])), seen_by_id
    (rs, rseen, rone, rby), (es, eseen, eone, eby) = both(array, real, emu)
    rep.note("array: GET /jobs/{array id} rows (jobId, state, reason) as they changed",
             rby, eby, 4000)
    rep.compare("POST job array --array=0-3%2", rs, es)
    rep.note("array: listing rows (jobId, state, reason, exit) as they changed",
             rseen, eseen, 4000)
    if rone and eone:
        rep.compare("GET /compute/jobs/{array id} after the end", rone, eone)

    def held_array(s: Side):
        """An array Slurm cannot start yet (``--begin``): what the listing and
        ``GET /jobs/{id}`` say about tasks that were never split off."""
        st, res = submit(s, "held", "#!/bin/bash\n#SBATCH --array=0-3%2\n"
                                    "#SBATCH --begin=now+120\nsleep 1\n")
        if st != 201:
            return (st, s.norm(res)), []
        jid = str(res["jobId"])
        seen: list[Any] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 8:
            lst = s.req("GET", f"/compute/{SYS}/jobs")
            one = s.req("GET", f"/compute/{SYS}/jobs/{jid}")
            snap = {"listing": sorted(tuple(s.norm([str(j.get("jobId")),
                                                     (j.get("status") or {}).get("state"),
                                                     (j.get("status") or {}).get("stateReason")]))
                                      for j in (lst[1].get("jobs") or [])
                                      if j.get("name") == "held"),
                    "by_id": sorted(tuple(s.norm([str(j.get("jobId")),
                                                   (j.get("status") or {}).get("state"),
                                                   (j.get("status") or {}).get("stateReason")]))
                                    for j in (one[1].get("jobs") or [])) if one[0] == 200
                    else [(one[0],)]}
            if not seen or seen[-1] != snap:
                seen.append(snap)
            time.sleep(0.5)
        s.req("DELETE", f"/compute/{SYS}/jobs/{jid}")
        return (st, s.norm(res)), seen
    (rs, rseen), (es, eseen) = both(held_array, real, emu)
    rep.compare("POST array held by --begin", rs, es)
    rep.note("held array: listing and GET /jobs/{id} rows as they changed (8 s)",
             rseen, eseen, 4000)

    # files ------------------------------------------------------------------------------
    def files(s: Side):
        base = f"{s.home}/beside"
        out: dict[str, tuple[int, Any]] = {}

        def rec(name: str, method: str, path: str, **kw: Any) -> None:
            st, b = s.req(method, path, **kw)
            out[name] = (st, s.norm(b))
        fs = f"/filesystem/{SYS}/ops"
        s.req("DELETE", f"{fs}/rm", params={"path": base})
        rec("mkdir (no parent, missing parent)", "POST", f"{fs}/mkdir",
            json={"path": f"{base}/a/b"})
        rec("mkdir parent=true", "POST", f"{fs}/mkdir", json={"path": f"{base}/a/b",
                                                             "parent": True})
        rec("mkdir again parent=true", "POST", f"{fs}/mkdir",
            json={"path": f"{base}/a/b", "parent": True})
        rec("mkdir on the mount (not writable)", "POST", f"{fs}/mkdir",
            json={"path": f"{s.home.rsplit('/', 1)[0]}/beside-x", "parent": True})
        text = "".join(f"line {i} é\n" for i in range(200))
        rec("upload small", "POST", f"{fs}/upload", params={"path": f"{base}/a"},
            files={"file": ("t.txt", text.encode())})
        rec("upload to missing folder", "POST", f"{fs}/upload",
            params={"path": f"{base}/nosuch"}, files={"file": ("t.txt", b"x")})
        rec("upload over the limit", "POST", f"{fs}/upload", params={"path": f"{base}/a"},
            files={"file": ("big", b"x" * (5 * 1024 * 1024 + 1))})
        rec("ls", "GET", f"{fs}/ls", params={"path": f"{base}/a"})
        rec("ls recursive", "GET", f"{fs}/ls", params={"path": base, "recursive": True})
        rec("ls missing", "GET", f"{fs}/ls", params={"path": f"{base}/nosuch"})
        rec("ls outside the file systems", "GET", f"{fs}/ls", params={"path": "/etc"})
        rec("head lines=3", "GET", f"{fs}/head", params={"path": f"{base}/a/t.txt",
                                                         "lines": 3})
        rec("head bytes=10", "GET", f"{fs}/head", params={"path": f"{base}/a/t.txt",
                                                          "bytes": 10})
        rec("tail lines=2", "GET", f"{fs}/tail", params={"path": f"{base}/a/t.txt",
                                                         "lines": 2})
        rec("view offset=5 size=20", "GET", f"{fs}/view",
            params={"path": f"{base}/a/t.txt", "offset": 5, "size": 20})
        rec("view whole", "GET", f"{fs}/view", params={"path": f"{base}/a/t.txt"})
        rec("view folder", "GET", f"{fs}/view", params={"path": f"{base}/a"})
        rec("view missing", "GET", f"{fs}/view", params={"path": f"{base}/nosuch"})
        rec("stat", "GET", f"{fs}/stat", params={"path": f"{base}/a/t.txt"})
        rec("stat missing", "GET", f"{fs}/stat", params={"path": f"{base}/nosuch"})
        rec("checksum", "GET", f"{fs}/checksum", params={"path": f"{base}/a/t.txt"})
        rec("download", "GET", f"{fs}/download", params={"path": f"{base}/a/t.txt"})
        rec("download missing", "GET", f"{fs}/download",
            params={"path": f"{base}/nosuch"})
        rec("rm file", "DELETE", f"{fs}/rm", params={"path": f"{base}/a/t.txt"})
        rec("rm missing", "DELETE", f"{fs}/rm", params={"path": f"{base}/a/t.txt"})
        rec("rm folder", "DELETE", f"{fs}/rm", params={"path": f"{base}/a"})
        return out
    r, e = both(files, real, emu)
    for k in r:
        rep.compare(f"filesystem {k}", r[k], e[k])

    def limits(s: Side):
        """A 4 MiB file (under the 5 MiB direct limit): view without size, download."""
        out: dict[str, tuple[int, Any]] = {}
        fs = f"/filesystem/{SYS}/ops"
        s.req("POST", f"{fs}/upload", params={"path": s.home},
              files={"file": ("four.bin", b"a" * (4 * 1024 * 1024))})
        for name, path, params in (
                ("view of 4 MiB without size", "view", {}),
                ("view of 4 MiB size=2.5 MiB", "view", {"size": 5 * 512 * 1024}),
                ("view of 4 MiB size=1 MiB", "view", {"size": 1024 * 1024}),
                ("download of 4 MiB", "download", {})):
            st, b = s.req("GET", f"{fs}/{path}", params={"path": f"{s.home}/four.bin",
                                                         **params})
            out[name] = (st, s.norm(b) if st != 200 else f"<{len(str(b))} chars>")
        s.req("DELETE", f"{fs}/rm", params={"path": f"{s.home}/four.bin"})
        return out
    r, e = both(limits, real, emu)
    for k in r:
        rep.compare(f"limits {k}", r[k], e[k])

    def tokens(s: Side, make_short: Any):
        out = {}
        with httpx.Client(base_url=s.url, timeout=30) as c:
            r = c.get(f"/status/{SYS}/userinfo")
            out["no token"] = (r.status_code, s.norm(r.json()))
            r = c.get(f"/status/{SYS}/userinfo", headers={"Authorization": "Bearer x.y.z"})
            out["bad token"] = (r.status_code, s.norm(r.json()))
            if make_short:
                r = c.get(f"/status/{SYS}/userinfo",
                          headers={"Authorization": f"Bearer {make_short()}"})
                out["token with 20 s left"] = (r.status_code, s.norm(r.json()))
        return out
    r = tokens(real, real.short_token)
    e = tokens(emu, emu.short_token)
    for k in r:
        if k in e:
            rep.compare(f"auth {k}", r[k], e[k])
        else:
            print(f"\n## real only: auth {k}: {short(r[k])}")

    # staged transfers ---------------------------------------------------------------
    if not s3:
        print("\n## skipped: transfer endpoints (no S3 stage: moto not available)")
        return

    def transfers(s: Side):
        """The backend's staged path, through pyfirecrest as the backend calls it."""
        import tempfile

        import firecrest as f7t

        class Auth:
            def get_access_token(self) -> str:
                return s.http.headers["Authorization"].split()[1]
        out: dict[str, Any] = {}
        c = f7t.v2.Firecrest(s.url, authorization=Auth())
        c.timeout = 60
        with tempfile.TemporaryDirectory() as tmp:
            big = Path(tmp) / "big.bin"
            big.write_bytes(os.urandom(6 * 1024 * 1024))
            t0 = time.monotonic()
            try:
                c.upload(SYS, str(big), s.home, "staged.bin")  # over 5 MiB: staged
                st, b = s.req("GET", f"/filesystem/{SYS}/ops/stat",
                              params={"path": f"{s.home}/staged.bin"})
                out["staged upload of 6 MiB"] = ("ok", (b.get("output") or {}).get("size")
                                                 if st == 200 else (st, s.norm(b)))
            except Exception as exc:
                out["staged upload of 6 MiB"] = ("error", type(exc).__name__,
                                                 s.norm(str(exc))[:300])
            out["staged upload took (s)"] = round(time.monotonic() - t0)
            t0 = time.monotonic()
            back = Path(tmp) / "back.bin"
            try:
                c.download(SYS, f"{s.home}/staged.bin", str(back))
                out["staged download of 6 MiB"] = ("ok", back.read_bytes() ==
                                                   big.read_bytes())
            except Exception as exc:
                out["staged download of 6 MiB"] = ("error", type(exc).__name__,
                                                   s.norm(str(exc))[:300])
            out["staged download took (s)"] = round(time.monotonic() - t0)
        for name, params in (("view of the 6 MiB file without size", {}),
                             ("view of the 6 MiB file size=2.5 MiB", {"size": 5 * 512 * 1024}),
                             ("view of the 6 MiB file size=2 MiB", {"size": 2 * 1024 * 1024})):
            st, b = s.req("GET", f"/filesystem/{SYS}/ops/view",
                          params={"path": f"{s.home}/staged.bin", **params})
            out[name] = (st, s.norm(b) if st != 200 else "<200>")
        st, b = s.req("POST", f"/filesystem/{SYS}/transfer/upload", json={
            "path": f"{s.home}/shape.bin",
            "transfer_directives": {"file_size": 6 * 1024 * 1024, "transfer_method": "s3"}})
        out["POST transfer/upload answer (shape)"] = (st, shape(s.norm(b)))
        st, b = s.req("POST", f"/filesystem/{SYS}/transfer/download", json={
            "source_path": f"{s.home}/nosuch",
            "transfer_directives": {"transferMethod": "s3"}})
        out["POST transfer/download of a missing file"] = (st, s.norm(b))
        return out
    r, e = both(transfers, real, emu)
    for k in r:
        if isinstance(r[k], tuple) and len(r[k]) == 2 and isinstance(r[k][0], int):
            rep.compare(f"transfer {k}", r[k], e[k], values="shape" not in k)
        else:
            rep.note(f"transfer {k}", r[k], e[k])


# --- main ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True,
                    help="firecrest-v2 checkout, or its bare mirror (exported with git)")
    ap.add_argument("--work", default="/tmp/f7t-beside")
    ap.add_argument("--venv", default="/tmp/f7t/venv")
    ap.add_argument("--user", default="f7tuser")
    ap.add_argument("--no-enforce", action="store_true",
                    help="leave Slurm's AccountingStorageEnforce unset (any account goes)")
    ap.add_argument("--keep", action="store_true", help="keep everything running (Ctrl-C)")
    args = ap.parse_args(argv)
    if os.getuid() != 0:
        ap.error("needs root (useradd, sshd, Slurm's slurmd)")
    from cloudtik_emulators.slurm import SlurmCluster

    work = Path(args.work)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    src = firecrest_source(Path(args.source), work)
    venv = firecrest_venv(Path(args.venv), src)
    pw = ensure_user(args.user)
    stack: list[Any] = []
    procs: list[subprocess.Popen] = []
    try:
        t0 = time.monotonic()
        slurm = SlurmCluster(work / "slurm", cpus=2, memory_mb=2000, max_time_minutes=60,
                             partition=PARTITION, accounting=True).start()
        stack.append(slurm)
        open_path(slurm.folder / "munge")
        (slurm.folder / "munge").chmod(0o755)
        if not args.no_enforce:
            enforce_accounts(slurm, args.user)
        print(f"slurm up in {time.monotonic() - t0:.1f} s", flush=True)
        sshd = Sshd(work / "sshd", args.user, str(slurm.conf)).start()
        stack.append(sshd)
        check = subprocess.run(
            ["ssh", "-p", str(sshd.port), "-i", str(sshd.folder / "user_key"),
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
             "-o", "BatchMode=yes", f"{args.user}@127.0.0.1", "id -un; sinfo -h"],
            capture_output=True, text=True, timeout=30)
        print(f"ssh as {args.user}: rc={check.returncode} {check.stdout.strip()!r} "
              f"{check.stderr.strip()[-300:]!r}", flush=True)
        oidc = Oidc(args.user)
        s3_port = None
        if (venv / "bin" / "moto_server").exists():
            s3_port = free_port()
            moto = subprocess.Popen([str(venv / "bin" / "moto_server"), "-H", "127.0.0.1",
                                     "-p", str(s3_port)], stdout=subprocess.DEVNULL,
                                    stderr=open(work / "moto.log", "ab"))  # noqa: SIM115
            procs.append(moto)
            wait_port(s3_port, 30, moto, "moto")
        cfg = work / "f7t-config.yaml"
        firecrest_config(cfg, oidc, args.user, sshd.folder / "user_key", sshd, s3_port)
        f7t_port = free_port()
        env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)},
               "YAML_CONFIG_FILE": str(cfg), "PYTHONPATH": str(src / "src"),
               "AWS_ACCESS_KEY_ID": "beside", "AWS_SECRET_ACCESS_KEY": "beside-secret"}
        f7t = subprocess.Popen([str(venv / "bin" / "uvicorn"), "firecrest.main:app",
                                "--host", "127.0.0.1", "--port", str(f7t_port)],
                               cwd=str(src / "src"), env=env, stdout=subprocess.DEVNULL,
                               stderr=open(work / "firecrest.log", "ab"))  # noqa: SIM115
        procs.append(f7t)
        wait_port(f7t_port, 60, f7t, "FirecREST (see firecrest.log)")
        print(f"FirecREST up on 127.0.0.1:{f7t_port}", flush=True)
        emu_root = work / "emu-root"
        emu_env = {**os.environ, "EMULATOR_CLIENT_SECRET": secrets.token_urlsafe(16),
                   "EMULATOR_ADMIN_TOKEN": secrets.token_urlsafe(16)}
        emu = subprocess.Popen(
            [sys.executable, "-m", "cloudtik_emulators.firecrest", "--root", str(emu_root),
             "--system", SYS, "--partitions",
             json.dumps({PARTITION: {"max_time": 3600, "cpus": 2, "nodes": 1,
                                     "memory_mb": 2000, "default": True}}),
             *([] if s3_port else ["--no-staging"])],
            stdout=subprocess.PIPE, stderr=open(work / "emulator.log", "ab"),  # noqa: SIM115
            env=emu_env, text=True)
        procs.append(emu)
        info = json.loads(emu.stdout.readline())
        emu_tok = httpx.post(info["token_uri"], data={
            "grant_type": "client_credentials", "client_id": "cloudtik",
            "client_secret": emu_env["EMULATOR_CLIENT_SECRET"]}).json()["access_token"]
        real = Side("real", f"http://127.0.0.1:{f7t_port}", oidc.token(3000), pw.pw_dir,
                    args.user, pw.pw_uid)
        emulator = Side("emulator", info["url"], emu_tok, f"{emu_root}/{EMU_USER}", EMU_USER,
                        None)
        (emu_root / EMU_USER).mkdir(parents=True, exist_ok=True)
        real.short_token = lambda: oidc.token(20)
        rep = Report()
        run_probes(real, emulator, rep, s3_port is not None)
        print(f"\n== {len(rep.diffs)} differing, {len(rep.same)} same ==")
        for d in rep.diffs:
            print(f"  DIFF {d}")
        if args.keep:
            print("running; Ctrl-C stops", flush=True)
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
        return 0
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        for s in reversed(stack):
            try:
                if hasattr(s, "conf"):  # the Slurm cluster: end the user's jobs first
                    end_user_jobs(s, args.user)
                s.stop()
            except Exception as exc:
                print(f"stopping {type(s).__name__}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
