"""``python -m jupyter_cloudtik.hub.egress --port 0 --ca-dir DIR``: the proxy process.

Its config (client tokens, rule values: secrets) arrives only as JSON lines on stdin, never
through argv, the environment or a file.  Each line replaces the whole config; each is
acknowledged on stdout (``{"applied": seq, ...}`` or ``{"error": ...}``, the old config then
stays).  The first stdout line is ``{"port": N, "ca_cert": PATH}``.  EOF on stdin ends the
process: it never outlives its supervisor.
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
import sys
from pathlib import Path
from typing import Any

from .ca import DeploymentCA
from .proxy import Limits, ProxyConfig

# the stdout of the process is the pipe of acknowledgements: nothing else may write there
_OUT = sys.stdout

log = logging.getLogger("jupyter_cloudtik.egress")


def _emit(obj: dict) -> None:
    _OUT.write(json.dumps(obj) + "\n")
    _OUT.flush()


def _apply(proxy: Any, line: bytes) -> None:
    seq = None
    try:
        data = json.loads(line)
        if isinstance(data, dict):
            seq = data.get("seq")
        config = ProxyConfig.from_json(data)
    except (ValueError, TypeError) as e:
        # messages are ours (field names, never values); JSON errors give positions only
        msg = str(e) if not isinstance(e, json.JSONDecodeError) else f"invalid JSON: {e.msg}"
        log.warning("config rejected, keeping the previous one: %s", msg)
        _emit({"error": msg, "seq": seq})
        return
    proxy.set_config(config)
    log.info("config applied: %d client(s), %d rule(s) %s, anonymous %s", len(config.clients),
             len(config.rules), [r.id for r in config.rules.rules],
             "allowed" if config.allow_anonymous else "refused")
    _emit({"applied": seq, "clients": len(config.clients), "rules": len(config.rules)})


def _limits(args: argparse.Namespace) -> Limits:
    """The limits of the command line (ValueError naming a bad one)."""
    return Limits(client_connections=args.client_connections,
                  client_requests=args.client_requests,
                  client_lookups=args.client_lookups,
                  client_handshakes=args.client_handshakes,
                  connect_timeout=args.connect_timeout,
                  response_timeout=args.response_timeout,
                  idle_timeout=args.idle_timeout,
                  handshake_timeout=args.handshake_timeout,
                  lookup_timeout=args.lookup_timeout,
                  lookup_threads=args.lookup_threads,
                  min_body_rate=args.min_body_rate,
                  body_grace=args.body_grace,
                  client_loop_share=args.client_loop_share,
                  preauth_connections=args.preauth_connections,
                  client_forget_seconds=args.client_forget_seconds)


async def _main(args: argparse.Namespace) -> int:
    ca = DeploymentCA.load_or_create(Path(args.ca_dir))
    limits = _limits(args)
    # idle sockets are cheap for asyncio; file descriptors are the limit that counts
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY
                                                        else max(soft, 65536), hard))
    # deferred: optional (mitmproxy, installed only in the egress proxy's own environment:
    #   docs/hub-egress.md)
    from .mitm import MitmEgressProxy

    proxy = MitmEgressProxy(ca, host=args.host, port=args.port,
                            upstream_ca_bundle=args.upstream_ca_bundle, limits=limits)
    port = await proxy.start()
    log.info("egress proxy listening on %s:%d", args.host, port)
    _emit({"port": port, "ca_cert": str(ca.cert_path)})

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024, loop=loop)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def read_config() -> None:
        while True:
            line = await reader.readline()
            if not line:
                log.info("stdin closed: exiting")
                return
            if line.strip():
                _apply(proxy, line)

    reading = asyncio.create_task(read_config())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait([reading, stopping], return_when=asyncio.FIRST_COMPLETED)
    for t in (reading, stopping):
        t.cancel()
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
    p.add_argument("--connect-timeout", type=float, default=Limits.connect_timeout)
    p.add_argument("--response-timeout", type=float, default=Limits.response_timeout)
    p.add_argument("--idle-timeout", type=float, default=Limits.idle_timeout)
    p.add_argument("--handshake-timeout", type=float, default=Limits.handshake_timeout,
                   help="seconds a connection may take to authenticate")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    sys.stdout = sys.stderr  # a stray print of a library must not break the pipe protocol
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s egress %(levelname)s %(message)s")
    # mitmproxy's own info lines (client connect/disconnect) are noise; warnings stay
    logging.getLogger("mitmproxy").setLevel(os.environ.get("EGRESS_MITM_LOG", "WARNING"))
    try:
        _limits(args)
    except ValueError as e:
        p.error(str(e))  # one line naming the limit and what is allowed; exit 2
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
