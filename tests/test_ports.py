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
