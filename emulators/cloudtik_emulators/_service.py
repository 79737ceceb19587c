"""What the FirecREST and ARC emulators share: an OIDC token issuer, fault injection, a
runner for submitted job scripts, and the tornado plumbing.

The token issuer is a small OpenID Connect provider: the client-credentials grant at
``/auth/token`` (client secret in the body or in HTTP Basic, as ``client_secret_post`` and
``client_secret_basic``), RS256-signed JWTs with a ``kid``, and the public keys at
``/auth/certs``.  Services check the signature, the expiry and the audience, as the real
ones do.

Faults are set over an admin route (``POST /_emulator/faults`` with the admin token in
``X-Emulator-Admin``): ``down`` (every API call answers 503), ``fail`` rules (status for
matching method/path, a number of times), ``throttle`` (429 with ``Retry-After``),
``token_ttl`` (short-lived tokens), ``revoke`` (all issued tokens become invalid),
``queue_delay`` (jobs wait that long before they start).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import jwt
import psutil
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from tornado import web

from jupyter_cloudtik.core import env as envnames
from jupyter_cloudtik.core.process_groups import GroupRef, signal_group, writes_under

ADMIN_HEADER = "X-Emulator-Admin"


class TokenIssuer:
    def __init__(self, clients: dict[str, str], issuer: str, audience: str,
                 ttl: float = 300.0, key_file: Path | None = None) -> None:
        self.clients = dict(clients)
        self.issuer, self.audience, self.ttl = issuer, audience, ttl
        self.key = _signing_key(key_file)
        self.kid = hashlib.sha256(self.key.public_key().public_bytes(
            serialization.Encoding.DER,
            serialization.PublicFormat.SubjectPublicKeyInfo)).hexdigest()[:16]
        self.not_before = 0.0  # tokens issued before this are revoked
        self.issued = 0

    def issue(self, client_id: str, client_secret: str) -> dict[str, Any] | None:
        if self.clients.get(client_id) is None or not secrets.compare_digest(
                self.clients[client_id], client_secret):
            return None
        now = time.time()
        claims = {"iss": self.issuer, "aud": self.audience, "sub": client_id,
                  "azp": client_id, "preferred_username": f"service-account-{client_id}",
                  "clientId": client_id, "iat": int(now), "nbf": int(now) - 1,
                  "exp": int(now + self.ttl), "jti": uuid.uuid4().hex, "iat_f": now}
        self.issued += 1
        token = jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": self.kid})
        return {"access_token": token, "token_type": "Bearer", "expires_in": int(self.ttl),
                "scope": "openid"}

    def verify(self, token: str) -> dict[str, Any]:
        """The token's claims; raises ``PermissionError`` with the reason."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise PermissionError("Access token is invalid.") from None
        if header.get("kid") != self.kid:
            raise PermissionError("Token's public key not found.")
        try:
            claims = jwt.decode(token, self.key.public_key(), algorithms=["RS256"],
                                audience=self.audience, issuer=self.issuer)
        except jwt.ExpiredSignatureError:
            raise PermissionError("Access token expired") from None
        except jwt.PyJWTError:
            raise PermissionError("Access token is invalid.") from None
        if claims.get("iat_f", 0) < self.not_before:
            raise PermissionError("Access token is invalid.")
        return claims

    def jwks(self) -> dict[str, Any]:
        nums = self.key.public_key().public_numbers()

        def b64(n: int) -> str:
            raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
            return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

        return {"keys": [{"kty": "RSA", "kid": self.kid, "alg": "RS256", "use": "sig",
                          "n": b64(nums.n), "e": b64(nums.e)}]}


def _signing_key(path: Path | None) -> rsa.RSAPrivateKey:
    """The issuer's key; kept in a file so a restarted service accepts earlier tokens."""
    if path is not None and path.exists():
        return serialization.load_pem_private_key(path.read_bytes(), password=None)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if path is not None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return key


