"""Private instances of nginx, Apache httpd and Tomcat on loopback, for the egress proxy's
path-rule tests: three server families that read the bytes of a request path differently.

Each serves the same tree (``/api/probe.txt`` says INSIDE, ``/admin/probe.txt`` and
``/probe.txt`` say OUTSIDE) and records, per request, the path it resolved and whether the
request carried the header ``X-Secret`` (``seen(server, request_id)``).  The request id is
the query ``?n=ID`` of the request.  Debian's packages (nginx-light, apache2,
tomcat10-user) are run as private instances: own config, own port, own logs, foreground.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_cloudtik.core import ports

__all__ = ["PathServer", "Seen", "available", "start_all"]

SECRET_HEADER = "X-Secret"
TOMCAT_HOME = Path("/usr/share/tomcat10")


@dataclass
class Seen:
    """What a server did with one request: the path it resolved (None: not known, e.g. a
    request it refused before resolving) and whether the secret header reached it."""

    path: str | None
    status: int
    secret: bool


@dataclass
class PathServer:
    name: str
    port: int
    root: Path
    proc: subprocess.Popen
    log: Path
    secret: str = field(repr=False, default="")
    cleanup: Path | None = None

    def seen(self, request_id: str, wait: float = 0.0) -> Seen | None:
        """The server's record of the request with query ``n=request_id``; servers log a
        request after answering it, so ``wait`` seconds for it to appear."""
        deadline = time.monotonic() + wait
        while True:
            found = self._seen(request_id)
            if found is not None or time.monotonic() >= deadline:
                return found
            time.sleep(0.05)

    def _seen(self, request_id: str) -> Seen | None:
        if not self.log.exists():
            return None
        for line in self.log.read_text(errors="replace").splitlines():
            parts = line.split("\t")
            if len(parts) < 4 or f"n={request_id}" not in parts[0]:
                continue
            path = parts[1] if parts[1] not in ("-", "") else None
            try:
                status = int(parts[2])
            except ValueError:
                status = 0
            return Seen(path, status, bool(self.secret) and self.secret in parts[3])
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.cleanup is not None:
            shutil.rmtree(self.cleanup, ignore_errors=True)


def available() -> dict[str, bool]:
    return {"nginx": Path("/usr/sbin/nginx").exists(),
            "apache": Path("/usr/sbin/apache2").exists(),
            "tomcat": (TOMCAT_HOME / "bin" / "catalina.sh").exists()}


def _port() -> int:
    return ports.free_port()


def _tree(www: Path) -> None:
    for rel, text in (("api/probe.txt", "INSIDE\n"), ("api/admin/probe.txt", "INSIDE\n"),
                      ("admin/probe.txt", "OUTSIDE\n"), ("probe.txt", "OUTSIDE\n")):
        (www / rel).parent.mkdir(parents=True, exist_ok=True)
        (www / rel).write_text(text)
    for p in [www, *www.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


def _wait(port: int, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} while starting")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout:.0f}s")


def start_nginx(base: Path, secret: str) -> PathServer:
    d = base / "nginx"
    (d / "tmp").mkdir(parents=True)
    www = d / "www"
    _tree(www)
    port = _port()
    log = d / "access.log"
    # $uri: the path after nginx's decoding, slash merging and dot resolution
    (d / "nginx.conf").write_text(f"""
