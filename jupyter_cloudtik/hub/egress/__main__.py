"""``python -m jupyter_cloudtik.hub.egress --port 0 --ca-dir DIR``: the proxy process.

Its config (client tokens, rule values: secrets) arrives only as JSON lines on stdin, never
through argv, the environment or a file.  Each line replaces the whole config; each is
acknowledged on stdout (``{"applied": seq, ...}`` or ``{"error": ...}``, the old config then
stays) once every worker has applied it.  The first stdout line is
``{"port": N, "ca_cert": PATH}``.  EOF on stdin ends the process: it never outlives its
supervisor, and its workers (``--worker``, started by it: ``workers.py``) never outlive it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import resource
import signal
import socket
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from .ca import DeploymentCA
from .front import Front
from .proxy import Limits, ProxyConfig
from .workers import WorkerPool

# the stdout of the process is the pipe of acknowledgements: nothing else may write there
_OUT = sys.stdout

log = logging.getLogger("jupyter_cloudtik.egress")


def _emit(obj: dict) -> None:
    _OUT.write(json.dumps(obj) + "\n")
    _OUT.flush()


def _parse(line: bytes) -> tuple[Any, dict | None, ProxyConfig | None]:
    """(seq, the line's object, its config), or the error already answered (config None)."""
    seq = None
    try:
        data = json.loads(line)
        if isinstance(data, dict):
            seq = data.get("seq")
        return seq, data, ProxyConfig.from_json(data)
    except (ValueError, TypeError) as e:
        # messages are ours (field names, never values); JSON errors give positions only
        msg = str(e) if not isinstance(e, json.JSONDecodeError) else f"invalid JSON: {e.msg}"
        log.warning("config rejected, keeping the previous one: %s", msg)
        _emit({"error": msg, "seq": seq})
        return seq, None, None


def _applied(seq: Any, config: ProxyConfig, level: int = logging.INFO) -> None:
    log.log(level, "config applied: %d client(s), %d rule(s) %s, anonymous %s",
            len(config.clients), len(config.rules), [r.id for r in config.rules.rules],
            "allowed" if config.allow_anonymous else "refused")
    _emit({"applied": seq, "clients": len(config.clients), "rules": len(config.rules)})


def _apply(proxy: Any, line: bytes) -> None:
    """A worker's config line (from the front)."""
    seq, _data, config = _parse(line)
    if config is not None:
        proxy.set_config(config)
        _applied(seq, config, logging.DEBUG)


# the limits the command line sets (each a --flag of the same name)
_LIMIT_FLAGS = ("client_connections", "client_requests", "client_lookups", "client_handshakes",
                "connect_timeout", "response_timeout", "idle_timeout", "handshake_timeout",
                "lookup_timeout", "lookup_threads", "min_body_rate", "body_grace",
                "client_loop_share", "preauth_connections", "client_forget_seconds",
                "workers")


def _limits(args: argparse.Namespace) -> Limits:
    """The limits of the command line (ValueError naming a bad one)."""
    return Limits(**{name: getattr(args, name) for name in _LIMIT_FLAGS})


def _raise_nofile() -> None:
    # idle sockets are cheap for asyncio; file descriptors are the limit that counts
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY
                                                        else max(soft, 65536), hard))


async def _stdin_lines() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024, loop=loop)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def _until_stopped(reading: Awaitable[None]) -> None:
    """Run ``reading`` (the config lines) until stdin ends or a signal comes."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.ensure_future(reading), asyncio.create_task(stop.wait())]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for t in tasks:
        t.cancel()


def _worker_args(args: argparse.Namespace) -> list[str]:
    """The flags a worker gets: the front's, but where it listens."""
    out = ["--ca-dir", args.ca_dir, "--log-level", args.log_level]
    if args.upstream_ca_bundle:
        out += ["--upstream-ca-bundle", args.upstream_ca_bundle]
    for name in _LIMIT_FLAGS:
        out += [f"--{name.replace('_', '-')}", repr(getattr(args, name))]
    return out


async def _main(args: argparse.Namespace) -> int:
    """The front: listens, places each connection with a worker, passes configs on."""
    ca = DeploymentCA.load_or_create(Path(args.ca_dir))
    limits = _limits(args)
    _raise_nofile()
    pool = WorkerPool(_worker_args(args), limits)
    front = Front(pool, limits, host=args.host, port=args.port)
    try:
        await pool.start()
        port = await front.start()
    except BaseException:
        await pool.stop()
        raise
    log.info("egress proxy listening on %s:%d", args.host, port)
    _emit({"port": port, "ca_cert": str(ca.cert_path)})
    reader = await _stdin_lines()

    async def read_config() -> None:
        while True:
            line = await reader.readline()
            if not line:
                log.info("stdin closed: exiting")
                return
            if not line.strip():
                continue
            seq, data, config = _parse(line)
            if config is None:
                continue
            assert isinstance(data, dict)
            # every worker has it before it counts as applied (a revoked token stops now)
            await pool.set_config(data, {c.user for c in config.clients})
            front.set_config(config)
            _applied(seq, config)

    try:
        await _until_stopped(read_config())
    finally:
        await front.stop()
        await pool.stop()
    return 0


