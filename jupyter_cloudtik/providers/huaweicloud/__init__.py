"""Huawei Cloud: a workspace provider (network, identity, storage) and a node provider
(ECS servers), on the official huaweicloudsdk* clients.  See docs/huaweicloud.md."""

from .nodes import HuaweiCloudNodeProvider
from .workspace import HuaweiCloudWorkspaceProvider

__all__ = ["HuaweiCloudNodeProvider", "HuaweiCloudWorkspaceProvider"]
