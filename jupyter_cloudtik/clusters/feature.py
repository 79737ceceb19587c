"""The clusters feature as the faces find it (``jupyter_cloudtik.features`` entry point).

The cluster commands (``commands.py``, ``cli.py``) are the ones ``jupyter cloudtik`` runs
when no other feature claims the command: the one feature every other one builds on."""

from ..core.features import Feature

FEATURE = Feature(
    "clusters",
    magics=("jupyter_cloudtik.clusters.magics:CloudTikMagics",),
    routes=("jupyter_cloudtik.clusters.handlers", "jupyter_cloudtik.clusters.adaptive_handlers"),
    migrations=(("clusters", "jupyter_cloudtik.clusters.table:CLUSTER_MIGRATIONS"),),
    # the clusters table as the layers below and the other features read it (table.py)
    services=(
        ("cluster_owner", "jupyter_cloudtik.clusters.table:owner_and_state"),
        ("cluster_owners", "jupyter_cloudtik.clusters.table:owners"),
        ("live_cluster_configs", "jupyter_cloudtik.clusters.table:live_configs"),
    ),
)
