"""A real JupyterHub with the cloudtik sidekick as a managed service, for tests and the
load benchmark.

The hub runs as a subprocess (``python -m jupyterhub``) behind the npm
``configurable-http-proxy`` (``make install`` puts it in ``.venv/hub-proxy``), with
``DummyAuthenticator``, ``SimpleLocalProcessSpawner`` and three users: ``alice`` (group
``physics``), ``bob`` (group ``chemistry``) and ``admin`` (hub admin, sidekick admin).
A ``tester`` service holds a token that can mint user tokens and start servers.
Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import string
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from jupyter_cloudtik.core import env as envnames
from jupyter_cloudtik.core import ports
from jupyter_cloudtik.core.process_groups import (
    GroupRef,
    signal_child,
    signal_group,
    writes_under,
)

PASSWORD = "cloudtik-test-password"
TESTER_TOKEN = "tester-" + "0123456789abcdef" * 2


def free_port() -> int:
    return ports.free_port()


def chp_path() -> str:
    """The configurable-http-proxy of ``make install`` (or one on PATH)."""
    here = Path(sys.prefix) / "hub-proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
    if here.exists():
        return str(here)
    found = shutil.which("configurable-http-proxy")
    if not found:
        raise RuntimeError("configurable-http-proxy is not installed (make install puts it "
                           "in .venv/hub-proxy)")
    return found


@dataclass
class Hub:
    base: Path
    url: str               # the public (proxy) URL, e.g. http://127.0.0.1:PORT/
    service_url: str       # the sidekick's own URL (direct, not through the proxy)
    state_dir: Path        # the sidekick's state folder
    proc: subprocess.Popen
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def api(self) -> str:
        return self.url + "hub/api/"

    @property
    def sidekick_api(self) -> str:
        return self.url + "services/cloudtik/cloudtik/api/"

    def admin_request(self, method: str, path: str, **kw: Any) -> requests.Response:
        return requests.request(method, self.api + path, timeout=30,
                                headers={"Authorization": f"token {TESTER_TOKEN}"}, **kw)

    def token(self, user: str) -> str:
        """A token of ``user`` with all of their permissions."""
        if user not in self.tokens:
            r = self.admin_request("POST", f"users/{user}/tokens",
                                   json={"note": "cloudtik tests", "expires_in": 7200})
            r.raise_for_status()
            self.tokens[user] = r.json()["token"]
        return self.tokens[user]

    def session(self, user: str) -> requests.Session:
        s = requests.Session()
        s.headers["Authorization"] = f"token {self.token(user)}"
        s.trust_env = False
        return s

    def browser(self, user: str) -> requests.Session:
        """``user``'s own browser session with the sidekick, as a browser gets it: the
        hub's login form, then the sidekick's OAuth (its cookie), with the sidekick's XSRF
        token sent back as a page's script does.  What stays with the person (egress
        rules, share answers; the catalogue, quotas and workspaces for admins) needs it:
        no bearer token may do those (docs/security.md)."""
        s = requests.Session()
        s.trust_env = False
        r = s.get(self.url + "hub/login", timeout=30)
        r.raise_for_status()
        r = s.post(self.url + "hub/login", timeout=30, data={
            "username": user, "password": PASSWORD,
            "_xsrf": s.cookies.get("_xsrf", path="/hub/") or ""})
        r.raise_for_status()
        # the sidekick's own page: OAuth to the hub and back, which sets its cookie
        r = s.get(self.url + "services/cloudtik/egress", timeout=30)
        if r.status_code != 200 or "Egress rules" not in r.text:
            raise RuntimeError(f"{user} could not log in to the sidekick: {r.status_code} "
                               f"{r.url} {r.text[:300]}")
        xsrf = s.cookies.get("_xsrf", path="/services/cloudtik/")
        if not xsrf:
            raise RuntimeError(f"no XSRF cookie of the sidekick for {user}: {s.cookies}")
        s.headers["X-XSRFToken"] = xsrf
        return s

    def start_server(self, user: str, timeout: float = 90) -> str:
        """Start ``user``'s single-user server; returns its URL through the proxy."""
        r = self.admin_request("POST", f"users/{user}/server")
        if r.status_code not in (201, 202, 400):
            r.raise_for_status()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = self.admin_request("GET", f"users/{user}").json()
            server = (model.get("servers") or {}).get("")
            if server and server.get("ready"):
                return self.url.rstrip("/") + server["url"]
            time.sleep(0.3)
        raise TimeoutError(f"{user}'s server did not become ready in {timeout:.0f} s; "
                           f"log: {self.log_tail()}")

    def stop_server(self, user: str, timeout: float = 60) -> None:
        self.admin_request("DELETE", f"users/{user}/server")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = self.admin_request("GET", f"users/{user}").json()
            if not (model.get("servers") or {}).get(""):
                return
            time.sleep(0.3)

    def stop_all(self, users: tuple[str, ...] = ("alice", "bob")) -> None:
        """A fixture's end: the users' servers (each best effort, so one that will not stop
        leaves the others and the hub still stopped), then the hub."""
        for user in users:
            try:
                self.stop_server(user, timeout=30)
            except Exception:
                pass
        self.stop()

    def log_tail(self, lines: int = 60) -> str:
        path = self.base / "hub.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) \
            if path.exists() else ""

    def stop(self) -> None:
        # the group as started while the hub (our child, not reaped) still holds it; once
        # reaped, what is left is stopped only where it logs to the hub's folder
        ref = GroupRef.of(self.proc.pid) if self.proc.poll() is None else \
            GroupRef(self.proc.pid, None)
        owned = writes_under(self.base)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                signal_child(self.proc, signal.SIGKILL)
                self.proc.wait(10)
        # anything of the hub's process group still around (proxy, servers, sidekick)
        signal_group(ref, signal.SIGKILL, owned)
        # the sidekick's own daemons (launcher, egress proxy, cluster nodes) live in their
        # own sessions and end by themselves once it is gone: wait for them, then insist
        from .processes import cloudtik_processes, kill_all

        deadline = time.monotonic() + 15
        while (left := cloudtik_processes(self.base)) and time.monotonic() < deadline:
            time.sleep(0.2)
        kill_all(left)
        # side-kicks (own sessions too) whose supervisor died before it could stop them:
        # a real sidekick stops such orphans at its next start; a test hub has none
        kill_all(_sidekicks_under(self.base))


