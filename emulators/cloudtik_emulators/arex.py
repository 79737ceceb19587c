"""A real ARC CE (NorduGrid A-REX from Debian packages) for the ``arc`` backend's tests.

Two sites:

* ARC 6.17, Debian 12's own packages (``scripts/install-system-deps.sh``): REST 1.0 only,
  X.509 proxy authentication.
* ARC 7, Debian 13's packages in a ``debootstrap``ped chroot built once and cached outside
  the clone (``$CLOUDTIK_ARC7_CHROOT``, default ``$CLOUDTIK_ARC_CACHE/arc7-trixie``, the
  cache being ``/var/cache/jupyter_cloudtik``):
  REST 1.1, bearer tokens validated against an OIDC issuer the test runs.

A site is a temp folder with a test CA (``arcctl test-ca``), host and user certificates, an
``arc.conf`` (fork LRMS, REST interface on a free port) and the two A-REX processes
(``arc-arex-start -f``: the grid manager; ``arc-arex-ws-start -f``: the REST interface),
both with ``ARC_CONFIG`` pointing at that file.  Everything needs root (A-REX maps grid
users to local accounts, chroot needs it too).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from jupyter_cloudtik.core import env as envnames
from jupyter_cloudtik.core import ports
from jupyter_cloudtik.core.process_groups import signal_child

ARC_PACKAGES = ["nordugrid-arc-arex", "nordugrid-arc-client", "nordugrid-arc-plugins-needed",
                "nordugrid-arc-plugins-arcrest", "nordugrid-arc-plugins-internal",
                "nordugrid-arc-arcctl", "nordugrid-arc-arcctl-service", "nordugrid-arc-hed",
                "python3-nordugrid-arc"]
CHROOT_DONE = ".cloudtik-arc7-ready"
# what the site's jobs run notebooks with: a remote site has its own Python, never the
# session's (and nobody, the mapped account, cannot read a root-owned one anyway)
CHROOT_JOB_PACKAGES = ["python3-papermill", "python3-ipykernel", "curl"]
CACHE = Path(os.environ.get(envnames.ARC_CACHE, "/var/cache/jupyter_cloudtik"))
HOST_JOB_PYTHON = CACHE / "arc6-job-python"
ARC7_CHROOT = Path(os.environ.get(envnames.ARC7_CHROOT, CACHE / "arc7-trixie"))
AREX_START = "/usr/share/arc/arc-arex-start"
AREX_WS_START = "/usr/share/arc/arc-arex-ws-start"
USER_DN = "/DC=org/DC=nordugrid/DC=ARC/O=TestCA/CN={name}"


def missing_arc6() -> str | None:
    """Why the Debian 12 A-REX cannot run here, or None."""
    if os.geteuid() != 0:
        return "A-REX needs root (it maps grid users to local accounts)"
    for p in (AREX_START, AREX_WS_START, shutil.which("arcctl") or "/usr/sbin/arcctl"):
        if not Path(p).exists():
            return f"{p} is missing; run scripts/install-system-deps.sh"
    return None


def debian_mirror() -> str:
    """This machine's Debian mirror (the one apt uses), for debootstrap."""
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("#"):
                continue
            words = line.replace("URIs:", " ").split()
            for w in words:
                if w.startswith(("http://", "https://")) and "security" not in w:
                    return w
    return "http://deb.debian.org/debian"


@contextlib.contextmanager
def chroot_mounts(root: Path):
    """/proc, /dev, /dev/pts of this machine inside ``root`` while the block runs."""
    mounted = []
    try:
        for src in ("/proc", "/dev", "/dev/pts"):
            target = root / src.lstrip("/")
            target.mkdir(parents=True, exist_ok=True)
            if subprocess.run(["mountpoint", "-q", str(target)]).returncode != 0:
                subprocess.run(["mount", "--bind", src, str(target)], check=True)
                mounted.append(target)
        yield
    finally:
        for target in reversed(mounted):
            subprocess.run(["umount", "-l", str(target)], check=False)


@contextlib.contextmanager
def _cache_lock(name: str):
    """One builder at a time (test sessions of several clones share the cache)."""
    import fcntl

    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def build_arc7_chroot(root: Path = ARC7_CHROOT, log=print) -> Path:
    """Debian 13 with ARC 7's packages in ``root``; done once, then reused."""
    if (root / CHROOT_DONE).exists():
        return root
    with _cache_lock("arc7-chroot"):
        return _build_arc7_chroot(root, log)


