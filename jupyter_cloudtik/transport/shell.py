"""Running commands and moving files on a login node: here, or over SSH (used by the HPC
backends and the Slurm node provider alike, through ``transport.slurm`` or directly).

``LocalShell`` is for a server that runs on the login node itself; ``SSHShell`` talks to a
remote one with asyncssh (one connection, kept and reused; commands and SFTP share it).
The private key comes from the secret store and stays in memory: it is never written to
a file.  Connection trouble becomes ``BackendUnavailable`` (try again later); a refused
login is a ``ProviderError`` naming the secret to fix.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import subprocess
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.bridge import bridge
from ..core.errors import BackendUnavailable, NotFoundError, ProviderError


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str

    @property
    def message(self) -> str:
        return (self.stderr.strip() or self.stdout.strip() or f"exit code {self.rc}")[-2000:]


class LocalShell:
    """Commands and files on this machine."""

    where = "this machine"

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = dict(env or {})

    def run(self, argv: list[str], input: bytes | None = None, timeout: float = 60.0,
            cwd: str | None = None) -> Result:
        try:
            proc = subprocess.run(argv, input=input, capture_output=True, timeout=timeout,
                                  env={**os.environ, **self.env}, cwd=cwd)
        except FileNotFoundError:
            raise ProviderError(f"'{argv[0]}' is not installed on {self.where}") from None
        except subprocess.TimeoutExpired:
            raise BackendUnavailable(
                f"'{argv[0]}' did not finish within {timeout:.0f}s on {self.where}") from None
        return Result(proc.returncode, proc.stdout.decode(errors="replace"),
                      proc.stderr.decode(errors="replace"))

    def home(self) -> str:
        return str(Path.home())

    def mkdir(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)

    def write_bytes(self, path: str, data: bytes, mode: int = 0o644) -> None:
        p = Path(path)
        p.write_bytes(data)
        p.chmod(mode)

    def read_bytes(self, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        try:
            with open(path, "rb") as f:
                # past the end: nothing (seeking there may fail with EINVAL)
                if offset >= os.fstat(f.fileno()).st_size:
                    return b""
                f.seek(offset)
                return f.read() if limit is None else f.read(limit)
        except FileNotFoundError:
            raise NotFoundError(f"{path} does not exist on {self.where}", field="name") from None

    def exists(self, path: str) -> bool:
        return Path(path).exists()

    def put(self, local: Path, remote: str) -> None:
        if local.is_dir():
            shutil.copytree(local, remote, dirs_exist_ok=True)
        else:
            Path(remote).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, remote)

    def get(self, remote: str, local: Path) -> None:
        src = Path(remote)
        if not src.exists():
            raise NotFoundError(f"{remote} does not exist on {self.where}", field="name")
        local.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, local, dirs_exist_ok=True)
        else:
            shutil.copyfile(src, local)

    def walk(self, path: str) -> list[tuple[str, int]]:
        root = Path(path)
        if not root.exists():
            raise NotFoundError(f"{path} does not exist on {self.where}", field="job")
        out = []
        for dirpath, _dirs, files in os.walk(root):
            for fn in files:
                full = Path(dirpath) / fn
                try:
                    out.append((full.relative_to(root).as_posix(), full.stat().st_size))
                except OSError:
                    continue
        return sorted(out)

    def close(self) -> None:
        pass


#: SSH keepalive (asyncssh's ``keepalive_interval`` / ``keepalive_count_max``, OpenSSH's
#: ServerAliveInterval / ServerAliveCountMax): a request every 15 s of silence, the
#: connection closed when 3 in a row get no answer — a dead link is noticed within about
#: a minute instead of when a command hangs on it.  0 turns it off
KEEPALIVE_INTERVAL = 15.0
KEEPALIVE_COUNT_MAX = 3


#: what a connection that forwards ports runs on a pty to turn sshd's Nagle off (see
#: ``interactive``); it reads a pty nobody writes to, until the connection closes
PTY_KEEPER = "cat"

_log = logging.getLogger(__name__)
# connection -> its pty session (or False: the site gave none)
_PTYS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


async def interactive(conn: Any, where: str) -> None:
    """Make sshd send what it has at once on ``conn``: open one session on a pty (``cat``,
    kept until the connection closes).  Why: OpenSSH's sshd turns TCP_NODELAY on for a
    connection only once a session gets a pty (session.c ``do_exec_pty`` calls
    ``ssh_packet_set_interactive(ssh, 1, ...)``); a connection that only forwards ports
    keeps Nagle's algorithm, and each small reply of a kernel then waits for the delayed
    ACK: a cell's round trip measured 44-48 ms through the login node and the node
    against 5-6 ms with a pty session on both (``benchmarks/hpc_kernel_tunnels.py``).  A
    site that refuses ptys (``PermitTTY no``) still forwards; only slower, said once."""
    import asyncssh

    if conn in _PTYS:
        return
    try:
        proc = await asyncio.wait_for(
            conn.create_process(PTY_KEEPER, term_type="dumb", term_size=(80, 24),
                                encoding=None), 15)
    except (OSError, asyncssh.Error, asyncio.TimeoutError) as e:
        _PTYS[conn] = False
        _log.info("%s gave no pty (%s): forwarded ports there keep sshd's Nagle delays "
                  "(about 40 ms per small reply)", where, e)
        return
    _PTYS[conn] = proc


class SSHShell:
    """Commands and files on a remote login node over one kept SSH connection."""

    def __init__(self, host: str, *, user: str | None = None, port: int = 22,
                 private_key: str | None = None, passphrase: str | None = None,
                 known_hosts: str | None = None, check_host_key: bool = True,
                 connect_timeout: float = 15.0, env: dict[str, str] | None = None,
                 keepalive_interval: float = KEEPALIVE_INTERVAL,
                 keepalive_count_max: int = KEEPALIVE_COUNT_MAX) -> None:
        self.host, self.user, self.port = host, user, port
        self.where = f"{user + '@' if user else ''}{host}:{port}"
        self._key, self._passphrase = private_key, passphrase
        self.known_hosts = known_hosts
        self.check_host_key = check_host_key
        self.connect_timeout = connect_timeout
        self.keepalive_interval, self.keepalive_count_max = keepalive_interval, \
            keepalive_count_max
        self.env = dict(env or {})
        self._conn = None
        self._sftp = None
        self._loop = None
        self._lock = threading.Lock()
        self._home: str | None = None

    # the connection ---------------------------------------------------------------------
    def _runner(self):
        if self._loop is None:
            self._loop = bridge()  # the process's loop thread (stop() leaves it running)
        return self._loop

    async def _connect(self):
        import asyncssh

        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        # closed under us (the keepalive gave up, the server went away): a new one
        self._conn = self._sftp = None
        kwargs = self._options(self.port, self._keys())
        try:
            self._conn = await asyncssh.connect(self.host, **kwargs)
        except asyncssh.PermissionDenied as e:
            raise ProviderError(
                f"{self.where} refused the SSH login ({e.reason}); check the user and the key "
                "(`jupyter cloudtik jobs secret BACKEND ssh_key`)") from None
        except asyncssh.HostKeyNotVerifiable as e:
            raise ProviderError(
                f"the host key of {self.where} is not known ({e.reason}); add it to "
                "known_hosts (or set the backend's known_hosts)") from None
        except (OSError, asyncssh.Error, TimeoutError) as e:
            raise BackendUnavailable(f"cannot connect to {self.where}: {e}") from None
        return self._conn

    def _options(self, port: int, keys: list[Any] | None) -> dict[str, Any]:
        """asyncssh.connect's options: this shell's user, key, known hosts, keepalive."""
        if not self.check_host_key:
            known_hosts: Any = None
        elif self.known_hosts:
            known_hosts = os.path.expanduser(self.known_hosts)
        else:
            known_hosts = ()  # asyncssh default: ~/.ssh/known_hosts
        kwargs: dict[str, Any] = {"port": port, "username": self.user,
                                  "connect_timeout": self.connect_timeout,
                                  "agent_path": None if keys else (),
                                  # a connection that died without a FIN (a login node
                                  # gone, a NAT that forgot us) is noticed and closed
                                  # after this many seconds without an answer
                                  "keepalive_interval": self.keepalive_interval,
                                  "keepalive_count_max": self.keepalive_count_max}
        if keys:
            kwargs["client_keys"] = keys
        if known_hosts != ():
            kwargs["known_hosts"] = known_hosts
        return kwargs

    def _keys(self) -> list[Any] | None:
        import asyncssh

        if not self._key:
            return None
        try:
            return [asyncssh.import_private_key(self._key, self._passphrase)]
        except (asyncssh.KeyImportError, ValueError) as e:
            raise ProviderError(
                f"the SSH key for {self.where} cannot be read ({e}); set it again with "
                "`jupyter cloudtik jobs secret BACKEND ssh_key`") from None

    def _call(self, coro_fn, timeout: float | None = None):
        """Run ``coro_fn(conn)`` on the SSH loop; a broken connection is dropped."""
        import asyncssh

        async def go():
            conn = await self._connect()
            return await coro_fn(conn)

        with self._lock:
            try:
                return self._runner().run(go(), timeout)
            except (ProviderError, NotFoundError):
                raise
            except (OSError, asyncssh.Error, TimeoutError, EOFError) as e:
                if isinstance(e, asyncssh.SFTPNoSuchFile | FileNotFoundError):
                    raise NotFoundError(f"{e} on {self.where}", field="name") from None
                self._drop()
                raise BackendUnavailable(f"lost the connection to {self.where}: {e}") from None

    def _drop(self) -> None:
        conn, self._conn, self._sftp = self._conn, None, None
        if conn is not None:
            try:
                conn.abort()
            except Exception:
                pass

    async def _sftp_client(self, conn):
        if self._sftp is None:
            self._sftp = await conn.start_sftp_client()
        return self._sftp

    # commands ---------------------------------------------------------------------------------
    def run(self, argv: list[str], input: bytes | None = None, timeout: float = 60.0,
            cwd: str | None = None) -> Result:
        cmd = shlex.join(argv)
        if self.env:
            cmd = "env " + " ".join(shlex.quote(f"{k}={v}") for k, v in self.env.items()) \
                + " " + cmd
        if cwd:
            cmd = f"cd {shlex.quote(cwd)} && {cmd}"

        async def go(conn):
            r = await conn.run(cmd, input=input.decode() if input else None, check=False,
                               timeout=timeout)
            return Result(r.exit_status if r.exit_status is not None else -1,
                          str(r.stdout or ""), str(r.stderr or ""))

        try:
            return self._call(go, timeout + 10)
        except BackendUnavailable:
            raise

    def home(self) -> str:
        if self._home is None:
            r = self.run(["sh", "-c", "echo $HOME"])
            self._home = r.stdout.strip() or "."
        return self._home

    # files ------------------------------------------------------------------------------------
    def mkdir(self, path: str) -> None:
        async def go(conn):
            sftp = await self._sftp_client(conn)
            await sftp.makedirs(path, exist_ok=True)

        self._call(go)

    def write_bytes(self, path: str, data: bytes, mode: int = 0o644) -> None:
        async def go(conn):
            sftp = await self._sftp_client(conn)
            async with sftp.open(path, "wb") as f:
                await f.write(data)
            await sftp.chmod(path, mode)

        self._call(go)

    def read_bytes(self, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        async def go(conn):
            sftp = await self._sftp_client(conn)
            async with sftp.open(path, "rb") as f:
                return await f.read(-1 if limit is None else limit, offset)

        return self._call(go)

    def exists(self, path: str) -> bool:
        async def go(conn):
            sftp = await self._sftp_client(conn)
            return await sftp.exists(path)

        return self._call(go)

    def put(self, local: Path, remote: str) -> None:
        async def go(conn):
            sftp = await self._sftp_client(conn)
            parent = remote.rsplit("/", 1)[0]
            if parent:
                await sftp.makedirs(parent, exist_ok=True)
            await sftp.put(str(local), remote, recurse=local.is_dir(), preserve=False)

        self._call(go, timeout=None)

    def get(self, remote: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)

        async def go(conn):
            sftp = await self._sftp_client(conn)
            await sftp.get(remote, str(local), recurse=await sftp.isdir(remote))

        self._call(go, timeout=None)

    def walk(self, path: str) -> list[tuple[str, int]]:
        async def go(conn):
            sftp = await self._sftp_client(conn)
            if not await sftp.exists(path):
                raise NotFoundError(f"{path} does not exist on {self.where}", field="job")
            out = []

            async def visit(folder: str, rel: str):
                async for entry in sftp.scandir(folder):
                    if entry.filename in (".", ".."):
                        continue
                    attrs = entry.attrs
                    child = f"{folder}/{entry.filename}"
                    crel = f"{rel}{entry.filename}"
                    if attrs.type == 2:  # FILEXFER_TYPE_DIRECTORY
                        await visit(child, crel + "/")
                    else:
                        out.append((crel, attrs.size or 0))

            await visit(path, "")
            return sorted(out)

        return self._call(go)

    # port forwarding ---------------------------------------------------------------------
    def forward_local_port(self, dest_host: str, dest_port: int,
                           listen_host: str = "127.0.0.1") -> Tunnel:
        """Listen on a free port of this machine and forward each connection through the
        kept SSH connection to ``dest_host:dest_port`` as the login node sees it (``ssh
        -L``).  Why: a compute node is usually reachable from the login node only."""
        async def go(conn):
            await interactive(conn, self.where)  # no Nagle delays on sshd's side
            listener = await conn.forward_local_port(listen_host, 0, dest_host, dest_port)
            return Tunnel(self, conn, listener, listen_host)

        return self._call(go)

    def forward_through(self, host: str, port: int, dest_ports: list[int],
                        timeout: float = 60.0, paths: list[str] | None = None
                        ) -> NodeTunnels:
        """Log in to ``host:port`` (a compute node) *through* the kept connection to the
        login node (``ssh -J``), with the same account, key and known hosts, and forward
        one free local port per ``dest_ports`` entry to ``127.0.0.1:<port>`` as the node
        sees it.  Why: what listens on the node's loopback (a kernel) is reached by its
        own account only, encrypted and authenticated end to end; nothing of it crosses
        the network in the clear.

        With ``paths`` (one per port), each forward listens on that Unix socket instead of
        a local port: on a machine shared by many users (the hub's sidekick) a loopback
        port is open to every account on it, a socket in a private folder only to ours."""
        import asyncssh

        where = f"{self.user + '@' if self.user else ''}{host}:{port}"

        async def go(conn):
            try:
                node = await asyncssh.connect(host, tunnel=conn,
                                              **self._options(port, self._keys()))
            except asyncssh.PermissionDenied as e:
                raise ProviderError(f"the compute node {where} refused the SSH login "
                                    f"({e.reason}) through {self.where}") from None
            except asyncssh.HostKeyNotVerifiable as e:
                raise ProviderError(f"the host key of the compute node {where} is not known "
                                    f"({e.reason}); add it to known_hosts") from None
            except (OSError, asyncssh.Error, TimeoutError) as e:
                raise BackendUnavailable(
                    f"cannot reach the compute node {where} through {self.where}: {e}"
                ) from None
            listeners = []
            try:
                # both sshds on the way forward small writes at once (see interactive)
                await interactive(conn, self.where)
                await interactive(node, where)
                for i, p in enumerate(dest_ports):
                    if paths is not None:
                        listeners.append(await node.forward_local_path_to_port(
                            paths[i], "127.0.0.1", p))
                    else:
                        listeners.append(await node.forward_local_port("127.0.0.1", 0,
                                                                       "127.0.0.1", p))
            except BaseException:
                node.close()
                raise
            return NodeTunnels(self, node, list(paths) if paths is not None
                               else [lst.get_port() for lst in listeners])

        return self._call(go, timeout)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._loop is not None:
                conn = self._conn

                async def go():
                    conn.close()
                    await conn.wait_closed()

                try:
                    self._loop.run(go(), timeout=5)
                except Exception:
                    pass
            self._conn = self._sftp = None
            if self._loop is not None:
                self._loop.stop()
                self._loop = None


class Tunnel:
    """One forwarded local port of an ``SSHShell`` (``forward_local_port``)."""

    def __init__(self, shell: SSHShell, conn: Any, listener: Any, host: str) -> None:
        self.shell, self._conn, self._listener = shell, conn, listener
        self.host = host
        self.port: int = listener.get_port()

    def alive(self) -> bool:
        """Is the SSH connection that carries it still the shell's, and open?"""
        return self.shell._conn is self._conn and not self._conn.is_closed()

    def close(self) -> None:
        listener = self._listener

        async def go():
            listener.close()
            await listener.wait_closed()

        try:
            self.shell._runner().run(go(), timeout=5)
        except Exception:  # the connection is already gone: so is the listener
            pass


class NodeTunnels:
    """Local ports forwarded over one SSH connection to a compute node
    (``SSHShell.forward_through``); closing it closes the connection and its ports."""

    def __init__(self, shell: SSHShell, conn: Any, ports: list[Any]) -> None:
        self.shell, self._conn, self.ports = shell, conn, ports

    def alive(self) -> bool:
        return not self._conn.is_closed()

    def reverse(self, dest_host: str, dest_port: int, timeout: float = 30.0) -> int:
        """A port on the node's loopback forwarded back to ``dest_host:dest_port`` as this
        machine sees it (``ssh -R``), over the same connection: what runs on the node
        reaches a service of ours without any port of ours being open to the network."""
        conn = self._conn

        async def go():
            listener = await conn.forward_remote_port("127.0.0.1", 0, dest_host, dest_port)
            return listener.get_port()

        return self.shell._runner().run(go(), timeout=timeout)

    def close(self) -> None:
        conn = self._conn

        async def go():
            conn.close()
            await conn.wait_closed()

        try:
            self.shell._runner().run(go(), timeout=5)
        except Exception:  # already gone
            pass
