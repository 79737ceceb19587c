"""Talking to a cluster's Dask scheduler without becoming a Dask client.

The manager and the reaper only need small facts (which workers are connected, since when
the scheduler is idle) and ask them over the scheduler's HTTP server, which is cheap and
holds no connection.  When a provider gives no HTTP address, a short-lived
``distributed.Client`` answers the same questions.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

from ..providers.base import ConnectInfo

HTTP_TIMEOUT = 3.0


class SchedulerUnreachable(Exception):
    pass


def _http(url: str, body: dict[str, Any] | None = None, timeout: float = HTTP_TIMEOUT) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    if data:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise LookupError(url) from e
        raise SchedulerUnreachable(f"{url}: HTTP {e.code}") from e
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise SchedulerUnreachable(f"{url}: {e}") from e


async def _with_client(info: ConnectInfo, fn_name: str) -> Any:
    from distributed import Client

    async with Client(info.scheduler_address, asynchronous=True, timeout=HTTP_TIMEOUT) as c:
        if fn_name == "workers":
            si = c.scheduler_info(n_workers=-1)
            return {w.get("name") or a: a for a, w in si.get("workers", {}).items()}
        raise ValueError(fn_name)


async def connected_workers(info: ConnectInfo) -> dict[str, str]:
    """{worker name: address} of the workers connected to the scheduler."""
    if info.http_address:
        try:
            data = await asyncio.to_thread(_http, f"{info.http_address}/api/v1/get_workers")
            return {str(w["name"]): w["address"] for w in data.get("workers", [])}
        except LookupError:
            data = await asyncio.to_thread(_http, f"{info.http_address}/json/identity.json")
            return {
                str(w.get("name") or a): a for a, w in (data.get("workers") or {}).items()
            }
    try:
        return await _with_client(info, "workers")
    except OSError as e:
        raise SchedulerUnreachable(str(e)) from e


async def idle_since(info: ConnectInfo) -> float | None:
    """Since when the scheduler has had nothing to do (epoch seconds), or None if busy.

    Raises ``LookupError`` when the scheduler does not offer the check.
    """
    if not info.http_address:
        raise LookupError("no HTTP address")
    data = await asyncio.to_thread(_http, f"{info.http_address}/api/v1/check_idle")
    return data.get("idle_since")


async def retire_workers(info: ConnectInfo, addresses: list[str], timeout: float = 20) -> None:
    """Ask the scheduler to move data off these workers before they are stopped."""
    if not info.http_address or not addresses:
        return
    await asyncio.to_thread(
        _http, f"{info.http_address}/api/v1/retire_workers", {"workers": addresses}, timeout
    )
