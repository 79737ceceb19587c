"""Talking to a cluster's Dask scheduler without becoming a Dask client.

The manager and the reaper only need small facts (which workers are connected, since when
the scheduler is idle) and ask them over the scheduler's HTTP server, which is cheap and
holds no connection.  When a provider gives no HTTP address, a short-lived
``distributed.Client`` answers the same questions.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..core.models import ConnectInfo
from .base import HTTP_TIMEOUT, Runtime, RuntimeUnreachable, http_json
from .tls import client_security


class SchedulerUnreachable(RuntimeUnreachable):
    pass


def _http(url: str, body: dict[str, Any] | None = None, timeout: float = HTTP_TIMEOUT) -> Any:
    return http_json(url, body, timeout, unreachable=SchedulerUnreachable)


def _check_idle(dask_scheduler=None) -> float | None:
    return dask_scheduler.check_idle()


async def _with_client(info: ConnectInfo, fn_name: str, *args: Any) -> Any:
    """Ask over a short-lived Dask connection (mutual TLS when the cluster uses it: its
    HTTP server is then bound to the head's loopback and unreachable from here)."""
    from distributed import Client

    kwargs: dict[str, Any] = {}
    sec = client_security(info)
    if sec is not None:
        kwargs["security"] = sec
    address = (info.extra or {}).get("public_scheduler_address") or info.scheduler_address
    async with Client(address, asynchronous=True, timeout=HTTP_TIMEOUT,
                      **kwargs) as c:
        if fn_name == "workers":
            si = await c.scheduler.identity(n_workers=-1)  # fresh, not the client's cache
            return {str(w.get("name") or a): a for a, w in si.get("workers", {}).items()}
        if fn_name == "idle_since":
            return await c.run_on_scheduler(_check_idle)
        if fn_name == "plugin":
            return await c.register_plugin(args[0])
        if fn_name == "retire":
            return await c.retire_workers(workers=list(args[0]), close_workers=False)
        raise ValueError(fn_name)


async def connected_workers(info: ConnectInfo) -> dict[str, str]:
    """{worker name: address} of the workers connected to the scheduler.

    A node that runs several Dask worker processes (``dask worker --name N --nworkers 2``,
    dask-jobqueue's ``processes``) has workers named ``N-0``, ``N-1``: the node ``N`` is
    listed too, with the address of its first worker."""
    return _with_nodes(await _worker_names(info))


def _with_nodes(workers: dict[str, str]) -> dict[str, str]:
    out = dict(workers)
    for name in sorted(workers):
        base, _, index = name.rpartition("-")
        if base and index.isdigit() and base not in out:
            out[base] = workers[name]
    return out


async def _worker_names(info: ConnectInfo) -> dict[str, str]:
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
    except (OSError, TimeoutError) as e:
        raise SchedulerUnreachable(str(e)) from e


async def idle_since(info: ConnectInfo) -> float | None:
    """Since when the scheduler has had nothing to do (epoch seconds), or None if busy.

    Raises ``LookupError`` when the scheduler does not offer the check.
    """
    if not info.http_address:
        if not info.credentials:
            raise LookupError("no HTTP address")
        try:
            return await _with_client(info, "idle_since")
        except (OSError, TimeoutError) as e:
            raise SchedulerUnreachable(str(e)) from e
    data = await asyncio.to_thread(_http, f"{info.http_address}/api/v1/check_idle")
    return data.get("idle_since")


async def retire_workers(info: ConnectInfo, addresses: list[str], timeout: float = 20) -> None:
    """Ask the scheduler to move data off these workers before they are stopped."""
    if not addresses:
        return
    if not info.http_address:
        if info.credentials:
            try:
                await _with_client(info, "retire", addresses)
            except (OSError, TimeoutError) as e:
                raise SchedulerUnreachable(str(e)) from e
        return
    await asyncio.to_thread(
        _http, f"{info.http_address}/api/v1/retire_workers", {"workers": addresses}, timeout
    )


async def register_worker_plugin(info: ConnectInfo, plugin: Any) -> None:
    """Register a worker plugin with the scheduler (it also reaches later workers)."""
    try:
        await _with_client(info, "plugin", plugin)
    except (OSError, TimeoutError) as e:
        raise SchedulerUnreachable(str(e)) from e


class DaskRuntime(Runtime):
    """Dask: a scheduler on the head, a worker per worker node (named by its node id).

    The node processes themselves are started by the providers (the local provider runs
    ``dask scheduler|worker`` inside its node process; Huawei Cloud's user data runs them);
    this class is how the core asks the scheduler."""

    name = "dask"
    client_method = "client"

    async def connected_workers(self, info: ConnectInfo, prov: Any,
                                node_ids: list[str]) -> dict[str, str]:
        return await connected_workers(info)

    async def retire_workers(self, info: ConnectInfo, addresses: list[str]) -> None:
        await retire_workers(info, addresses)

    async def idle_since(self, info: ConnectInfo) -> float | None:
        return await idle_since(info)

    def client(self, info: ConnectInfo, **kwargs: Any) -> Any:
        from distributed import Client

        return Client(info.scheduler_address, **kwargs)
