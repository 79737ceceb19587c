"""ECS servers as the node provider sees them: found by their tags, their addresses.

Moved out of nodes.py unchanged (a pure move: nodes.py re-exports these names)."""

from __future__ import annotations

from typing import Any

from .limits import LIST_PAGE

TAG_WORKSPACE = "cloudtik-workspace"
GONE = {"DELETED", "SOFT_DELETED"}
ALIVE = {"ACTIVE", "BUILD", "REBOOT", "HARD_REBOOT", "RESIZE", "VERIFY_RESIZE", "MIGRATING"}


def tags_of(server) -> dict[str, str]:
    out = {}
    for t in server.tags or []:
        k, _, v = t.partition("=")
        out[k] = v
    return out


def list_servers(clients, tags: dict[str, str]) -> list[Any]:
    """Every server (not deleted) carrying exactly all ``tags``, page by page.

    The cloud is asked with one tag (its ``tags`` filter takes one value and matches
    servers whose tags *contain* it); which servers really carry every tag is decided here,
    so a cluster's boundary never rests on the cloud's filter semantics."""
    from huaweicloudsdkecs.v2 import ListServersDetailsRequest

    first = sorted(tags.items())[0] if tags else None
    out: list[Any] = []
    page = 1
    while True:
        resp = clients.call("ecs", "list_servers_details", ListServersDetailsRequest(
            tags=f"{first[0]}={first[1]}" if first else None, limit=LIST_PAGE, offset=page))
        servers = resp.servers or []
        out.extend(servers)
        if not servers or len(out) >= (resp.count or 0) or len(servers) < LIST_PAGE:
            break
        page += 1
    return [s for s in out if s.status not in GONE and _carries(s, tags)]


def _carries(server, tags: dict[str, str]) -> bool:
    have = tags_of(server)
    return all(k in have and have[k] == v for k, v in tags.items())


def addresses(server) -> tuple[str | None, str | None]:
    private = public = None
    for addrs in (server.addresses or {}).values():
        for a in addrs:
            if a.os_ext_ip_stype == "floating":
                public = public or a.addr
            else:
                private = private or a.addr
    return private, public


#: the server metadata key naming the runtimes a head runs (``dask,spark``)
RUNTIMES_METADATA = "cloudtik_runtimes"