def _build_arc7_chroot(root: Path, log) -> Path:
    if (root / CHROOT_DONE).exists():
        return root
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is missing; run scripts/install-system-deps.sh")
    t0 = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "usr/bin/apt-get").exists():
        partial = root.with_name(root.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run(["debootstrap", "--variant=minbase", "trixie", str(partial),
                        debian_mirror()], check=True, stdout=subprocess.DEVNULL)
        shutil.rmtree(root)
        partial.rename(root)
    for f in ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf"):
        if Path(f).exists():
            shutil.copy(f, root / f.lstrip("/"))
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive",
           "LANG": "C.UTF-8"}
    with chroot_mounts(root):
        subprocess.run(["chroot", str(root), "apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["chroot", str(root), "apt-get", "install", "-y", "-qq",
                        "--no-install-recommends", *ARC_PACKAGES, "openssl", "python3",
                        *CHROOT_JOB_PACKAGES], check=True, env=env, stdout=subprocess.DEVNULL)
    (root / CHROOT_DONE).write_text(f"built in {time.monotonic() - t0:.0f}s\n")
    log(f"ARC 7 chroot built in {root} in {time.monotonic() - t0:.0f}s")
    return root


def host_job_python(log=print) -> Path:
    """A Python with papermill and ipykernel that the site's mapped account (nobody) can
    run: a venv of Debian's python3 in the cache, made once."""
    py = HOST_JOB_PYTHON / "bin" / "python"
    if (HOST_JOB_PYTHON / ".ready").exists():
        return py
    with _cache_lock("arc6-job-python"):
        if (HOST_JOB_PYTHON / ".ready").exists():
            return py
        return _make_host_job_python(py, log)


def _make_host_job_python(py: Path, log) -> Path:
    t0 = time.monotonic()
    shutil.rmtree(HOST_JOB_PYTHON, ignore_errors=True)
    HOST_JOB_PYTHON.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(HOST_JOB_PYTHON)], check=True)
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "papermill", "ipykernel"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"cannot install papermill for the ARC 6 site's jobs: "
                           f"{r.stderr[-2000:]}")
    (HOST_JOB_PYTHON / ".ready").write_text(f"{time.monotonic() - t0:.0f}s\n")
    log(f"job Python for the ARC 6 site made in {time.monotonic() - t0:.0f}s")
    return py


def free_port() -> int:
    return ports.free_port()


CONF = """\
[common]
hostname = localhost
x509_host_key = {root}/host-localhost-key.pem
x509_host_cert = {root}/host-localhost-cert.pem
x509_cert_dir = {root}/ca

[authgroup:users]
{auth}

[mapping]
map_to_user = users nobody:nogroup

[lrms]
lrms = fork

[arex]
controldir = {root}/control
sessiondir = {root}/session
runtimedir = {root}/runtime
tmpdir = {root}/tmp
pidfile = {root}/arex.pid
logfile = {root}/log/arex.log
wakeupperiod = 5
{arex_extra}
[arex/ws]
wsurl = https://localhost:{port}/arex
logfile = {root}/log/ws.log
pidfile = {root}/ws.pid

[arex/ws/jobs]
allowaccess = users

[infosys]
logfile = {root}/log/infosys.log

[infosys/glue2]

[infosys/cluster]

[queue:fork]
{queue_extra}
"""


