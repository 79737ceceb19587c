"""How jupyter_cloudtik reaches a machine it runs commands on: a shell here or over SSH
(``shell``) and the Slurm commands run through it (``slurm``).

It sits below both of its users, the HPC backends (``hpc/``) and the Slurm node provider
(``providers/slurm*.py``), and imports only ``core``: neither user reaches into the other
for the login node (the import-linter contract ``transport-below`` checks it).
"""
