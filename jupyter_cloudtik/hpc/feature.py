"""HPC jobs' faces: ``%hpc``, ``jupyter cloudtik jobs``, their REST routes, their tables."""

from ..core.features import Feature

FEATURE = Feature(
    "hpc",
    magics=("jupyter_cloudtik.hpc.magics:HPCMagics",),
    cli=("jupyter_cloudtik.hpc.cli",),
    routes=("jupyter_cloudtik.hpc.handlers",),
    migrations=(("hpc", "jupyter_cloudtik.hpc.jobs:HPC_MIGRATIONS"),),
)
