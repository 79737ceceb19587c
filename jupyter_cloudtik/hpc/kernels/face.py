"""What the REST routes may do with HPC kernels, behind ``ctx.feature("hpc-kernels")``.

Why a face: the routes must not reach the server's kernel settings themselves.  On a
Jupyter server the face is ``KernelsFace`` over that server (its kernels, its backends,
its profiles); the hub's sidekick decides its own (``hub/context.py``: kernels run in
each user's own server, never with the sidekick's backends and credentials), so a route
cannot reach a backend the caller holds no grant for by asking about kernels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .provisioner import kernel_status, size_check
from .specs import remember_custom
from .through_hub import hub_size_check


class KernelsFace:
    """This Jupyter server's HPC kernels."""

    def __init__(self, serverapp: Any) -> None:
        self.serverapp = serverapp

    def status(self) -> dict[str, dict[str, Any]]:
        """kernel id -> what its job does (``kernel_status``); no backend call.  With
        ``notebook``: the notebook it was started for as a path under the server's root
        (the panel opens it), when it is under the root."""
        out = kernel_status(self.serverapp)
        for k in out.values():
            k["notebook"] = self._under_root(k.get("session"))
        return out

    def _under_root(self, session: Any) -> str | None:
        """``session`` (jupyter_server's JPY_SESSION_NAME: root folder + the notebook's
        path) as a path under the root, or None (elsewhere, or not a path)."""
        if not isinstance(session, str) or not session:
            return None
        try:
            root = Path(self.serverapp.root_dir).resolve()
            rel = Path(session).resolve().relative_to(root)
        except (ValueError, OSError, AttributeError, TypeError):
            return None
        return rel.as_posix() if rel.parts else None

    def size(self, backend: str | None, profile: str, size: dict[str, Any],
             hub: bool = False) -> dict[str, str]:
        """A custom size checked as a start checks it; the spec to start, listed from now
        on by the server's kernel picker.  A profile of the hub's: its sidekick checks."""
        sized = (hub_size_check(self.serverapp, profile, size) if hub
                 else size_check(self.serverapp, backend, profile, size))
        remember_custom(self.serverapp, sized.spec_name)
        return {"name": sized.spec_name, "display_name": sized.title()}
