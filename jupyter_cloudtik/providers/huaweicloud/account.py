"""Shared plumbing of the workspace and node providers: clients, names, paging, waiting."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ...core.errors import OperationTimeout
from .clients import Clients
from .credentials import HuaweiCloud, resolve
from .retry import RetryPolicy

if TYPE_CHECKING:
    from ...core.operations import OperationContext
    from ..base import ProviderContext

PAGE = 100


def settings_for(context: ProviderContext) -> HuaweiCloud:
    return HuaweiCloud(parent=context.settings)


def policy_for(provider_config: dict[str, Any], settings: HuaweiCloud) -> RetryPolicy:
    r = provider_config.get("retry") or {}
    return RetryPolicy(attempts=int(r.get("attempts", settings.retry_attempts)),
                       base_delay=float(r.get("base_delay", settings.retry_base_delay)),
                       budget=float(r.get("budget", settings.retry_budget)))


def make_clients(provider_config: dict[str, Any], context: ProviderContext,
                 workspace: str | None,
                 on_retry: Callable[[str, int, float, str], None] | None = None) -> Clients:
    # deferred: start-up (core.secrets ~9 ms, loads cryptography, sqlite3)
    from ...core.secrets import SecretStore

    settings = settings_for(context)
    creds = resolve(provider_config, settings, SecretStore(context.store), workspace)
    return Clients(provider_config, creds, policy=policy_for(provider_config, settings),
                   on_retry=on_retry)


def retry_reporter(ctx: OperationContext | None, log) -> Callable[[str, int, float, str], None]:
    """Tell the operation (or the log) that a call is being retried, and why."""
    def report(what: str, attempt: int, delay: float, why: str) -> None:
        msg = f"{what}: {why}; retrying in {delay:.1f}s (attempt {attempt + 1})"
        if ctx is not None:
            ctx.progress("retry", msg, level="warning")
        else:
            log.info("huaweicloud: %s", msg)
    return report


def names(workspace: str) -> dict[str, str]:
    """Names of a workspace's resources: how they are found again (idempotency)."""
    p = f"cloudtik-{workspace}"
    return {"vpc": f"{p}-vpc", "public_subnet": f"{p}-public", "private_subnet": f"{p}-private",
            "security_group": f"{p}-sg", "nat": f"{p}-nat", "nat_eip": f"{p}-nat-eip",
            "bandwidth": f"{p}-bandwidth", "peering": f"{p}-peering",
            "head_agency": f"{p}-head", "worker_agency": f"{p}-worker", "keypair": f"{p}-key",
            "obs_policy": f"{p}-obs"}


def bucket_name(workspace: str, domain_id: str) -> str:
    # bucket names are global across all accounts: the account id makes ours unique
    return f"cloudtik-{workspace}-{domain_id[:8].lower()}"


def paged_marker(fetch: Callable[[str | None, int], list[Any]],
                 key: Callable[[Any], str] = lambda x: x.id) -> Iterator[Any]:
    """Every item of a marker-paginated list (VPC, EIP, NAT, KPS, IMS)."""
    marker = None
    while True:
        page = fetch(marker, PAGE) or []
        yield from page
        if len(page) < PAGE:
            return
        marker = key(page[-1])


def wait_until(check: Callable[[], Any], *, what: str, timeout: float,
               checkpoint: Callable[[], None] | None = None, first: float = 0.2,
               most: float = 5.0) -> Any:
    """Poll ``check`` (growing intervals) until it returns something true."""
    deadline = time.monotonic() + timeout
    delay = first
    while True:
        if checkpoint is not None:
            checkpoint()
        got = check()
        if got:
            return got
        if time.monotonic() + delay > deadline:
            raise OperationTimeout(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(delay)
        delay = min(delay * 1.5, most)