class Faults:
    def __init__(self) -> None:
        self.down = False
        self.rules: list[dict[str, Any]] = []
        self.throttle = 0
        self.retry_after = 1
        self.queue_delay = 0.0
        self.lock = threading.Lock()

    def set(self, data: dict[str, Any], issuer: TokenIssuer | None) -> None:
        with self.lock:
            if "down" in data:
                self.down = bool(data["down"])
            if "fail" in data:
                self.rules = [dict(r) for r in data["fail"] or []]
            if "throttle" in data:
                t = data["throttle"] or {}
                self.throttle = int(t.get("count", 0))
                self.retry_after = int(t.get("retry_after", 1))
            if "queue_delay" in data:
                self.queue_delay = float(data["queue_delay"])
            if issuer is not None:
                if "token_ttl" in data:
                    issuer.ttl = float(data["token_ttl"])
                if data.get("revoke"):
                    issuer.not_before = time.time()

    def check(self, method: str, path: str) -> tuple[int, str, dict[str, str], bool] | None:
        """The fault to answer this request with, if any: (status, message, headers, after).

        ``after``: the request is carried out, then its answer is replaced by the error —
        the service did the work but the client never heard (a gateway timeout).
        """
        with self.lock:
            if self.down:
                return 503, "Service Unavailable", {}, False
            if self.throttle > 0:
                self.throttle -= 1
                return 429, "Too Many Requests", {"Retry-After": str(self.retry_after)}, False
            for rule in self.rules:
                if rule.get("count", 1) <= 0:
                    continue
                if rule.get("method") and rule["method"].upper() != method.upper():
                    continue
                if rule.get("path") and not re.search(rule["path"], path):
                    continue
                rule["count"] = rule.get("count", 1) - 1
                return (int(rule.get("status", 500)), rule.get("message", "injected fault"), {},
                        bool(rule.get("after")))
        return None


