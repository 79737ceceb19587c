"""The hub's egress limits (``c.CloudTikHub.egress_*``) reach the proxy: the flags
``bootstrap.egress_limit_args`` makes from a traitlets config start a real proxy process
under its supervisor, and real connections meet the configured values (not the defaults:
1024 pre-auth connections per peer, 256 connections per client, 60 s before an idle client
is forgotten).  A bad value is one line naming the setting."""

from __future__ import annotations

import asyncio
import base64
import socket
import time
import uuid
from pathlib import Path

import pytest
from traitlets.config import Config

from cloudtik_emulators.upstreams import serve
from jupyter_cloudtik.core.errors import ConfigError
from jupyter_cloudtik.hub import bootstrap
from jupyter_cloudtik.hub.egress import EgressSupervisor
from jupyter_cloudtik.hub.settings import CloudTikHub

TOKEN = f"tok-{uuid.uuid4().hex}"


def _hub(**values) -> CloudTikHub:
    return CloudTikHub(config=Config({"CloudTikHub": values}))


def _closed_by_peer(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def _wait_log(log: Path, start: int, text: str, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while True:
        with log.open("rb") as f:
            f.seek(start)
            got = f.read().decode(errors="replace")
        if text in got or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_configured_limits_take_effect_in_the_proxy(tmp_path):
    hub = _hub(egress_preauth_connections=3, egress_client_connections=2,
               egress_client_forget_seconds=1.0)
    args = bootstrap.egress_limit_args(hub)
    assert args[args.index("--preauth-connections") + 1] == "3"
    upstream, _ = serve(None)
    loop = asyncio.new_event_loop()
    sup = EgressSupervisor(tmp_path / "state", no_proxy="", deny_networks=[],
                           extra_args=args)
    loop.run_until_complete(sup.start())
    socks: list[socket.socket] = []
    try:
        loop.run_until_complete(sup.update([{"user": "alice", "token": TOKEN}], []))
        log = Path(sup.log_path)
        start = log.stat().st_size
        # 5 connections that never authenticate, from one address: over 3, the oldest go
        for _ in range(5):
            socks.append(socket.create_connection(("127.0.0.1", sup.port), timeout=10))
            time.sleep(0.1)
        closed = [_closed_by_peer(s, 3.0) for s in socks[:2]]
        still_open = [not _closed_by_peer(s, 0.3) for s in socks[2:]]
        assert closed == [True, True] and still_open == [True, True, True], \
            (closed, still_open)
        assert "(limit preauth_connections)" in _wait_log(
            log, start, "(limit preauth_connections)", 5)
        for s in socks:
            s.close()
        socks.clear()

        # 3 authenticated keep-alive connections of one user: the third is over 2
        auth = base64.b64encode(f"alice:{TOKEN}".encode()).decode()
        port = upstream.server_address[1]
        heads = []
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", sup.port), timeout=15)
            socks.append(s)
            s.sendall(f"GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                      f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode())
            heads.append(s.recv(4096).split(b"\r\n", 1)[0])
        assert heads[:2] == [b"HTTP/1.1 200 OK"] * 2, heads
        assert heads[2].startswith(b"HTTP/1.1 429"), heads
        for s in socks:
            s.close()
        socks.clear()

        # alice holds nothing now: forgotten after 1 s (the default is 60)
        got = _wait_log(log, start, "idle client(s)", 10)
        assert "forgot " in got and "idle client(s)" in got, got[-2000:]
        assert TOKEN not in log.read_text()
    finally:
        for s in socks:
            s.close()
        loop.run_until_complete(sup.stop())
        loop.close()
        upstream.shutdown()
        upstream.server_close()


@pytest.mark.parametrize(("name", "value", "allowed"), [
    ("egress_preauth_connections", 0, "an integer >= 1"),
    ("egress_client_forget_seconds", 0.0, "seconds > 0"),
    ("egress_client_loop_share", 1.5, "a share in (0, 1]"),
    ("egress_lookup_threads", -1, "an integer >= 1"),
])
def test_a_bad_limit_is_one_line_naming_the_setting(name, value, allowed):
    with pytest.raises(ConfigError) as e:
        bootstrap.egress_limit_args(_hub(**{name: value}))
    msg = e.value.message
    assert msg.startswith(f"c.CloudTikHub.{name} is {value!r}"), msg
    assert allowed in msg and "\n" not in msg
    assert e.value.field == name


def test_every_limit_has_a_setting_and_a_flag():
    """The hub passes every per-client limit the proxy has a flag for, with its default."""
    from jupyter_cloudtik.hub.egress.proxy import Limits

    args = bootstrap.egress_limit_args(_hub())
    for name in bootstrap.EGRESS_LIMITS:
        flag = f"--{name.replace('_', '-')}"
        assert float(args[args.index(flag) + 1]) == float(getattr(Limits, name)), name