daemon off;
master_process off;
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{ worker_connections 256; }}
http {{
  log_format probe '$args\\t$uri\\t$status\\t$http_x_secret';
  access_log {log} probe;
  client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;
  uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;
  server {{
    listen 127.0.0.1:{port};
    root {www};
    location / {{ try_files $uri =404; }}
  }}
}}
""")
    proc = subprocess.Popen(["/usr/sbin/nginx", "-c", str(d / "nginx.conf"), "-p", str(d)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(port, proc, "nginx")
    return PathServer("nginx", port, d, proc, log, secret)


def start_apache(base: Path, secret: str) -> PathServer:
    d = base / "apache"
    d.mkdir(parents=True)
    # the workers run as www-data: their tree must be readable on the way there too (a
    # test's tmp folder is not), so it lives in a folder of its own
    www = Path(tempfile.mkdtemp(prefix="cloudtik-apache-www-"))
    www.chmod(0o755)
    _tree(www)
    port = _port()
    log = d / "access.log"
    mods = "/usr/lib/apache2/modules"
    user = "" if os.geteuid() != 0 else "User www-data\nGroup www-data\n"
    # %U: the path Apache mapped (decoded, dot segments resolved); TraceEnable on: Apache
    # answers TRACE with the request it received (the reflection tests use it)
    (d / "httpd.conf").write_text(f"""
ServerRoot {d}
ServerName localhost
LoadModule mpm_event_module {mods}/mod_mpm_event.so
LoadModule authz_core_module {mods}/mod_authz_core.so
{user}Listen 127.0.0.1:{port}
PidFile {d}/httpd.pid
ErrorLog {d}/error.log
DocumentRoot {www}
<Directory {www}>
  Require all granted
</Directory>
TraceEnable on
LogFormat "%q\\t%U\\t%>s\\t%{{{SECRET_HEADER}}}i" probe
CustomLog {log} probe
""")
    proc = subprocess.Popen(["/usr/sbin/apache2", "-f", str(d / "httpd.conf"), "-DFOREGROUND"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "APACHE_RUN_DIR": str(d),
                                 "APACHE_LOG_DIR": str(d)})
    _wait(port, proc, "apache2")
    return PathServer("apache", port, d, proc, log, secret, cleanup=www)


def start_tomcat(base: Path, secret: str) -> PathServer:
    d = base / "tomcat"
    (d / "logs").mkdir(parents=True)
    (d / "temp").mkdir()
    (d / "work").mkdir()
    shutil.copytree(TOMCAT_HOME / "skel" / "conf", d / "conf")
    www = d / "webapps" / "ROOT"
    _tree(www)
    port = _port()
    # %U is the undecoded URI in Tomcat's access log: which file it served (the probe's
    # INSIDE/OUTSIDE) says where it resolved the path; allowTrace: TRACE is reflected
    (d / "conf" / "server.xml").write_text(f"""<?xml version="1.0" encoding="UTF-8"?>
<Server port="-1" shutdown="SHUTDOWN">
  <Service name="Catalina">
    <Connector port="{port}" address="127.0.0.1" protocol="HTTP/1.1" allowTrace="true"
               connectionTimeout="20000"/>
    <Engine name="Catalina" defaultHost="localhost">
      <Host name="localhost" appBase="webapps" unpackWARs="false" autoDeploy="false">
        <Valve className="org.apache.catalina.valves.AccessLogValve" directory="logs"
               prefix="access" suffix=".log" rotatable="false" buffered="false"
               pattern="%q&#9;-&#9;%s&#9;%{{{SECRET_HEADER}}}i"/>
      </Host>
    </Engine>
  </Service>
</Server>
""")
    env = {**os.environ, "CATALINA_HOME": str(TOMCAT_HOME), "CATALINA_BASE": str(d),
           "CATALINA_TMPDIR": str(d / "temp"), "CATALINA_OUT": str(d / "logs" / "out.log"),
           "JAVA_OPTS": "-Xmx256m -XX:+UseSerialGC -Xshare:auto"}
    proc = subprocess.Popen([str(TOMCAT_HOME / "bin" / "catalina.sh"), "run"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    _wait(port, proc, "tomcat", 90)
    return PathServer("tomcat", port, d, proc, d / "logs" / "access.log", secret)


def start_all(base: Path, secret: str) -> list[PathServer]:
    servers: list[PathServer] = []
    try:
        for start in (start_nginx, start_apache, start_tomcat):
            servers.append(start(base, secret))
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers
