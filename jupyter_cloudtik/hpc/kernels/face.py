"""What the REST routes may do with HPC kernels, behind ``ctx.feature("hpc-kernels")``.

Why a face: the routes must not reach the server's kernel settings themselves.  On a
Jupyter server the face is ``KernelsFace`` over that server (its kernels, its backends,
its profiles); the hub's sidekick decides its own (``hub/context.py``: kernels run in
each user's own server, never with the sidekick's backends and credentials), so a route
cannot reach a backend the caller holds no grant for by asking about kernels.
"""

from __future__ import annotations

from typing import Any

from .provisioner import kernel_status, size_check
from .specs import remember_custom


class KernelsFace:
    """This Jupyter server's HPC kernels."""

    def __init__(self, serverapp: Any) -> None:
        self.serverapp = serverapp

    def status(self) -> dict[str, dict[str, Any]]:
        """kernel id -> what its job does (``kernel_status``); no backend call."""
        return kernel_status(self.serverapp)

    def size(self, backend: str | None, profile: str, size: dict[str, Any]) -> dict[str, str]:
        """A custom size checked as a start checks it; the spec to start, listed from now
        on by the server's kernel picker."""
        sized = size_check(self.serverapp, backend, profile, size)
        remember_custom(self.serverapp, sized.spec_name)
        return {"name": sized.spec_name, "display_name": sized.title()}