class DetachedJobs:
    """Runs job scripts as detached processes whose fate is kept in files.

    A job's bookkeeping folder holds ``pid`` (pid and start time), ``exitcode`` and
    ``cancelled``, so an emulator restarted mid-job still knows how each job ended.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._procs: dict[str, subprocess.Popen] = {}

    def job_folder(self, key: str) -> Path:
        return self.folder / key

    def start(self, key: str, script: str, cwd: Path, env: dict[str, str], stdout: Path,
              stderr: Path, time_limit: float | None = None, delay: float = 0.0) -> None:
        bk = self.job_folder(key)
        bk.mkdir(parents=True, exist_ok=True)
        (bk / "script.sh").write_text(script)
        limit = f"timeout --signal=TERM {int(time_limit)} " if time_limit else ""
        wrapper = (
            f"sleep {delay}; date +%s > {q(bk / 'started')}; "
            f"{limit}bash {q(bk / 'script.sh')} < /dev/null > {q(stdout)} 2> {q(stderr)}; "
            f"echo $? > {q(bk / 'exitcode.tmp')}; mv {q(bk / 'exitcode.tmp')} "
            f"{q(bk / 'exitcode')}")
        stdout.parent.mkdir(parents=True, exist_ok=True)
        stderr.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(["bash", "-c", wrapper], cwd=cwd, env=env,
                                start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started = psutil.Process(proc.pid).create_time()
        (bk / "pid").write_text(f"{proc.pid} {started}\n")
        self._procs[key] = proc
        threading.Thread(target=proc.wait, daemon=True).start()

    def state(self, key: str) -> tuple[str, int | None]:
        """(PENDING|RUNNING|COMPLETED|FAILED|CANCELLED|TIMEOUT|LOST, exit code)."""
        bk = self.job_folder(key)
        if (bk / "cancelled").exists():
            return "CANCELLED", None
        for look in (1, 2):
            code = _read(bk / "exitcode")
            if code is not None:
                rc = int(code) if code.lstrip("-").isdigit() else -1
                if rc == 124:
                    return "TIMEOUT", rc
                return ("COMPLETED" if rc == 0 else "FAILED"), rc
            if look == 1 and self.alive(key):
                return ("RUNNING" if (bk / "started").exists() else "PENDING"), None
        # gone without an exit code (read again: it may have ended between the two looks)
        return "LOST", None

    def alive(self, key: str) -> bool:
        rec = _read(self.job_folder(key) / "pid")
        if not rec:
            return False
        pid, started = rec.split()[0], rec.split()[1:]
        try:
            p = psutil.Process(int(pid))
            if started and abs(p.create_time() - float(started[0])) > 1:
                return False
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def cancel(self, key: str) -> bool:
        bk = self.job_folder(key)
        if (bk / "exitcode").exists():
            return False
        (bk / "cancelled").write_text("1\n")
        self.kill(key)
        return True

    def kill(self, key: str) -> None:
        rec = _read(self.job_folder(key) / "pid")
        if not rec or not self.alive(key):
            return
        pid = int(rec.split()[0])
        started = float(rec.split()[1]) if len(rec.split()) > 1 else None
        # the group only while it is still ours (core/process_groups): once the job's
        # leader has ended its number may be somebody else's; members logging to the
        # job's folder are ours
        ref, owned = GroupRef(pid, started), writes_under(self.job_folder(key))
        try:  # every descendant, as Slurm's proctrack does: `timeout` and a script's
            # `setsid` children are in process groups of their own
            tree = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            tree = []
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for child in tree:
                try:
                    child.send_signal(sig)
                except psutil.Error:
                    pass
            if not signal_group(ref, sig, owned):
                return
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline and self.alive(key):
                time.sleep(0.02)
            if not self.alive(key):
                return

    def kill_all(self) -> None:
        if not self.folder.exists():
            return
        for bk in self.folder.iterdir():
            if bk.is_dir():
                self.kill(bk.name)


def q(path: Path | str) -> str:
    import shlex

    return shlex.quote(str(path))


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def job_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A job's environment: the emulator's (the "login environment") without its secrets."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith((envnames.PREFIX, "EMULATOR_"))}
    env.update(extra or {})
    return env


class BaseHandler(web.RequestHandler):
    """JSON in and out; faults and bearer tokens checked before the route runs."""

    needs_auth = True
    #: a request without ``Authorization: Bearer``: 401 with this message
    missing_token_message = "Missing bearer token"

    @property
    def svc(self):
        return self.application.settings["service"]

    def check_xsrf_cookie(self) -> None:
        pass

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")
        version = self.application.settings.get("app_version")
        if version:
            self.set_header("f7t-appversion", version)

    def prepare(self) -> None:
        svc = self.svc
        svc.record(self.request.method, self.request.path, self.request.query)
        self._after_fault = None
        fault = svc.faults.check(self.request.method, self.request.path)
        if fault is not None:
            status, message, headers, after = fault
            if after:
                self._after_fault = (status, message)
            else:
                for k, v in headers.items():
                    self.set_header(k, v)
                self.fail(status, message)
                return
        if self.needs_auth:
            auth = self.request.headers.get("Authorization", "")
            if not auth.startswith("Bearer "):
                self.fail(401, self.missing_token_message)
                return
            try:
                self.claims = svc.issuer.verify(auth[len("Bearer "):].strip())
            except PermissionError as e:
                self.fail(401, str(e))
                return
            self.user = self.claims.get("preferred_username")

    def finish(self, chunk: Any = None):
        after = getattr(self, "_after_fault", None)
        if after is not None:  # the work is done; the answer is lost
            self._after_fault = None
            self.clear()
            self.set_status(after[0])
            self.set_header("Content-Type", "application/json")
            chunk = json.dumps(self.svc.error_body(after[0], after[1]))
        return super().finish(chunk)

    def fail(self, status: int, message: str, **extra: Any) -> None:
        self.set_status(status)
        self.finish(json.dumps(self.svc.error_body(status, message, **extra)))

    def json_body(self) -> Any:
        try:
            return json.loads(self.request.body or b"{}")
        except json.JSONDecodeError:
            return None

    def reply(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        if status == 204:
            self.finish()
        else:
            self.finish(json.dumps(data))


class TokenHandler(BaseHandler):
    """POST /auth/token: the OIDC client-credentials grant."""

    needs_auth = False

    def post(self) -> None:
        self.set_header("Content-Type", "application/json")
        args = {k: self.get_body_argument(k, None) for k in
                ("grant_type", "client_id", "client_secret")}
        basic = self.request.headers.get("Authorization", "")
        if basic.startswith("Basic "):
            try:
                cid, _, sec = base64.b64decode(basic[6:]).decode().partition(":")
                args["client_id"], args["client_secret"] = cid, sec
            except ValueError:
                pass
        if args["grant_type"] != "client_credentials":
            self.set_status(400)
            self.finish(json.dumps({"error": "unsupported_grant_type"}))
            return
        token = self.svc.issuer.issue(args["client_id"] or "", args["client_secret"] or "")
        if token is None:
            self.set_status(401)
            self.finish(json.dumps({"error": "unauthorized_client",
                                    "error_description": "Invalid client credentials"}))
            return
        self.finish(json.dumps(token))


class CertsHandler(BaseHandler):
    needs_auth = False

    def get(self) -> None:
        self.finish(json.dumps(self.svc.issuer.jwks()))


class AdminHandler(BaseHandler):
    """POST /_emulator/faults {…}; GET /_emulator/requests (what clients asked)."""

    needs_auth = False

    def prepare(self) -> None:
        if not secrets.compare_digest(self.request.headers.get(ADMIN_HEADER, ""),
                                      self.svc.admin_token):
            self.fail(403, "admin token required")

    def post(self, what: str) -> None:
        if what != "faults":
            self.fail(404, "no such admin route")
            return
        self.svc.faults.set(self.json_body() or {}, self.svc.issuer)
        self.reply({"ok": True})

    def get(self, what: str) -> None:
        if what == "requests":
            self.reply({"requests": list(self.svc.requests)})
        elif what == "tokens":
            self.reply({"issued": self.svc.issuer.issued})
        else:
            self.fail(404, "no such admin route")
