"""The ``slurm_environment`` service: the session's environment for a Dask cluster on Slurm.

Why here: a Dask cluster over SSH runs its scheduler and workers as Slurm jobs of the
site's account, whose Python has none of the session's packages (and cannot read the
session's interpreter), while a task is a cloudpickled function that needs the same
Python major.minor and the same dask/distributed/cloudpickle/msgpack as the client.  The
HPC jobs already build exactly that (``environment.py``: wheels staged once, a venv per
lock hash in ``<workdir>/.cloudtik-envs``); the Slurm provider asks for the same thing
through this service (providers never import hpc/), so a cluster and a job with the same
packages on the same system share one built environment.
"""

from __future__ import annotations

import shlex
from typing import Any


def slurm_environment(context: Any, backend: str | None, config: dict[str, Any],
                      packages: Any, login: Any = None) -> dict[str, Any]:
    """Prepare (check, lock) and stage the environment of ``packages`` (names, or
    "session") on the Slurm system of a node provider: the configured HPC backend
    ``backend``, or the inline login ``config`` (as ``slurm_login`` takes them).
    ``login``: the provider's open ``SlurmLogin``, reused.  Returns the interpreter the
    jobs run (``python``), the job-script lines that build the environment unless it is
    there (``prologue``) and what a record keeps (``hash``, ``pins``, ``system``).
    Raises a ConfigError in one line for what the system cannot have."""
    # deferred: start-up (core.secrets ~48 ms, loads traitlets, cryptography; hpc.environment ~44
    #   ms, loads importlib.metadata; hpc.base ~19 ms; hpc.slurm ~58 ms, loads asyncio)
    from ..core.secrets import SecretStore
    from . import environment as envs
    from .base import BackendContext, Environment
    from .slurm import SlurmBackend, slurm_backend_config

    name = backend or "slurm"
    cfg = slurm_backend_config(context, backend, config)
    ctx = BackendContext(state_dir=context.state_dir, secrets=SecretStore(context.store),
                         log=context.log, settings=context.settings, name=name)
    be = SlurmBackend(name, {k: v for k, v in cfg.items() if k != "environment"}, ctx)
    if login is not None:
        be._login = login
    given = (cfg.get("environment") or {})
    env = Environment(packages=packages, setup=list(given.get("setup") or []),
                      base_python=given.get("base_python"), keep_days=given.get("keep_days"))
    try:
        env = envs.prepare(be, env)
        build = env.build or {}
        envs.stage(be.environment_shell(), build["root"], build, f"backend '{name}'")
    finally:
        if login is None:
            be.close()
    script = f"{build['root']}/{build['hash']}.sh"
    return {"python": env.python,
            "prologue": [*env.setup, f"bash {shlex.quote(script)} || exit 1"],
            "hash": build["hash"], "pins": build["pins"], "system": build["system"],
            "root": build["root"]}