async def _worker_main(args: argparse.Namespace) -> int:
    """A worker: mitmproxy with our add-on, serving the connections the front hands it."""
    ca = DeploymentCA.load_or_create(Path(args.ca_dir))
    limits = _limits(args)
    _raise_nofile()
    # deferred: optional (mitmproxy, installed only in the egress proxy's own environment:
    #   docs/hub-egress.md)
    from .mitm import MitmEgressProxy

    proxy = MitmEgressProxy(ca, upstream_ca_bundle=args.upstream_ca_bundle, limits=limits,
                            listen=False)
    await proxy.start()
    loop = asyncio.get_running_loop()
    channel = socket.socket(fileno=args.channel_fd)
    channel.setblocking(False)
    front_gone = asyncio.Event()
    serving: set[asyncio.Task] = set()
    received = 0
    idle_since: float | None = None

    def intake() -> None:
        nonlocal received, idle_since
        while True:
            try:
                head, fds, flags, _ = socket.recv_fds(channel, 1 << 18, 1)
            except BlockingIOError:
                return
            except OSError:
                head, fds, flags = b"", [], 0
            if not head and not fds:
                loop.remove_reader(channel.fileno())
                front_gone.set()
                return
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                continue
            sock = socket.socket(fileno=fds[0])
            sock.setblocking(False)
            received += 1
            idle_since = None
            task = loop.create_task(proxy.adopt(sock, head))
            serving.add(task)
            task.add_done_callback(serving.discard)

    loop.add_reader(channel.fileno(), intake)
    _emit({"worker": "ready"})

    async def report_idle() -> None:
        nonlocal idle_since
        reported = 0
        while True:
            await asyncio.sleep(min(1.0, limits.client_forget_seconds / 2))
            if received == 0 or proxy.open_connections > 0 or serving:
                idle_since = None
                continue
            now = loop.time()
            if idle_since is None:
                idle_since = now
            elif now - idle_since >= limits.client_forget_seconds and reported != received:
                reported = received
                _emit({"idle": received})

    reader = await _stdin_lines()

    async def read_config() -> None:
        while True:
            line = await reader.readline()
            if not line:
                return
            if line.strip():
                _apply(proxy, line)

    idle = loop.create_task(report_idle())
    try:
        await _until_stopped(asyncio.wait([loop.create_task(read_config()),
                                           loop.create_task(front_gone.wait())],
                                          return_when=asyncio.FIRST_COMPLETED))
    finally:
        idle.cancel()
        await proxy.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jupyter_cloudtik.hub.egress",
                                description="Egress proxy of the sidekick; config on stdin.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ca-dir", required=True, help="folder of the deployment CA")
    p.add_argument("--upstream-ca-bundle", default=None,
                   help="CA file to verify intercepted upstreams (default: system trust)")
    p.add_argument("--client-connections", type=int, default=Limits.client_connections,
                   help="open connections per client")
    p.add_argument("--client-requests", type=int, default=Limits.client_requests,
                   help="requests served at once per client (more wait their turn)")
    p.add_argument("--client-lookups", type=int, default=Limits.client_lookups,
                   help="name look-ups at once per client (more wait their turn)")
    p.add_argument("--client-handshakes", type=int, default=Limits.client_handshakes,
                   help="TLS set-ups at once per client (more wait their turn)")
    p.add_argument("--lookup-timeout", type=float, default=Limits.lookup_timeout,
                   help="seconds for one name look-up, its wait for a slot included (504)")
    p.add_argument("--lookup-threads", type=int, default=Limits.lookup_threads,
                   help="resolver threads shared by all clients")
    p.add_argument("--min-body-rate", type=float, default=Limits.min_body_rate,
                   help="bytes/s a request body must average after --body-grace seconds")
    p.add_argument("--body-grace", type=float, default=Limits.body_grace)
    p.add_argument("--client-loop-share", type=float, default=Limits.client_loop_share,
                   help="share of the proxy's loop one client may take while others wait")
    p.add_argument("--preauth-connections", type=int, default=Limits.preauth_connections,
                   help="connections of one peer address not authenticated yet (over it, "
                        "its oldest is closed)")
    p.add_argument("--client-forget-seconds", type=float,
                   default=Limits.client_forget_seconds,
                   help="a client with no connection, idle this long, is forgotten")
    p.add_argument("--workers", type=int, default=Limits.workers,
                   help="processes serving one user each (then users share them)")
    p.add_argument("--connect-timeout", type=float, default=Limits.connect_timeout)
    p.add_argument("--response-timeout", type=float, default=Limits.response_timeout)
    p.add_argument("--idle-timeout", type=float, default=Limits.idle_timeout)
    p.add_argument("--handshake-timeout", type=float, default=Limits.handshake_timeout,
                   help="seconds a connection may take to authenticate")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--channel-fd", type=int, default=-1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sys.stdout = sys.stderr  # a stray print of a library must not break the pipe protocol
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s egress" + ("-worker[%(process)d]" if args.worker
                                                        else "")
                        + " %(levelname)s %(message)s")
    # mitmproxy's own info lines (client connect/disconnect) are noise; warnings stay
    logging.getLogger("mitmproxy").setLevel(os.environ.get("EGRESS_MITM_LOG", "WARNING"))
    try:
        _limits(args)
    except ValueError as e:
        p.error(str(e))  # one line naming the limit and what is allowed; exit 2
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_worker_main(args) if args.worker else _main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
