"""Helpers shared by the Huawei Cloud tests."""

from __future__ import annotations

import json
import socket
import ssl


def workspace_config(hwc, **extra):
    prov = {"type": "huaweicloud", "region": hwc.info["region"],
            "endpoint": hwc.info["endpoint"], "allowed_ssh_sources": ["127.0.0.1/32"],
            "retry": {"base_delay": 0.01, "attempts": 6, "budget": 5}}
    prov.update(extra)
    return {"provider": prov}


def cluster_config(name: str, workspace: str, workers: int = 1, **provider):
    return {"cluster_name": name,
            "provider": {"type": "huaweicloud", "workspace_name": workspace,
                         "retry": {"base_delay": 0.01, "attempts": 6, "budget": 5}, **provider},
            "available_node_types": {
                "head": {"node_config": {"flavor": "s6.medium.2"}},
                "worker": {"node_config": {"flavor": "s6.medium.2"}, "min_workers": workers,
                           "max_workers": max(10, workers)}},
            "head_node_type": "head"}


def leftovers(hwc, workspace: str) -> dict[str, list[str]]:
    """What the emulator still holds of this workspace (by name) and of its clusters."""
    state = hwc.ctl.state()
    left = hwc.ctl.leftovers(state, prefix=f"cloudtik-{workspace}")
    servers = [s["id"] for s in state["servers"]
               if s["tags"].get("cloudtik-workspace") == workspace]
    if servers:
        left["servers"] = servers
    eips = [e["address"] for e in state["publicips"] if e["server_id"] in servers]
    if eips:
        left["server_eips"] = eips
    return left


def relay_get(host: str, port: int, ctx: ssl.SSLContext, path: str = "/status") -> bytes:
    """One HTTP/1.0 GET straight to a head's mutual-TLS relay over ``ctx`` (the raw
    answer; b"" when the relay closed the connection after the handshake)."""
    with socket.create_connection((host, port), timeout=5) as raw, \
            ctx.wrap_socket(raw) as s:
        s.settimeout(10)
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n".encode())
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def created_sg_rules(hwc, since: int) -> list[dict]:
    """The security-group rules the emulator created after request ``since``."""
    return [json.loads(r["body"])["security_group_rule"]
            for r in hwc.ctl.requests(since)
            if r["action"] == "vpc.create_security_group_rule" and r["status"] < 300]
