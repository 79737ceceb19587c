"""The side-kick supervisor: runs admin-defined services for users as supervised processes.

Each side-kick is one process (its own session and process group, so stopping it stops
everything it started) listening on a free port of 127.0.0.1.  It is told where it lives
through its environment:

* ``PORT`` / ``CLOUDTIK_SIDEKICK_PORT``: the port to listen on (127.0.0.1 only);
* ``CLOUDTIK_SIDEKICK_PREFIX``: the URL prefix it is proxied under, without a trailing
  slash (``/services/cloudtik/sidekicks/alice/job-gateway``).  The proxy forwards the full
  path, so the service serves *under* the prefix (as jupyter-server-proxy apps with
  ``absolute_url`` do), and its health check is ``GET {prefix}{health_path}``;
* ``CLOUDTIK_SIDEKICK_USER`` / ``CLOUDTIK_SIDEKICK_NAME``: whose side-kick it is;
* ``CLOUDTIK_SIDEKICK_TOKEN``: a random token the supervisor (health checks) and the proxy
  send as ``X-CloudTik-Sidekick-Token``; a service should refuse requests without it, since
  any local user can reach 127.0.0.1;
* ``CLOUDTIK_STATE_DIR``: a folder of its own for state;
* ``CLOUDTIK_ALLOW_LOCAL_EXECUTION``: ``1`` when the hub lets users' code run on its own
  machine (``c.CloudTikHub.allow_local_execution``); the job gateway offers its local
  backends only then;
* the spec's ``env``, with ``{secret: NAME}`` references resolved at every (re)start.

Nothing else of the service's environment: a side-kick runs what a user asks of it, so it
runs in a sandbox (``core/sandbox.py``: its own folder read-write, the system and Python
read-only, no state folder, no ``/proc`` of the service, an unprivileged account), with
an environment made only of the above and a few harmless variables (``PATH``, locale).

A process that exits, or fails ``unhealthy_after`` health checks in a row, is killed and
restarted with backoff; more than ``max_restarts`` restarts in ``restart_window`` seconds
and it is given up (state ``failed``).  Output goes to a per-user, per-side-kick log file
(mode 0600).  What the process itself prints is written as is: the supervisor cannot
redact the file, only what ``logs()`` and error messages return (known secret values are
replaced by ``***`` there).

Running processes are also recorded in ``processes.json`` (pid and start time), so a
supervisor started after a crash finds and stops side-kicks the previous one left behind.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import json
import logging
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil

from ...core import env as envnames
from ...core import ports
from ...core.errors import CloudTikError, ConfigError, ConflictError, NotFoundError
from ...core.process_groups import GroupRef, Owned, terminate_group, writes_under
from ...core.sandbox import Sandbox
from .specs import SecretRef, SidekickSpec

STARTING, RUNNING, RESTARTING, STOPPED, FAILED = (
    "starting", "running", "restarting", "stopped", "failed")
STATES = (STARTING, RUNNING, RESTARTING, STOPPED, FAILED)
ACTIVE = (STARTING, RUNNING, RESTARTING)

TOKEN_HEADER = "X-CloudTik-Sidekick-Token"
DEFAULT_PROXY_BASE = "/services/cloudtik/sidekicks"
MAX_LOG_BYTES = 5 << 20

SecretResolver = Callable[[str], Any]  # name -> value, or an awaitable of it


class SidekickError(CloudTikError):
    """A side-kick could not be started (or was stopped while starting)."""

    http_status = 502
    reason = "sidekick_failed"


def sidekick_prefix(user: str, name: str, base: str = DEFAULT_PROXY_BASE) -> str:
    """The URL prefix a side-kick is proxied under (no trailing slash)."""
    return f"{base.rstrip('/')}/{quote(user, safe='')}/{name}"


def _safe(user: str) -> str:
    """A user name as a folder name: reversible, no '/', no '..', no collisions."""
    out = "".join(c if (c.isascii() and c.isalnum()) or c in ".-" else f"_{ord(c):02x}"
                  for c in user)
    return "_2e" + out[1:] if out.startswith(".") else out


@dataclass
class HealthResult:
    time: float
    ok: bool
    detail: str


@dataclass
class SidekickInfo:
    """A side-kick as the routes, the magic and tests see it (no token, no env)."""

    user: str
    name: str
    state: str
    prefix: str
    pid: int | None = None
    port: int | None = None
    restarts: int = 0
    last_health: dict[str, Any] | None = None  # {time, ok, detail}
    started_at: float | None = None
    last_activity: float | None = None
    reason: str | None = None  # why it is restarting / stopped / failed
    description: str = ""

    @property
    def url(self) -> str:
        return self.prefix + "/"

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "url": self.url}


class _Sidekick:
    """Everything the supervisor knows about one user's side-kick."""

    def __init__(self, user: str, spec: SidekickSpec, prefix: str) -> None:
        self.user = user
        self.spec = spec
        self.prefix = prefix
        self.state = STOPPED
        self.proc: subprocess.Popen | None = None
        self.create_time: float | None = None
        self.port: int | None = None
        self.token = ""
        self.secret_values: set[str] = set()
        self.resolver: SecretResolver | None = None  # of the start that runs it
        self.restarts = 0
        self.restart_times: collections.deque[float] = collections.deque()
        self.failures = 0
        self.last_health: HealthResult | None = None
        self.started_at: float | None = None
        self.last_activity = time.monotonic()
        self.last_activity_wall: float | None = None
        self.next_check = 0.0
        self.reason: str | None = None
        self.task: asyncio.Task | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def __repr__(self) -> str:
        return f"<sidekick {self.user}/{self.name} {self.state} pid={self.pid}>"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def touch(self) -> None:
        self.last_activity = time.monotonic()
        self.last_activity_wall = time.time()

    def redact(self, text: str) -> str:
        for value in sorted(self.secret_values, key=len, reverse=True):
            if value:
                text = text.replace(value, "***")
        return text

    def info(self) -> SidekickInfo:
        h = self.last_health
        return SidekickInfo(
            user=self.user, name=self.name, state=self.state, prefix=self.prefix,
            pid=self.pid if self.state in ACTIVE else None,
            port=self.port if self.state in ACTIVE else None, restarts=self.restarts,
            last_health=asdict(h) if h else None, started_at=self.started_at,
            last_activity=self.last_activity_wall, reason=self.reason,
            description=self.spec.description)


