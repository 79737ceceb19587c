"""Workspaces' faces: ``jupyter cloudtik workspace ...``, their REST routes, their tables."""

from ..core.features import Feature

FEATURE = Feature(
    "workspaces",
    cli=("jupyter_cloudtik.workspaces.cli",),
    routes=("jupyter_cloudtik.workspaces.handlers",),
    migrations=(("workspaces", "jupyter_cloudtik.workspaces.manager:WORKSPACE_MIGRATIONS"),),
    # what the layers below use without importing workspaces/: the clusters' clients carry
    # workspace calls on the same store and operations, and a cloud provider reads the
    # workspace its nodes go into
    services=(
        ("workspace_manager", "jupyter_cloudtik.workspaces.manager:WorkspaceManager"),
        ("workspace_info", "jupyter_cloudtik.workspaces.manager:WorkspaceInfo"),
        ("workspace_record", "jupyter_cloudtik.workspaces.manager:workspace_record"),
        ("workspaces_of", "jupyter_cloudtik.workspaces.manager:workspaces_of"),
    ),
)
