"""Which HPC backends of the sidekick run users' work on its own machine.

Why its own module: the sidekick's bootstrap (what it offers at start), its job views and
its kernels (``kernels.py``) all decide on it, and the kernels are started by the
bootstrap: one place, imported by each, no circle.
"""

from __future__ import annotations

from typing import Any


def local_backend_type(ctx: Any, name: str) -> str | None:
    """What HPC backend ``name`` is if it runs users' jobs on this machine or as the
    service's own account here (``local``, ``dask``, a Slurm of this machine: its jobs run
    through Slurm as the account that submits them), else None."""
    from ..hpc.settings import HPC  # deferred: start-up (hpc.settings ~6 ms)

    if name.startswith("dask:"):
        return "dask"
    cfg = HPC(parent=ctx.serverapp).backend_configs().get(name) or {}
    btype = cfg.get("type")
    if btype in ("local", "dask"):
        return btype
    if btype == "slurm" and not cfg.get("host"):
        return "slurm of this machine"
    return None
