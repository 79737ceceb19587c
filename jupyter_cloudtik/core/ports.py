"""A free TCP port for a process we start next, picked where nothing else will take it.

Asking the kernel for port 0 answers a port from the *ephemeral* range — the same range every
outgoing connection on the machine draws its local port from.  Between our ``close()`` and the
child's ``bind()`` any client connection may take it (a clean-clone CI run lost a Jupyter
server that way: "port 53127 is not available").  Ports below the ephemeral range are never
handed to outgoing connections, so a port picked there stays free unless another starter picks
the same one; the random pick over ~20,000 ports makes that rare, and callers that start a
server still retry on "address in use" (``start_with_free_port``).
"""

from __future__ import annotations

import errno
import random
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000  # below: well-known services and many sites' fixed ports

T = TypeVar("T")


class PortInUse(Exception):
    """The started process could not bind the port it was given (raised by the caller)."""


def _ephemeral() -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in _RANGE_FILE.read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                       socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port(host: str = "127.0.0.1", prefer: int | None = None) -> int:
    """A port on *host* that nothing listens on, outside the ephemeral range when possible.

    *prefer* is taken when it is still free (a restarted service keeps its address).
    """
    if prefer and _bindable(host, prefer):
        return prefer
    lo, _hi = _ephemeral()
    if lo - _LOWEST >= 1000:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(_LOWEST, lo)
            if _bindable(host, port):
                return port
    with socket.socket() as s:  # a machine whose ephemeral range starts low
        s.bind((host, 0))
        return s.getsockname()[1]


def start_with_free_port(start: Callable[[int], T], host: str = "127.0.0.1",
                         attempts: int = 3) -> T:
    """``start(port)`` on a free port, again on another when it raises ``PortInUse``."""
    last: PortInUse | None = None
    for _ in range(attempts):
        try:
            return start(free_port(host))
        except PortInUse as e:
            last = e
    assert last is not None
    raise last