class ArexSite:
    """One real A-REX: its folder, certificates, config and its two processes.

    ``chroot`` None runs the machine's own ARC (6.17 on Debian 12); a chroot folder runs the
    ARC installed in it (7.0 from Debian 13).  ``issuer`` (an https URL) makes the site
    accept bearer tokens of that issuer instead of X.509 certificates.
    """

    def __init__(self, folder_name: str, *, chroot: Path | None = None,
                 issuer: str | None = None, log=print, maxjobs: int | None = None) -> None:
        self.chroot = chroot
        # arc.conf maxjobs' second number: "jobs being run (SUBMITTING, INLRMS states)";
        # jobs over it wait PREPARED (PENDING:PREPARING)
        self.maxjobs = maxjobs
        self.issuer = issuer
        self.log = log
        base = (chroot / "tmp") if chroot else Path("/tmp")
        self.inner = Path("/tmp") / folder_name  # the path A-REX sees
        self.root = base / folder_name  # the same folder seen from here
        self.port = free_port()
        self.procs: list[subprocess.Popen] = []
        self._mounts: contextlib.ExitStack | None = None
        self.start_seconds = 0.0
        self._installed: list[Path] = []
        self.ca_id = f"cloudtik{folder_name.rsplit('-', 1)[-1]}"

    # paths as this process sees them
    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}/arex"

    @property
    def ca_dir(self) -> Path:
        return self.root / "ca"

    @property
    def user_cert(self) -> Path:
        return self.root / "client-alice-cert.pem"

    @property
    def user_key(self) -> Path:
        return self.root / "client-alice-key.pem"

    @property
    def host_cert(self) -> Path:
        return self.root / "host-localhost-cert.pem"

    @property
    def host_key(self) -> Path:
        return self.root / "host-localhost-key.pem"

    def _cmd(self, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
        envs = [f"{k}={v}" for k, v in (env or {}).items()]
        if self.chroot:
            # chroot(1) changes to / inside: go back to the site's folder there
            return ["chroot", str(self.chroot), "env", "-C", str(self.inner),
                    "PATH=/usr/sbin:/usr/bin:/sbin:/bin", *envs, *argv]
        return ["env", *envs, *argv] if envs else argv

    def _run(self, argv: list[str]) -> None:
        r = subprocess.run(self._cmd(argv), cwd=self.root, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")

    def make_certificates(self, user: str = "alice") -> None:
        ca = ["arcctl", "test-ca", "--ca-dir", f"{self.inner}/ca", "--ca-id", self.ca_id]
        self._run([*ca, "init", "-f"])
        self._run([*ca, "hostcert", "-n", "localhost", "-f"])
        self._run([*ca, "usercert", "-n", user, "--no-auth", "-f"])
        # the user's key as a person keeps it: readable by this process only
        os.chmod(self.root / f"client-{user}-key.pem", 0o600)

    def user_certificate(self, name: str) -> tuple[Path, Path]:
        """Another user of the same CA (not on the site's allowed list)."""
        ca = ["arcctl", "test-ca", "--ca-dir", f"{self.inner}/ca", "--ca-id", self.ca_id]
        self._run([*ca, "usercert", "-n", name, "--no-auth", "-f"])
        return self.root / f"client-{name}-cert.pem", self.root / f"client-{name}-key.pem"

    def write_config(self, queue_extra: str = "") -> Path:
        for d in ("control", "session", "runtime", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "tmp").mkdir(exist_ok=True)
        os.chmod(self.root / "tmp", 0o1777)  # A-REX's validator insists on the sticky bit
        if self.issuer:
            auth = f"authtokens = * {self.issuer} * * *"
            arex_extra = ""
        else:
            (self.root / "allowed-subjects").write_text(f'"{USER_DN.format(name="alice")}"\n')
            auth = f"file = {self.inner}/allowed-subjects"
            arex_extra = ""
        if self.maxjobs is not None:
            arex_extra += f"maxjobs = -1 {self.maxjobs} -1 -1 -1\n"
        text = CONF.format(root=self.inner, port=self.port, auth=auth, arex_extra=arex_extra,
                           queue_extra=queue_extra)
        if self.issuer:
            pass
        conf = self.root / "arc.conf"
        conf.write_text(text)
        return conf

    def start(self, timeout: float = 300.0) -> ArexSite:
        t0 = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        if self.chroot:
            self._mounts = contextlib.ExitStack()
            self._mounts.enter_context(chroot_mounts(self.chroot))
        if not self.host_cert.exists():
            self.make_certificates()
        self.write_config()
        if self.chroot and self.issuer:
            self._trust_site_ca_for_tokens()
        dh = self.root / "control" / "dhparam.pem"
        if not dh.exists():  # else A-REX makes a 4096-bit one: minutes of CPU
            subprocess.run(["openssl", "dhparam", "-dsaparam", "-out", str(dh), "2048"],
                           check=True, capture_output=True)
        env = {"ARC_CONFIG": f"{self.inner}/arc.conf"}
        for name, prog in (("arex", AREX_START), ("ws", AREX_WS_START)):
            with open(self.root / "log" / f"{name}.out", "ab") as out:
                self.procs.append(subprocess.Popen(
                    self._cmd([prog, "-f"], env), cwd=self.root, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"A-REX exited while starting: {self.tail()}")
            # ready = REST listening and the information system's first GLUE2 document
            # written (CEinfo.pl, a minute or more on a loaded machine): before that /info
            # has no queues, as on a real CE that has just restarted
            if (self.root / "control" / "info.xml").is_file() and (
                    self.root / "control" / "info.xml").stat().st_size > 0:
                with contextlib.suppress(OSError), \
                        socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    self.start_seconds = time.monotonic() - t0
                    return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"A-REX did not listen on {self.port} within {timeout}s: "
                           f"{self.tail()}")

    def _trust_site_ca_for_tokens(self) -> None:
        """A-REX 7 fetches the issuer's keys trusting /etc/grid-security/certificates, not
        the configured x509_cert_dir: put the site's CA there while the site runs."""
        target = self.chroot / "etc/grid-security/certificates"
        target.mkdir(parents=True, exist_ok=True)
        for f in self.ca_dir.iterdir():
            if f.name.endswith((".0", ".signing_policy")) and "-" not in f.name:
                shutil.copy(f, target / f.name)
                self._installed.append(target / f.name)

    def tail(self, n: int = 3000) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            with contextlib.suppress(OSError):
                out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-n:]}")
        return "\n".join(out)

    def stop(self) -> None:
        import signal

        for p in self.procs:
            if p.poll() is None:
                signal_child(p, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                signal_child(p, signal.SIGKILL)
                p.wait(10)
        self.procs = []
        self._kill_leftovers()
        for f in self._installed:
            f.unlink(missing_ok=True)
        self._installed = []
        if self._mounts is not None:
            self._mounts.close()
            self._mounts = None

    def _kill_leftovers(self) -> None:
        """A-REX's daemons (arched, the fork LRMS's jobs) outlive their start scripts."""
        import signal

        import psutil

        marks = (str(self.inner), str(self.root))
        for p in psutil.process_iter(["pid", "cmdline", "cwd"]):
            try:
                cmd = " ".join(p.info["cmdline"] or [])
                cwd = p.info["cwd"] or ""
                if any(m in cmd or cwd.startswith(m) for m in marks):
                    p.send_signal(signal.SIGKILL)
            except (psutil.Error, OSError):
                continue


if __name__ == "__main__":  # python -m cloudtik_emulators.arex: build the chroot
    build_arc7_chroot()


class OidcIssuer:
    """An OIDC token issuer over HTTPS, as A-REX 7 needs one to validate bearer tokens.

    A-REX fetches ``<iss>/.well-known/openid-configuration`` and the JWKS it names,
    trusting only the grid CA folder — so the issuer's certificate comes from the site's
    test CA — and sends absolute-form request lines (``GET https://host:port/jwks
    HTTP/1.1``), which this server takes as well as the usual origin form.  Clients get
    tokens with the client-credentials grant at ``/token``.
    """

    def __init__(self, cert: Path, key: Path, clients: dict[str, str],
                 audience: str = "https://localhost/arex", ttl: float = 300.0) -> None:
        import http.server
        import json
        import ssl
        import threading
        import urllib.parse

        from ._service import TokenIssuer

        self.requests: list[str] = []
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self.port = server.server_address[1]
        self.url = f"https://localhost:{self.port}"
        self.tokens = TokenIssuer(clients, issuer=self.url, audience=audience, ttl=ttl)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self.server = server
        self._json, self._parse = json, urllib.parse
        self.thread = threading.Thread(target=server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def token_uri(self) -> str:
        return f"{self.url}/token"

    def _handler_class(self):
        import http.server

        issuer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _path(self) -> str:
                # absolute form (RFC 9112 3.2.2) or origin form
                return issuer._parse.urlsplit(self.path).path or "/"

            def _reply(self, status: int, doc) -> None:
                body = issuer._json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                path = self._path()
                issuer.requests.append(f"GET {self.path}")
                if path == "/.well-known/openid-configuration":
                    self._reply(200, {"issuer": issuer.url, "jwks_uri": f"{issuer.url}/jwks",
                                      "token_endpoint": issuer.token_uri,
                                      "grant_types_supported": ["client_credentials"],
                                      "id_token_signing_alg_values_supported": ["RS256"]})
                elif path == "/jwks":
                    self._reply(200, issuer.tokens.jwks())
                else:
                    self._reply(404, {"error": "not_found"})

            def do_POST(self) -> None:
                import base64

                issuer.requests.append(f"POST {self.path}")
                n = int(self.headers.get("Content-Length") or 0)
                form = dict(issuer._parse.parse_qsl(self.rfile.read(n).decode()))
                cid, secret = form.get("client_id", ""), form.get("client_secret", "")
                auth = self.headers.get("Authorization", "")
                if auth.startswith("Basic "):
                    cid, _, secret = base64.b64decode(auth[6:]).decode().partition(":")
                if self._path() != "/token" or form.get("grant_type") != "client_credentials":
                    self._reply(400, {"error": "unsupported_grant_type"})
                    return
                tok = issuer.tokens.issue(cid, secret)
                if tok is None:
                    self._reply(401, {"error": "invalid_client"})
                    return
                self._reply(200, tok)

        return Handler

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