class SidekickSupervisor:
    """All side-kicks of a hub service; one per process, used from its event loop."""

    def __init__(self, state_dir: Path, *, secret_resolver: SecretResolver | None = None,
                 log: logging.Logger | logging.LoggerAdapter | None = None,
                 python: str = sys.executable, sandbox: Sandbox | None = None,
                 allow_local_execution: bool = False,
                 restart_backoff: float = 1.0, restart_backoff_max: float = 30.0) -> None:
        """``sandbox``: how side-kicks are confined (default: bubblewrap, with the
        supervisor's state folder hidden); ``allow_local_execution``: tell side-kicks
        (the job gateway) they may run users' jobs on this machine (in their sandbox)."""
        self.state_dir = Path(state_dir)
        self.root = self.state_dir / "sidekicks"
        self.secret_resolver = secret_resolver
        self.log = log or logging.getLogger("jupyter_cloudtik.hub.sidekicks")
        self.python = python
        self.sandbox = sandbox if sandbox is not None else Sandbox(
            hidden=(str(self.state_dir.resolve()),))
        self.allow_local_execution = allow_local_execution
        self.restart_backoff = restart_backoff
        self.restart_backoff_max = restart_backoff_max
        self._entries: dict[tuple[str, str], _Sidekick] = {}
        self._background: asyncio.Task | None = None
        self._records_lock = threading.Lock()

    def __repr__(self) -> str:
        active = sum(1 for e in self._entries.values() if e.state in ACTIVE)
        return f"<SidekickSupervisor {self.root} active={active}>"

    # --- reading ---------------------------------------------------------------------------
    def get(self, user: str, name: str) -> SidekickInfo:
        return self._entry(user, name).info()

    def list(self, user: str | None = None) -> list[SidekickInfo]:
        """Side-kicks known to this supervisor (stopped and failed ones too)."""
        return [e.info() for (u, _), e in sorted(self._entries.items())
                if user is None or u == user]

    def touch(self, user: str, name: str) -> bool:
        """Count a request as activity (for the idle timeout); False if not running."""
        e = self._entries.get((user, name))
        if e is None or e.state not in ACTIVE:
            return False
        e.touch()
        return True

    def proxy_target(self, user: str, name: str) -> tuple[str, dict[str, str]]:
        """Where the proxy sends a request (``http://127.0.0.1:PORT``) and the header it
        must add; refuses side-kicks that are not running."""
        e = self._entry(user, name)
        if e.state != RUNNING or e.port is None:
            raise ConflictError(f"sidekick: '{name}' is {e.state}"
                                + (f" ({e.reason})" if e.reason else ""),
                                field="sidekick", value=name)
        e.touch()
        return f"http://127.0.0.1:{e.port}", {TOKEN_HEADER: e.token}

    async def logs(self, user: str, name: str, tail: int = 200) -> str:
        """The last ``tail`` lines of the side-kick's log, known secret values masked."""
        e = self._entries.get((user, name))
        path = self._log_path(user, name)
        if e is None and not path.exists():
            self._entry(user, name)  # raises the not-found error
        text = await asyncio.to_thread(_tail, path, tail)
        return e.redact(text) if e else text

    def log_path(self, user: str, name: str) -> Path:
        return self._log_path(user, name)

    # --- acting ----------------------------------------------------------------------------
    async def start(self, user: str, spec: SidekickSpec, *, prefix: str | None = None,
                    secret_resolver: SecretResolver | None = None) -> SidekickInfo:
        """Start ``spec`` for ``user`` and return once it answers its health check.

        Idempotent: a side-kick that is already starting, running or restarting is left
        as it is (with the spec it was started with) and its info returned; stop it first
        to apply a changed spec.  Permission (``spec.allows``) is the caller's to check;
        ``secret_resolver`` reads the spec's ``{secret: NAME}`` values (the hub's reads
        them against the user's grant to run this side-kick), at this start and restarts.
        """
        if not isinstance(user, str) or not user:
            raise ConfigError("user: a non-empty user name is required", field="user")
        key = (user, spec.name)
        e = self._entries.get(key)
        if e is None:
            e = self._entries[key] = _Sidekick(user, spec, "")
        if e.state not in ACTIVE:
            e.spec = spec
            e.resolver = secret_resolver
            e.prefix = _normalize_prefix(prefix if prefix is not None
                                         else sidekick_prefix(user, spec.name))
            e.state, e.reason, e.restarts, e.failures = STARTING, None, 0, 0
            e.restart_times.clear()
            e.last_health = None
            e.touch()
            e.task = asyncio.create_task(self._start_task(e),
                                         name=f"sidekick-start-{user}-{spec.name}")
        task = e.task
        if e.state == STARTING and task is not None and not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
                raise SidekickError(f"sidekick: '{spec.name}' was stopped while starting",
                                    field="sidekick", value=spec.name) from None
        e.touch()
        return e.info()

    async def stop(self, user: str, name: str, reason: str = "stopped by request"
                   ) -> SidekickInfo:
        e = self._entry(user, name)
        await self._stop_entry(e, reason)
        return e.info()

    async def stop_user(self, user: str, reason: str = "the user's session ended"
                        ) -> list[SidekickInfo]:
        """Stop all of a user's side-kicks (when their session ends)."""
        entries = [e for (u, _), e in self._entries.items() if u == user]
        await asyncio.gather(*(self._stop_entry(e, reason) for e in entries))
        return [e.info() for e in entries]

    async def shutdown(self) -> None:
        """Stop the health checks and every side-kick (the hub service is exiting)."""
        await self.stop_background()
        await asyncio.gather(*(self._stop_entry(e, "the supervisor shut down")
                               for e in list(self._entries.values())))

    # --- health ----------------------------------------------------------------------------
    async def run_health_checks_once(self, *, due_only: bool = False) -> None:
        """One round: restart exited or unhealthy side-kicks, stop idle ones.

        ``due_only`` (the background loop) probes only side-kicks whose health_interval
        has passed; exits and idle timeouts are noticed at every round.
        """
        now = time.monotonic()
        entries = [e for e in self._entries.values() if e.state == RUNNING]
        await asyncio.gather(*(self._check(e, probe=not due_only or now >= e.next_check)
                               for e in entries))

    def start_background(self) -> None:
        """Start the health-check loop (call from the running event loop); it first stops
        side-kicks a previous supervisor of this state folder left behind."""
        if self._background is None or self._background.done():
            self._background = asyncio.create_task(self._loop(), name="sidekick-health")

    async def stop_background(self) -> None:
        task, self._background = self._background, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def recover_orphans(self) -> list[dict[str, Any]]:
        """Stop processes recorded by an earlier supervisor that are still running (same
        pid *and* start time, so a recycled pid is never killed); returns their records."""
        ours = {e.pid for e in self._entries.values() if e.state in ACTIVE}
        killed = []
        for rec in await asyncio.to_thread(self._read_records):
            pid = rec.get("pid")
            if not isinstance(pid, int) or pid in ours:
                continue
            if _same_process(pid, rec.get("create_time")):
                self.log.warning("sidekick %s/%s: stopping pid %s left by an earlier run",
                                 rec.get("user"), rec.get("name"), pid)
                await _kill_group(GroupRef(pid, rec.get("create_time")), None,
                                  grace=5.0, owned=writes_under(self._user_dir(
                                      str(rec.get("user")))))
                killed.append(rec)
        await asyncio.to_thread(self._write_records)
        return killed

    # --- internals -------------------------------------------------------------------------
    def _entry(self, user: str, name: str) -> _Sidekick:
        e = self._entries.get((user, name))
        if e is None:
            mine = ", ".join(n for (u, n) in self._entries if u == user) or "none"
            raise NotFoundError(f"sidekick: user '{user}' has no side-kick '{name}'; "
                                f"theirs: {mine}", field="sidekick", value=name)
        return e

    def _user_dir(self, user: str) -> Path:
        return self.root / _safe(user)

    def _log_path(self, user: str, name: str) -> Path:
        return self._user_dir(user) / f"{name}.log"

    async def _loop(self) -> None:
        try:
            await self.recover_orphans()
        except Exception:
            self.log.exception("sidekicks: could not check for orphaned processes")
        while True:
            try:
                await self.run_health_checks_once(due_only=True)
            except Exception:
                self.log.exception("sidekicks: health-check round failed")
            running = [e.spec.health_interval for e in self._entries.values()
                       if e.state == RUNNING]
            await asyncio.sleep(max(0.05, min([1.0, *running])))

    async def _check(self, e: _Sidekick, probe: bool) -> None:
        if e.state != RUNNING or e.proc is None:
            return
        idle = e.spec.idle_timeout_minutes * 60
        if idle > 0 and time.monotonic() - e.last_activity > idle:
            await self._stop_entry(e, f"idle for {e.spec.idle_timeout_minutes:g} minutes")
            return
        rc = e.proc.poll()
        if rc is not None:
            self._begin_restart(e, f"the process exited with code {rc}")
            return
        if not probe:
            return
        e.next_check = time.monotonic() + e.spec.health_interval
        result = await self._probe(e)
        if e.state != RUNNING:  # stopped or restarted while we waited
            return
        e.last_health = result
        if result.ok:
            e.failures = 0
            return
        e.failures += 1
        self.log.info("sidekick %s/%s: health check failed (%d/%d): %s", e.user, e.name,
                      e.failures, e.spec.unhealthy_after, result.detail)
        if e.failures >= e.spec.unhealthy_after:
            self._begin_restart(e, f"{e.failures} health checks failed in a row "
                                   f"(last: {result.detail})")

    def _begin_restart(self, e: _Sidekick, why: str) -> None:
        self.log.warning("sidekick %s/%s: restarting: %s", e.user, e.name, why)
        e.state, e.reason = RESTARTING, why
        e.task = asyncio.create_task(self._restart_task(e, why),
                                     name=f"sidekick-restart-{e.user}-{e.name}")

    async def _start_task(self, e: _Sidekick) -> None:
        try:
            await self._launch(e)
        except asyncio.CancelledError:
            await self._kill(e)
            raise
        except Exception as exc:
            await self._kill(e)
            e.state = FAILED
            e.reason = e.redact(getattr(exc, "message", None) or f"{type(exc).__name__}")
            self.log.warning("sidekick %s/%s: start failed: %s", e.user, e.name, e.reason)
            if isinstance(exc, CloudTikError):
                raise
            raise SidekickError(f"sidekick: '{e.name}' could not be started: {e.reason}",
                                field="sidekick", value=e.name) from None
        e.state, e.failures = RUNNING, 0
        e.next_check = time.monotonic() + e.spec.health_interval

    async def _restart_task(self, e: _Sidekick, why: str) -> None:
        while True:
            await self._kill(e)
            now = time.monotonic()
            while e.restart_times and now - e.restart_times[0] > e.spec.restart_window:
                e.restart_times.popleft()
            if len(e.restart_times) >= e.spec.max_restarts:
                e.state = FAILED
                e.reason = (f"gave up after {len(e.restart_times)} restarts within "
                            f"{e.spec.restart_window:g}s (max_restarts "
                            f"{e.spec.max_restarts}); last problem: {why}")
                self.log.error("sidekick %s/%s: %s", e.user, e.name, e.reason)
                self._note(e, f"failed: {e.reason}")
                return
            n = len(e.restart_times)
            delay = 0.0 if n == 0 else min(self.restart_backoff_max,
                                           self.restart_backoff * 2 ** (n - 1))
            e.restart_times.append(now)
            e.restarts += 1
            e.state, e.reason = RESTARTING, why
            self._note(e, f"restarting in {delay:g}s: {why}")
            await asyncio.sleep(delay)
            try:
                await self._launch(e)
            except asyncio.CancelledError:
                await self._kill(e)
                raise
            except Exception as exc:
                why = e.redact(getattr(exc, "message", None) or type(exc).__name__)
                continue
            e.state, e.failures = RUNNING, 0
            e.next_check = time.monotonic() + e.spec.health_interval
            self.log.info("sidekick %s/%s: running again (restart %d)", e.user, e.name,
                          e.restarts)
            return

    async def _stop_entry(self, e: _Sidekick, reason: str) -> None:
        task, e.task = e.task, None
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        was = e.state
        await self._kill(e)
        if was in ACTIVE:
            e.state, e.reason = STOPPED, reason
            self._note(e, f"stopped: {reason}")
            self.log.info("sidekick %s/%s: stopped: %s", e.user, e.name, reason)

    async def _environment(self, e: _Sidekick, workdir: Path) -> dict[str, str]:
        """All a side-kick's process gets: an allowlist, never the service's own
        variables (hub tokens, the secret key, catalogue secrets read from its env)."""
        env = self.sandbox.environment({
            "PYTHONUNBUFFERED": "1",
            envnames.STATE_DIR: str(workdir / "state"),
            envnames.ALLOW_LOCAL_EXECUTION: "1" if self.allow_local_execution else "0",
        }, home=workdir)
        values: set[str] = set()
        secret_names = []
        for key, value in e.spec.env.items():
            if isinstance(value, SecretRef):
                value = await self._resolve(key, value.secret, e.resolver)
                values.add(value)
                secret_names.append(key)
            env[key] = value
        e.secret_values = values
        env[envnames.SIDEKICK_SECRET_ENV] = ",".join(secret_names)
        env.update({
            "PORT": str(e.port), envnames.SIDEKICK_PORT: str(e.port),
            envnames.SIDEKICK_PREFIX: e.prefix, envnames.SIDEKICK_USER: e.user,
            envnames.SIDEKICK_NAME: e.name, envnames.SIDEKICK_TOKEN: e.token,
        })
        return env

    async def _resolve(self, key: str, secret: str,
                       resolver: SecretResolver | None = None) -> str:
        resolver = resolver or self.secret_resolver
        if resolver is None:
            raise ConfigError(f"env.{key}: refers to secret '{secret}' but this supervisor "
                              "has no secret resolver", field=f"env.{key}")
        try:
            value = resolver(secret)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:  # its text may quote what it read: name the type only
            detail = exc.message if isinstance(exc, CloudTikError) else type(exc).__name__
            raise ConfigError(f"env.{key}: secret '{secret}' could not be read ({detail})",
                              field=f"env.{key}") from None
        if not isinstance(value, str) or not value:
            raise ConfigError(f"env.{key}: secret '{secret}' is empty or not text",
                              field=f"env.{key}")
        return value

    async def _launch(self, e: _Sidekick) -> None:
        """Spawn the process and wait until it answers its health check."""
        workdir = self._user_dir(e.user) / e.name
        await asyncio.to_thread(self.sandbox.check)  # no sandbox here: refuse, say why
        await asyncio.to_thread(_make_dirs, workdir / "state")
        await asyncio.to_thread(self.sandbox.prepare, workdir)
        e.port = _free_port(e.port)
        e.token = secrets.token_urlsafe(24)
        env = await self._environment(e, workdir)
        argv = self.sandbox.command(e.spec.argv(self.python), writable=[workdir],
                                    cwd=workdir, die_with_parent=True)
        log_path = self._log_path(e.user, e.name)
        fd = await asyncio.to_thread(_open_log, log_path)
        try:
            os.write(fd, f"[cloudtik {time.strftime('%Y-%m-%d %H:%M:%S')}] starting on "
                         f"port {e.port} under {e.prefix or '/'}\n".encode())
            e.proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                      stdout=fd, stderr=subprocess.STDOUT,
                                      start_new_session=True, close_fds=True)
        except OSError as exc:
            raise SidekickError(f"sidekick: '{e.name}' could not be started: {argv[0]}: "
                                f"{exc.strerror or exc}", field="command") from None
        finally:
            os.close(fd)
        try:
            e.create_time = psutil.Process(e.proc.pid).create_time()
        except psutil.Error:
            e.create_time = None
        e.started_at = time.time()
        await asyncio.to_thread(self._write_records)
        self.log.info("sidekick %s/%s: started pid %s on port %s", e.user, e.name,
                      e.proc.pid, e.port)
        await self._wait_ready(e)

    async def _wait_ready(self, e: _Sidekick) -> None:
        assert e.proc is not None
        deadline = time.monotonic() + e.spec.startup_timeout
        step = min(0.1, e.spec.health_interval)
        result = HealthResult(time.time(), False, "not asked yet")
        while True:
            rc = e.proc.poll()
            if rc is not None:
                raise SidekickError(
                    f"sidekick: '{e.name}' exited with code {rc} while starting"
                    + await self._log_hint(e), field="sidekick", value=e.name)
            result = await self._probe(e)
            e.last_health = result
            if result.ok:
                return
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(step)
        raise SidekickError(
            f"sidekick: '{e.name}' did not answer GET {e.prefix}{e.spec.health_path} with "
            f"200 within startup_timeout {e.spec.startup_timeout:g}s (last: {result.detail})"
            + await self._log_hint(e), field="sidekick", value=e.name)

    async def _log_hint(self, e: _Sidekick, lines: int = 8) -> str:
        text = await asyncio.to_thread(_tail, self._log_path(e.user, e.name), lines)
        text = e.redact(text).strip()
        return f"; its log ends with:\n{text}" if text else ""

    async def _probe(self, e: _Sidekick) -> HealthResult:
        path = f"{e.prefix}{e.spec.health_path}"
        now = time.time()
        try:
            status = await asyncio.wait_for(_http_status(e.port, path, e.token),
                                            e.spec.health_timeout)
        except asyncio.TimeoutError:
            return HealthResult(now, False, f"no answer within {e.spec.health_timeout:g}s")
        except OSError as exc:
            return HealthResult(now, False, exc.strerror or type(exc).__name__)
        except ValueError as exc:
            return HealthResult(now, False, str(exc))
        return HealthResult(now, status == 200, f"HTTP {status}")

    async def _kill(self, e: _Sidekick) -> None:
        proc, e.proc = e.proc, None
        if proc is None:
            return
        # keep the pid visible in info() until it is really gone
        await _kill_group(GroupRef(proc.pid, e.create_time), proc,
                          grace=e.spec.stop_timeout,
                          owned=writes_under(self._user_dir(e.user)))
        await asyncio.to_thread(self._write_records)

    def _note(self, e: _Sidekick, text: str) -> None:
        """A supervisor line in the side-kick's log, so users see why it restarted."""
        try:
            fd = _open_log(self._log_path(e.user, e.name), rotate=False)
        except OSError:
            return
        try:
            os.write(fd, f"[cloudtik {time.strftime('%Y-%m-%d %H:%M:%S')}] {text}\n"
                     .encode())
        finally:
            os.close(fd)

    # process records ------------------------------------------------------------------------
    def _records_path(self) -> Path:
        return self.root / "processes.json"

    def _read_records(self) -> list[dict[str, Any]]:
        try:
            data = json.loads(self._records_path().read_text())
        except (OSError, ValueError):
            return []
        return data if isinstance(data, list) else []

    def _write_records(self) -> None:
        """Rewrite ``processes.json``; one writer at a time (side-kicks stopped together
        write from several threads: two of them once renamed one temporary file)."""
        with self._records_lock:
            recs = []
            for e in list(self._entries.values()):
                proc = e.proc  # read once: the event loop may clear it meanwhile
                if proc is not None:
                    recs.append({"user": e.user, "name": e.name, "pid": proc.pid,
                                 "create_time": e.create_time, "port": e.port,
                                 "started_at": e.started_at})
            _make_dirs(self.root)
            path = self._records_path()
            tmp = path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(recs, f)
            os.replace(tmp, path)


