"""Ports for the servers we start: never from the range outgoing connections draw from."""

from __future__ import annotations

import socket

import pytest

from jupyter_cloudtik.core import ports


def test_a_free_port_is_below_the_ephemeral_range_and_bindable():
    lo, _hi = ports._ephemeral()
    for _ in range(50):
        port = ports.free_port()
        assert port < lo
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_preferred_port_is_kept_while_free_and_replaced_when_taken():
    port = ports.free_port()
    assert ports.free_port(prefer=port) == port
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        assert ports.free_port(prefer=port) != port


def test_a_start_that_lost_its_port_runs_again_on_another():
    tried: list[int] = []

    def start(port: int) -> int:
        tried.append(port)
        if len(tried) < 3:
            raise ports.PortInUse(port)
        return port

    assert ports.start_with_free_port(start) == tried[-1]
    assert len(tried) == 3

    def never(port: int) -> int:
        tried.append(port)
        raise ports.PortInUse(port)

    tried.clear()
    with pytest.raises(ports.PortInUse):
        ports.start_with_free_port(never, attempts=2)
    assert len(tried) == 2


def test_no_code_picks_a_port_by_binding_port_0_and_letting_it_go():
    """The class, not the case: a port taken from the kernel with bind(0) and closed
    before a child binds it is a race with every outgoing connection (two clean-clone CI
    runs lost a server and a relay so).  Only core/ports.py may do it (its fallback)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    picked = re.compile(
        r"(\w+)\.bind\(\([^()]*,\s*0\)\)\s*\n\s*(?:return\s+\1|[\w ,]+=\s*\1)"
        r"\.getsockname\(\)\[1\]")
    found = []
    for folder in ("jupyter_cloudtik", "emulators", "tests", "benchmarks", "scripts", "fuzz"):
        for path in (root / folder).rglob("*.py"):
            if path.match("core/ports.py") or ".venv" in path.parts:
                continue
            text = path.read_text(errors="replace")
            for m in picked.finditer(text):
                # a socket kept open (it listens, or is held) is no race: look for a close
                # or the end of its with-block right after
                after = text[m.end():m.end() + 200]
                held = f"{m.group(1)}.listen(" in text[m.start() - 200:m.end() + 200]
                if not held and (f"{m.group(1)}.close()" in "\n".join(after.split("\n")[:3]) or
                                 f"with socket.socket() as {m.group(1)}" in
                                 text[max(0, m.start() - 120):m.start()]):
                    found.append(f"{path.relative_to(root)}:{text[:m.start()].count(chr(10)) + 1}")
    assert not found, f"use jupyter_cloudtik.core.ports.free_port() instead: {found}"
