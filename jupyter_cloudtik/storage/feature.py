"""Storage's faces: ``%storage``, ``jupyter cloudtik storage``, its REST routes (whose
module also remounts on start and unmounts on stop), node mounts, its tables."""

from ..core.features import Feature

FEATURE = Feature(
    "storage",
    magics=("jupyter_cloudtik.storage.magics:StorageMagics",),
    cli=("jupyter_cloudtik.storage.cli",),
    routes=("jupyter_cloudtik.storage.handlers",),
    node_runtime=("jupyter_cloudtik.storage.cluster:node_runtime",),
    cluster_ready=("jupyter_cloudtik.storage.cluster:on_cluster_ready",),
    migrations=(("storage", "jupyter_cloudtik.storage.catalog:STORAGE_MIGRATIONS"),),
    # hpc stages a job's storage inputs and outputs through the same manager (and grants)
    services=(("storage_manager", "jupyter_cloudtik.storage.manager:StorageManager"),
              # the grant policies ask it which storages exist and which are read-only
              ("storage_index", "jupyter_cloudtik.storage.index:StorageIndex")),
)