# --- helpers ------------------------------------------------------------------------------------

def _normalize_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or (prefix and not prefix.startswith("/")) \
            or re.search(r"[\s?#]", prefix):
        raise ConfigError(f"prefix: {prefix!r} is not allowed; expected a URL path starting "
                          "with '/'", field="prefix")
    return prefix.rstrip("/")


def _make_dirs(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)


def _open_log(path: Path, rotate: bool = True) -> int:
    _make_dirs(path.parent)
    if rotate:
        with contextlib.suppress(OSError):
            if path.stat().st_size > MAX_LOG_BYTES:
                os.replace(path, path.with_suffix(".log.1"))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max(4096, lines * 400)))
            data = f.read()
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", "replace")
    return "".join(text.splitlines(keepends=True)[-lines:]) if lines > 0 else ""


def _free_port(prefer: int | None = None) -> int:
    """A free loopback port, the previous one if it is still free (the proxy keeps it)."""
    try:
        return ports.free_port("127.0.0.1", prefer)
    except OSError as e:
        raise SidekickError(f"sidekick: no free port on 127.0.0.1 ({e})") from None


async def _http_status(port: int | None, path: str, token: str) -> int:
    if port is None:
        raise ValueError("no port")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                     f"{TOKEN_HEADER}: {token}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        line = await reader.readline()
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    parts = line.decode("latin-1").split()
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError("not an HTTP answer" if line else "closed without an answer")
    return int(parts[1])


def _same_process(pid: int, create_time: Any) -> bool:
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return isinstance(create_time, (int, float)) and abs(p.create_time() - create_time) < 0.5
    except psutil.Error:
        return False


async def _kill_group(ref: GroupRef, proc: subprocess.Popen | None, grace: float,
                      owned: Owned | None = None) -> None:
    """SIGTERM the side-kick's process group, SIGKILL what is left after ``grace``; each
    signal decided by core/process_groups (a group number no longer ours is never
    signalled; once the leader is gone, only members writing to the side-kick's log are)."""
    def stop() -> None:
        nonlocal ref
        if proc is not None and ref.started is None and proc.poll() is None:
            ref = GroupRef.of(proc.pid)  # our child, not reaped: its number is still ours
        terminate_group(ref, grace, owned)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    await asyncio.to_thread(stop)


__all__ = ["ACTIVE", "DEFAULT_PROXY_BASE", "FAILED", "RESTARTING", "RUNNING", "STARTING",
           "STATES", "STOPPED", "TOKEN_HEADER", "HealthResult", "SidekickError",
           "SidekickInfo", "SidekickSupervisor", "sidekick_prefix"]
