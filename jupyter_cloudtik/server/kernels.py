"""Kernels reach the API: a kernel provisioner adds the API URL and the kernel token.

jupyter_client's provisioners are the documented place to shape a kernel's launch
(``KernelProvisionerBase.pre_launch`` "applies additional substitutions to the kernel
launch command and env").  ``CloudTikProvisioner`` is the local provisioner plus the
variables ``ServerContext.kernel_env`` (and the hub's egress settings) name, computed at
each start, after the server has bound its port.  The server's own environment is left
alone, so terminals and other subprocesses get nothing.

It is found by the ``jupyter_client.kernel_provisioners`` entry point ``cloudtik``; the
extension makes it the default for kernelspecs that name no provisioner, unless
``c.KernelProvisionerFactory.default_provisioner_name`` (or
``JUPYTER_DEFAULT_PROVISIONER_NAME``) already chooses one.  A kernelspec that names its
own provisioner keeps it (and has no access to the cloudtik API from the kernel).
"""

from __future__ import annotations

import os
from typing import Any

from jupyter_client.provisioning import KernelProvisionerFactory, LocalProvisioner

PROVISIONER_NAME = "cloudtik"
SETTINGS_KEY = "cloudtik"


def _server_context(provisioner: Any) -> Any | None:
    """The ``ServerContext`` of the server that owns this kernel: the provisioner's
    parent is the kernel's manager, whose parents are the server's kernel manager and
    the server itself.  None outside a server with the extension (then nothing is added)."""
    node = getattr(provisioner, "parent", None)
    for _ in range(4):
        if node is None:
            return None
        web_app = getattr(node, "web_app", None)
        if web_app is not None:
            return web_app.settings.get(SETTINGS_KEY)
        node = getattr(node, "parent", None)
    return None


class CloudTikProvisioner(LocalProvisioner):  # type: ignore[misc]
    """A local kernel with ``CLOUDTIK_API_URL`` and its token in its environment."""

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        ctx = _server_context(self)
        extra = ctx.kernel_env() if ctx is not None else {}
        if extra:
            extra.update(await ctx.egress_env())
            env = dict(kwargs.get("env") or os.environ)
            env.update(extra)
            kwargs["env"] = env
        return await super().pre_launch(**kwargs)


def use_cloudtik_provisioner(serverapp: Any) -> None:
    """Make the cloudtik provisioner the default one of this server's kernels, unless
    the user chose a default provisioner in config or in the environment."""
    if os.environ.get(KernelProvisionerFactory.default_provisioner_name_env):
        return
    configured = serverapp.config.get("KernelProvisionerFactory", {})
    if "default_provisioner_name" in configured:
        return
    factory = KernelProvisionerFactory.instance(parent=serverapp.kernel_manager)
    if PROVISIONER_NAME not in factory.provisioners:
        serverapp.log.warning("jupyter_cloudtik: the %r kernel provisioner is not installed "
                              "(reinstall the package); kernels get no API access",
                              PROVISIONER_NAME)
        return
    factory.default_provisioner_name = PROVISIONER_NAME
