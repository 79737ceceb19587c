"""Interactive kernels on HPC backends: a notebook's kernel as a batch job.

* ``HPCKernels`` (traitlets): the admin's profiles (``c.HPCKernels.profiles``);
* ``HPCKernelSpecManager``: one launcher entry per profile;
* ``HPCKernelProvisioner`` (entry point ``cloudtik-hpc``): submits, watches, reaches
  (SSH tunnels to the node's loopback), interrupts and ends the kernel's job;
* ``kernel_status()``: what this process's HPC kernels are doing.

docs/hpc.md, "Interactive kernels".
"""

from .profiles import (
                       HPCKernels,
                       Profile,
                       check_interactive,
                       find_profile,
                       parse_profile,
                       parse_profiles,
)
from .provisioner import PROVISIONER_NAME, HPCKernelProvisioner, kernel_status, size_check
from .specs import HPCKernelSpecManager, kernel_specs, remember_custom, write_kernel_specs

__all__ = ["PROVISIONER_NAME", "HPCKernelProvisioner", "HPCKernelSpecManager", "HPCKernels",
           "Profile", "check_interactive", "find_profile", "kernel_specs", "kernel_status",
           "parse_profile", "parse_profiles", "remember_custom", "size_check",
           "write_kernel_specs"]

