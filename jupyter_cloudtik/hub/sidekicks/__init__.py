"""Side-kick services of the hub, one of its three products (beside the sidekick API in
``hub/`` and the egress proxy in ``hub/egress/``): specs (what an admin allows) and the
supervisor (the processes).  Import from here; the two modules behind it are
implementation detail.

See ``docs/hub-sidekicks.md`` for the spec format, the life cycle and the job gateway.
"""

from __future__ import annotations

from .specs import (
    RESERVED_ENV,
    SecretRef,
    SidekickCatalog,
    SidekickSpec,
    load_specs,
)
from .supervisor import (
    ACTIVE,
    DEFAULT_PROXY_BASE,
    FAILED,
    RESTARTING,
    RUNNING,
    STARTING,
    STATES,
    STOPPED,
    TOKEN_HEADER,
    HealthResult,
    SidekickError,
    SidekickInfo,
    SidekickSupervisor,
    sidekick_prefix,
)

__all__ = ["ACTIVE", "DEFAULT_PROXY_BASE", "FAILED", "RESERVED_ENV", "RESTARTING", "RUNNING",
           "STARTING", "STATES", "STOPPED", "TOKEN_HEADER", "HealthResult", "SecretRef",
           "SidekickCatalog", "SidekickError", "SidekickInfo", "SidekickSpec",
           "SidekickSupervisor", "load_specs", "sidekick_prefix"]
