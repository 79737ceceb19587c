"""HPC jobs' faces: ``%hpc``, ``jupyter cloudtik jobs``, their REST routes, their tables."""

from ..core.features import Feature

FEATURE = Feature(
    "hpc",
    magics=("jupyter_cloudtik.hpc.magics:HPCMagics",),
    cli=("jupyter_cloudtik.hpc.cli",),
    routes=("jupyter_cloudtik.hpc.handlers",),
    migrations=(("hpc", "jupyter_cloudtik.hpc.jobs:HPC_MIGRATIONS"),
                # which server owns which interactive kernel's job (kernels/records.py)
                ("hpc_kernels", "jupyter_cloudtik.hpc.kernels.records:MIGRATIONS")),
    # the Slurm node provider's login node, from a configured backend (providers/ never
    # imports hpc/)
    # and the session's environment built for its jobs (as for HPC jobs, shared with them)
    services=(("slurm_login", "jupyter_cloudtik.hpc.slurm:slurm_login"),
              ("slurm_environment", "jupyter_cloudtik.hpc.cluster_env:slurm_environment")),
)
