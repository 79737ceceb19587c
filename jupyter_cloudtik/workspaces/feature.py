"""Workspaces' faces: ``jupyter cloudtik workspace ...``, their REST routes, their tables."""

from ..core.features import Feature

FEATURE = Feature(
    "workspaces",
    cli=("jupyter_cloudtik.workspaces.cli",),
    routes=("jupyter_cloudtik.workspaces.handlers",),
    migrations=(("workspaces", "jupyter_cloudtik.workspaces.manager:WORKSPACE_MIGRATIONS"),),
)
