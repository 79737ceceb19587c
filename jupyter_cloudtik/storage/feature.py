"""Storage's faces: ``%storage``, ``jupyter cloudtik storage``, its REST routes (whose
module also remounts on start and unmounts on stop), node mounts, its tables."""

from ..core.features import Feature

FEATURE = Feature(
    "storage",
    magics=("jupyter_cloudtik.storage.magics:StorageMagics",),
    cli=("jupyter_cloudtik.storage.cli",),
    routes=("jupyter_cloudtik.storage.handlers",),
    node_runtime=("jupyter_cloudtik.storage.cluster:node_runtime",),
    migrations=(("storage", "jupyter_cloudtik.storage.catalog:STORAGE_MIGRATIONS"),),
)
