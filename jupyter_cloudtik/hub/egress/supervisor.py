"""Run the egress proxy as a child process of the sidekick and keep it running.

The proxy is a separate process so a bug in its parsing of hostile traffic cannot take the
sidekick down, and so it can be restarted on its own.  Secrets reach it only over its stdin
pipe; closing that pipe ends it, so it cannot outlive us even after a ``kill -9`` of the
sidekick.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import ssl
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ...core import env as envnames  # pure names; hub/egress imports nothing else above
from ...core.process_groups import signal_child
from .ca import DeploymentCA
from .lines import json_lines
from .proxy import DEFAULT_DENY_NETWORKS, Client
from .rules import Rule, RuleSet

__all__ = ["DEFAULT_NO_PROXY", "ENGINES", "EgressSupervisor", "egress_python"]

# the built-in HTTP/1.1 proxy was removed (issue 27): it failed 11 of the attack cases
# mitmproxy holds, and two engines are two sets of guarantees to keep
ENGINES = ("mitmproxy",)
# the package root: the proxy's interpreter may be another environment's (mitmproxy's pins)
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])


def egress_python() -> str:
    """The interpreter that has mitmproxy: ``CLOUDTIK_EGRESS_PYTHON``, else the
    ``egress-proxy`` environment inside this one (``make install`` makes it), else this
    interpreter if mitmproxy is importable here."""
    import importlib.util

    env = os.environ.get(envnames.EGRESS_PYTHON)
    if env:
        return env
    own = Path(sys.prefix) / "egress-proxy" / "bin" / "python"
    if own.exists():
        return str(own)
    if importlib.util.find_spec("mitmproxy") is not None:
        return sys.executable
    raise RuntimeError("egress engine 'mitmproxy' needs mitmproxy in an environment of its "
                       f"own: none at {own} and CLOUDTIK_EGRESS_PYTHON is not set; run "
                       "`make install` (it creates that environment)")

log = logging.getLogger("jupyter_cloudtik.egress.supervisor")

DEFAULT_NO_PROXY = "localhost,127.0.0.1,::1"
_SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                   "/etc/ssl/cert.pem")


def _system_ca_pem() -> bytes:
    """The CAs a session trusts today, so adding ours does not take any away."""
    candidates: list[str] = []
    with contextlib.suppress(ImportError):
        import certifi

        candidates.append(certifi.where())
    paths = ssl.get_default_verify_paths()
    candidates += [p for p in (paths.cafile, paths.openssl_cafile) if p]
    candidates += list(_SYSTEM_BUNDLES)
    for c in candidates:
        with contextlib.suppress(OSError):
            data = Path(c).read_bytes()
            if b"BEGIN CERTIFICATE" in data:
                return data
    return b""


class EgressSupervisor:
    """Starts the proxy, feeds it config, restarts it (with backoff) if it dies.

    ``port`` 0 picks a free port on the first start; restarts reuse that port, since the
    sessions' proxy URLs carry it.
    """

    def __init__(self, state_dir: Path, *, port: int = 0,
                 upstream_ca_bundle: str | None = None,
                 no_proxy: str = DEFAULT_NO_PROXY,
                 deny_networks: Sequence[str] | None = None,
                 allow_anonymous: bool = False,
                 python: str | None = None,
                 engine: str = "mitmproxy",
                 extra_args: Sequence[str] = ()) -> None:
        if engine not in ENGINES:
            raise ValueError(f"egress engine is {engine!r}; allowed: {', '.join(ENGINES)}")
        self.engine = engine
        self.state_dir = Path(state_dir)
        self.dir = self.state_dir / "egress"
        self.requested_port = port
        self.upstream_ca_bundle = upstream_ca_bundle
        self.no_proxy = no_proxy
        self.deny_networks = list(DEFAULT_DENY_NETWORKS if deny_networks is None
                                  else deny_networks)
        self.allow_anonymous = allow_anonymous
        self.python = python or egress_python()
        self.extra_args = list(extra_args)
        self.restarts = 0
        self.port: int | None = None
        self.pid: int | None = None
        self.ca_cert_pem: bytes | None = None
        self._clients: tuple[Client, ...] = ()
        self._rules: RuleSet = RuleSet()
        self._seq = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._acks: dict[int, asyncio.Future] = {}
        self._reader_task: asyncio.Task | None = None
        self._watch_task: asyncio.Task | None = None
        self._stopping = False
        self._ready = asyncio.Event()

    def __repr__(self) -> str:
        return (f"EgressSupervisor(port={self.port}, pid={self.pid}, restarts={self.restarts}, "
                f"rules={[r.id for r in self._rules.rules]!r})")

    # -- paths ---------------------------------------------------------------------------
    @property
    def ca_cert_path(self) -> Path:
        return self.dir / "ca" / DeploymentCA.CERT_NAME

    @property
    def bundle_path(self) -> Path:
        """System CAs plus the deployment CA: what sessions point their TLS clients at."""
        return self.dir / "ca-bundle.pem"

    @property
    def log_path(self) -> Path:
        return self.dir / "egress.log"

    @property
    def rules(self) -> list[Rule]:
        return list(self._rules.rules)

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self, timeout: float = 20.0) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # the proxy makes (or loads) the CA: its private key is read by the proxy process
        # only; the supervisor reads the certificate, once the proxy listens
        self._stopping = False
        await asyncio.wait_for(self._spawn(self.requested_port), timeout)
        self.ca_cert_pem = self.ca_cert_path.read_bytes()
        bundle = _system_ca_pem()
        if bundle and not bundle.endswith(b"\n"):
            bundle += b"\n"
        tmp = self.bundle_path.with_suffix(".tmp")
        tmp.write_bytes(bundle + self.ca_cert_pem)
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.bundle_path)
        self._watch_task = asyncio.create_task(self._watch())

    async def _spawn(self, port: int) -> None:
        # the package is appended to the interpreter's path, after its own site-packages:
        # the proxy's environment keeps its own versions of every library
        boot = (f"import sys; sys.path.append({_PACKAGE_ROOT!r}); "
                "from jupyter_cloudtik.hub.egress.__main__ import main; sys.exit(main())")
        args = [self.python, "-c", boot, "--port", str(port),
                "--ca-dir", str(self.dir / "ca"), *self.extra_args]
        if self.upstream_ca_bundle:
            args += ["--upstream-ca-bundle", str(self.upstream_ca_bundle)]
        self._ready.clear()
        # PYTHONPATH of ours must not put this environment's libraries before the proxy's
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        with open(self.log_path, "ab") as logf:
            self._proc = await asyncio.create_subprocess_exec(
                *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=logf, start_new_session=True, close_fds=True, env=env)
        self.pid = self._proc.pid
        assert self._proc.stdout is not None
        line = await self._proc.stdout.readline()
        if not line:
            code = await self._proc.wait()
            raise RuntimeError(f"egress proxy exited with code {code} before it listened; "
                               f"see {self.log_path}")
        hello = json.loads(line)
        self.port = int(hello["port"])
        self._reader_task = asyncio.create_task(self._read_acks(self._proc))
        await self._push()
        self._ready.set()

    async def _read_acks(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for msg in json_lines(proc.stdout):
            seq = msg.get("seq") if "error" in msg else msg.get("applied")
            fut = self._acks.pop(seq, None) if isinstance(seq, int) else None
            if fut is not None and not fut.done():
                fut.set_result(msg)
        for fut in self._acks.values():
            if not fut.done():
                fut.set_exception(ConnectionError("egress proxy exited"))
        self._acks.clear()

    async def _push(self, timeout: float = 10.0) -> None:
        """Send the current config and wait until the proxy has applied it."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.returncode is not None:
            raise ConnectionError("egress proxy is not running")
        self._seq += 1
        seq = self._seq
        fut = asyncio.get_running_loop().create_future()
        self._acks[seq] = fut
        line = json.dumps(self._config_json(seq)) + "\n"
        proc.stdin.write(line.encode())
        await proc.stdin.drain()
        ack = await asyncio.wait_for(fut, timeout)
        if "error" in ack:
            raise ValueError(f"egress proxy refused the config: {ack['error']}")

    def _config_json(self, seq: int) -> dict[str, Any]:
        return {"seq": seq,
                "clients": [{"user": c.user, "token": c.token, "groups": list(c.groups)}
                            for c in self._clients],
                "rules": [r.to_config() for r in self._rules.rules],
                "allow_anonymous": self.allow_anonymous,
                "deny_networks": self.deny_networks}

    async def _watch(self) -> None:
        """Restart the proxy when it dies: 0.2 s, doubling to 10 s, reset after a minute up."""
        backoff = 0.2
        while not self._stopping:
            proc = self._proc
            assert proc is not None
            started = time.monotonic()
            code = await proc.wait()
            if self._stopping:
                return
            self._ready.clear()
            if time.monotonic() - started > 60:
                backoff = 0.2
            log.warning("egress proxy (pid %s) exited with %s; restarting in %.1fs",
                        proc.pid, code, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)
            if self._stopping:
                return
            try:
                await asyncio.wait_for(self._spawn(self.port or self.requested_port), 20)
                self.restarts += 1
            except (OSError, RuntimeError, ValueError, asyncio.TimeoutError,
                    ConnectionError) as e:
                log.error("egress proxy restart failed: %s", e)
                if self._proc is not None and self._proc.returncode is None:
                    self._kill(self._proc)

    async def wait_ready(self, timeout: float = 20.0) -> None:
        await asyncio.wait_for(self._ready.wait(), timeout)

    @staticmethod
    def _kill(proc: asyncio.subprocess.Process, sig: int = signal.SIGKILL) -> None:
        signal_child(proc, sig)

    async def stop(self, timeout: float = 5.0) -> None:
        """EOF on the pipe (clean exit), then SIGTERM, then SIGKILL to the process group."""
        self._stopping = True
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch_task
        proc = self._proc
        if proc is not None:
            if proc.stdin is not None:
                with contextlib.suppress(Exception):
                    proc.stdin.close()
            for sig in (None, signal.SIGTERM, signal.SIGKILL):
                if sig is not None:
                    self._kill(proc, sig)
                try:
                    await asyncio.wait_for(proc.wait(), timeout / 2 if sig else timeout)
                    break
                except asyncio.TimeoutError:
                    continue
            self._kill(proc, signal.SIGKILL)  # anything left in its group
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task
        self._ready.clear()

    # -- config --------------------------------------------------------------------------
    async def update(self, clients: Iterable[Client | Mapping[str, Any]],
                     rules: Iterable[Rule | Mapping[str, Any]], *,
                     allow_anonymous: bool | None = None) -> None:
        """Replace the whole config (validated here first, errors name the field); returns
        once the proxy has applied it.  Tunnels already open keep running."""
        new_clients = []
        for i, c in enumerate(clients):
            if isinstance(c, Client):
                new_clients.append(c)
                continue
            user, token = c.get("user"), c.get("token")
            if not isinstance(user, str) or not user or ":" in user:
                raise ValueError(f"clients[{i}].user is {user!r}; expected a non-empty name "
                                 "without ':'")
            if not isinstance(token, str) or len(token) < 8:
                raise ValueError(f"clients[{i}].token (user {user!r}) must be a string of "
                                 "at least 8 characters (the value is not shown)")
            new_clients.append(Client(user=user, token=token,
                                      groups=tuple(c.get("groups") or ())))
        new_rules = RuleSet.from_config(list(rules))
        self._clients, self._rules = tuple(new_clients), new_rules
        if allow_anonymous is not None:
            self.allow_anonymous = allow_anonymous
        if self._proc is not None and self._proc.returncode is None and self._ready.is_set():
            try:
                await self._push()
            except ConnectionError:
                if self._stopping or self._watch_task is None:
                    raise
                # the proxy died under us: the restart in progress sends this config
        # otherwise the restart in progress sends it

    # -- what sessions get ---------------------------------------------------------------
    def proxy_url_for(self, user: str, token: str) -> str:
        if self.port is None:
            raise RuntimeError("the egress proxy is not started")
        return f"http://{quote(user, safe='')}:{quote(token, safe='')}@127.0.0.1:{self.port}"

    def session_env(self, user: str, token: str) -> dict[str, str]:
        """Environment for a session: proxy variables (both cases: curl reads lower case
        only for http) and CA bundles for requests, OpenSSL and curl."""
        url = self.proxy_url_for(user, token)
        bundle = str(self.bundle_path)
        return {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
                "NO_PROXY": self.no_proxy, "no_proxy": self.no_proxy,
                "REQUESTS_CA_BUNDLE": bundle, "SSL_CERT_FILE": bundle,
                "CURL_CA_BUNDLE": bundle, "NODE_EXTRA_CA_CERTS": str(self.ca_cert_path)}