def service_pid(base: Path) -> int | None:
    """The pid of the sidekick service (``jupyter-cloudtik hub-service``) of the test hub
    under ``base`` (JupyterHub starts it again with a new pid when it dies)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"hub-service" in cmd and any(str(base).encode() in c for c in cmd):
            return int(d.name)
    return None


def _sidekicks_under(base: Path) -> list:
    import psutil

    root = str(Path(base).resolve()) + "/"
    found = []
    for proc in psutil.process_iter(["environ"]):
        env = proc.info["environ"] or {}
        if env.get(envnames.SIDEKICK_NAME) and \
                env.get(envnames.STATE_DIR, "").startswith(root):
            found.append(proc)
    return found


def _hub_base(base: Path, hub_port: int, proxy_port: int, api_port: int,
              user_env: dict[str, str], user_args: list[str] | None = None) -> str:
    """Where the hub listens and keeps its files, how users log in and are spawned."""
    users_home = base / "homes"
    return textwrap.dedent(f"""
        import os
        import sys
        c.JupyterHub.ip = "127.0.0.1"
        c.JupyterHub.port = {proxy_port}
        c.JupyterHub.hub_ip = "127.0.0.1"
        c.JupyterHub.hub_port = {hub_port}
        c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
        c.ConfigurableHTTPProxy.command = [{chp_path()!r}]
        c.ConfigurableHTTPProxy.should_start = True
        c.JupyterHub.db_url = "sqlite:///{base / 'hub.sqlite'}"
        c.JupyterHub.cookie_secret_file = {str(base / 'cookie_secret')!r}
        c.JupyterHub.pid_file = {str(base / 'hub.pid')!r}
        c.JupyterHub.cleanup_servers = True
        c.JupyterHub.authenticator_class = "dummy"
        c.DummyAuthenticator.password = {PASSWORD!r}
        c.Authenticator.allow_all = True
        c.Authenticator.admin_users = {{"admin"}}
        c.JupyterHub.spawner_class = "simple"
        c.SimpleLocalProcessSpawner.home_dir_template = {str(users_home) + '/{username}'!r}
        c.Spawner.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
        c.Spawner.default_url = "/lab"
        c.Spawner.args = (["--allow-root"] if os.geteuid() == 0 else []) + {list(user_args or [])!r}
        c.Spawner.start_timeout = 90
        c.Spawner.http_timeout = 90
        c.Spawner.environment = {user_env!r}
        c.JupyterHub.load_groups = {{
            "physics": {{"users": ["alice"]}},
            "chemistry": {{"users": ["bob"]}},
        }}
    """)


def write_config(base: Path, *, hub_port: int, proxy_port: int, api_port: int,
                 service_port: int, sidekick_config: str = "", hub_config: str = "",
                 user_args: list[str] | None = None) -> Path:
    """The hub's and the sidekick's config files.  ``hub_config``: a deployment's own
    scopes, roles, services and spawner environment (docs/hub.md's, say) in place of the
    built-in ones; ``$service_port``, ``$sidekick_config`` and ``$state_dir`` in it are
    filled in, and the test harness's own service, role and environment are added to it."""
    state = base / "sidekick-state"
    state.mkdir(parents=True, exist_ok=True)
    (base / "homes").mkdir(exist_ok=True)
    sk_cfg = base / "sidekick_config.py"
    sk_cfg.write_text(textwrap.dedent("""
        c.LocalProvider.terminate_grace = 2.0
        c.CloudTikHub.egress_deny_networks = []   # tests reach loopback upstreams
        c.CloudTikHub.egress_no_proxy = ""
        c.CloudTikHub.session_check_interval = 0.5
        # tests run clusters and jobs on this machine (production offers remote ones)
        c.CloudTikHub.allow_local_execution = True
    """) + sidekick_config)
    service_url = f"http://127.0.0.1:{service_port}"
    user_env = {
        envnames.HUB_SERVICE_URL: f"{service_url}/services/cloudtik/",
        "JUPYTER_PLATFORM_DIRS": "1",
        envnames.LAUNCHER_IDLE: "3",
    }
    tester_role = {"name": "tester", "services": ["tester"],
                   "scopes": ["admin:users", "tokens", "admin:servers", "read:users",
                              "admin:groups", "access:servers"]}
    service_env = {envnames.STATE_DIR: str(state), "JUPYTER_PLATFORM_DIRS": "1",
                   envnames.LAUNCHER_IDLE: "3"}
    cfg = base / "jupyterhub_config.py"
    if hub_config:
        own = string.Template(hub_config).safe_substitute(
            service_port=service_port, sidekick_config=str(sk_cfg), state_dir=str(state))
        cfg.write_text(_hub_base(base, hub_port, proxy_port, api_port, user_env, user_args)
                       + own
                       + textwrap.dedent(f"""
            # the test harness's own additions
            c.JupyterHub.load_roles.append({tester_role!r})
            c.JupyterHub.services.append({{"name": "tester", "api_token": {TESTER_TOKEN!r}}})
            c.Spawner.environment = {{**{user_env!r}, **c.Spawner.environment}}
            for _service in c.JupyterHub.services:
                if _service["name"] == "cloudtik":
                    _service["environment"] = {{**{service_env!r},
                                                **_service.get("environment", {{}})}}
        """))
        return cfg
    cfg.write_text(_hub_base(base, hub_port, proxy_port, api_port, user_env, user_args)
                   + textwrap.dedent(f"""
        c.JupyterHub.custom_scopes = {{
            "custom:cloudtik:use": {{"description": "use the cloudtik sidekick"}},
            "custom:cloudtik:admin": {{"description": "administer the cloudtik sidekick"}},
        }}
        c.JupyterHub.load_roles = [
            {{"name": "user", "scopes": ["self", "custom:cloudtik:use",
                                         "access:services!service=cloudtik"]}},
            {{"name": "cloudtik-admins", "users": ["admin"],
              "scopes": ["custom:cloudtik:admin"]}},
            {{"name": "cloudtik-service", "services": ["cloudtik"],
              "scopes": ["read:users:groups", "read:users:name", "read:servers"]}},
            {{"name": "server", "scopes": ["inherit"]}},
            {tester_role!r},
        ]
        c.JupyterHub.services = [
            {{
                "name": "cloudtik",
                "url": {service_url!r},
                "command": [sys.executable, "-m", "jupyter_cloudtik", "hub-service",
                            "--config", {str(sk_cfg)!r}],
                "environment": {service_env!r},
                "oauth_no_confirm": True,
                "oauth_client_allowed_scopes": ["custom:cloudtik:use",
                                                "custom:cloudtik:admin"],
            }},
            {{"name": "tester", "api_token": {TESTER_TOKEN!r}}},
        ]
    """))
    return cfg


def start_hub(base: Path, *, sidekick_config: str = "", hub_config: str = "",
              user_args: list[str] | None = None, timeout: float = 90) -> Hub:
    """``user_args``: more command-line options of users' single-user servers."""
    base.mkdir(parents=True, exist_ok=True)
    ports = [free_port() for _ in range(4)]
    cfg = write_config(base, hub_port=ports[0], proxy_port=ports[1], api_port=ports[2],
                       service_port=ports[3], sidekick_config=sidekick_config,
                       hub_config=hub_config, user_args=user_args)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JUPYTERHUB_", envnames.API_URL, envnames.API_TOKEN,
                                envnames.API_CA_BUNDLE, "HTTP_PROXY", "HTTPS_PROXY",
                                "http_proxy", "https_proxy"))}
    env["CONFIGPROXY_AUTH_TOKEN"] = "proxy-" + os.urandom(16).hex()
    log = open(base / "hub.log", "ab")  # noqa: SIM115 - the hub writes it while it runs
    proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(cfg)],
                            cwd=base, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    hub = Hub(base=base, url=f"http://127.0.0.1:{ports[1]}/",
              service_url=f"http://127.0.0.1:{ports[3]}/services/cloudtik/",
              state_dir=base / "sidekick-state", proc=proc)
    deadline = time.monotonic() + timeout
    ready = {"hub": False, "sidekick": False}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = hub.log_tail()
            hub.stop()  # its proxy and services may still run in its process group
            raise RuntimeError(f"JupyterHub exited ({proc.returncode}):\n{tail}")
        try:
            if not ready["hub"]:
                ready["hub"] = requests.get(hub.api, timeout=2).status_code == 200
            if ready["hub"] and not ready["sidekick"]:
                r = requests.get(hub.sidekick_api + "hub/whoami", timeout=2,
                                 headers={"Authorization": f"token {hub.token('admin')}"})
                ready["sidekick"] = r.status_code == 200
            if all(ready.values()):
                return hub
        except requests.RequestException:
            pass
        time.sleep(0.3)
    hub.stop()
    raise TimeoutError(f"JupyterHub + sidekick not ready in {timeout:.0f} s: {ready}\n"
                       f"{hub.log_tail()}")


def wait_operation(session: requests.Session, api: str, op_id: str,
                   timeout: float = 120) -> dict[str, Any]:
    """Poll ``api``/operations/ID until the operation is final; its last state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        op = session.get(api + f"operations/{op_id}").json()
        if op["state"] not in ("pending", "running"):
            return op
        time.sleep(0.3)
    raise AssertionError(f"operation {op_id} still running after {timeout:.0f} s")


def pretty(resp: requests.Response) -> str:
    try:
        return json.dumps(resp.json())[:400]
    except ValueError:
        return resp.text[:400]
