"""What Huawei Cloud's published API allows, in one place (the audit in docs/huaweicloud.md).

Every number here has its source next to it; the provider batches, names and retries by
these, and the emulator (written separately, in cloudtik_emulators/huaweicloud/cloud.py)
refuses what goes beyond them with the cloud's codes.
"""

from __future__ import annotations

import re
import uuid

from ...core.errors import ConfigError

# ECS ----------------------------------------------------------------------------------------
# PostPaidServer.count: "at most 100 when the tenant's quota suffices" (SDK docstring)
CREATE_BATCH = 100
# "A maximum of 1,000 ECSs can be deleted at a time" (ecs_02_0103, Deleting ECSs)
DELETE_BATCH = 1000
# ListServersDetailsRequest.limit: default 25, at most 1000 (SDK docstring)
LIST_PAGE = 1000
# PostPaidServer.server_tags / BatchAddServerTag: at most 10 tags per server
MAX_TAGS = 10
# PostPaidServer.name: 1-64 characters, 1-59 when count > 1 (the cloud appends -0001...)
NAME_MAX_BATCH = 59
_NAME_BAD = re.compile(r"[^A-Za-z0-9_\-.]")
# BatchAddServerTag: key 1-36 of A-Z a-z 0-9 - _; value 0-43 of the same and '.'
TAG_KEY = re.compile(r"^[A-Za-z0-9_\-]{1,36}$")
TAG_VALUE = re.compile(r"^[A-Za-z0-9_\-.]{0,43}$")

# error codes (ECS API reference, Error Codes: support.huaweicloud.com/api-ecs/ecs_07_0002.html)
ECS_QUOTA = "Ecs.0001"        # 400 "Insufficient ECS quota"
ECS_CAPACITY = "Ecs.0319"     # the flavor's capacity is insufficient (sold out)
ECS_TOKEN_FORMAT = "Ecs.0123"  # X-Client-Token is not a UUID
ECS_TOKEN_REUSED = "Ecs.0122"  # the same token with other parameters
ECS_TOKEN_EXPIRED = "Ecs.0124"  # a token older than 8 hours

# TMS (Tag Management Service) -------------------------------------------------------------
# BatchCreateResourceTags / BatchDeleteResourceTags: resources per call (see docs table)
TMS_BATCH = 50

# VPC ----------------------------------------------------------------------------------------
# CreateSubnetOption.primary_dns/secondary_dns/dnsList: "empty when not given, and then the
# subnet cannot use the cloud's private DNS" (SDK docstring).  The private DNS servers of
# each region: https://support.huaweicloud.com/intl/en-us/dns_faq/dns_faq_002.html
REGION_DNS: dict[str, list[str]] = {
    "cn-north-1": ["100.125.1.250", "100.125.21.250"],
    "cn-north-4": ["100.125.1.250", "100.125.129.250"],
    "cn-north-9": ["100.125.1.250", "100.125.107.250"],
    "cn-east-3": ["100.125.1.250", "100.125.64.250"],
    "cn-south-1": ["100.125.1.250", "100.125.136.29"],
    "cn-southwest-2": ["100.125.1.250", "100.125.129.250"],
}


def client_token() -> str:
    """An X-Client-Token: the 8-4-4-4-12 lower-case UUID form ECS requires (Ecs.0123 else)."""
    return str(uuid.uuid4())


def server_name(cluster: str, role: str) -> str:
    """A server name ECS accepts for a batch: allowed characters only, at most 59."""
    name = _NAME_BAD.sub("-", f"cloudtik-{cluster}-{role}")
    return name[:NAME_MAX_BATCH].rstrip("-.") or "cloudtik"


def dns_servers(region: str, configured: list[str] | None) -> list[str]:
    """The name servers a workspace subnet gets: the configured ones, else the region's."""
    if configured:
        return list(configured)
    if region in REGION_DNS:
        return list(REGION_DNS[region])
    raise ConfigError(
        f"provider.dns_servers: missing; jupyter_cloudtik does not know the private DNS "
        f"servers of region '{region}' and a subnet without them has no name resolution. "
        "Give them (see https://support.huaweicloud.com/intl/en-us/dns_faq/dns_faq_002.html), "
        "e.g. dns_servers: [100.125.1.250, ...]", field="provider.dns_servers")


def batches(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]
