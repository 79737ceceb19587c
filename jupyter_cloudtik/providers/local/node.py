"""What runs inside a local node process: setup commands, then ``dask scheduler|worker``.

The same function serves both launch methods: called in a child forked from the launcher
(which has Dask already imported, so a node is up in tens of milliseconds), or as
``python -m jupyter_cloudtik.providers.local.node SPEC.json`` in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from .processes import CLUSTER_ENV, NODE_ID_ENV, STATE_DIR_ENV

SETUP_FAILED_EXIT = 3

# Variables that must not travel from the process that started the launcher (a kernel, a
# server) into node processes: API tokens and cloud credentials.
_SENSITIVE_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "_SK", "API_KEY")
_SENSITIVE_PREFIXES = ("HUAWEICLOUD_SDK_", "AWS_SECRET", "JUPYTERHUB_", "JPY_")


def scrub_environment(env: dict[str, str]) -> dict[str, str]:
    """A copy of ``env`` without credentials and session tokens."""
    clean = {}
    for key, value in env.items():
        upper = key.upper()
        if upper.startswith(_SENSITIVE_PREFIXES) or any(m in upper for m in _SENSITIVE_MARKERS):
            continue
        clean[key] = value
    return clean


def prepare_process(spec: dict[str, Any]) -> None:
    """Turn the current (fresh or forked) process into the node described by ``spec``."""
    node_dir = Path(spec["node_dir"])
    node_dir.mkdir(parents=True, exist_ok=True)
    log_fd = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(null_fd)
    os.close(log_fd)
    os.chdir(node_dir)
    for key in list(os.environ):
        if key not in spec["env"] and key not in spec.get("keep_env", ()):
            del os.environ[key]
    os.environ.update(spec["env"])
    os.environ[NODE_ID_ENV] = spec["node_id"]
    os.environ[CLUSTER_ENV] = spec["cluster"]
    os.environ[STATE_DIR_ENV] = spec["state_dir"]
    tmp = node_dir / "pid.tmp"
    tmp.write_text(str(os.getpid()))
    tmp.replace(node_dir / "pid")
    try:
        import setproctitle

        setproctitle.setproctitle(spec.get("title") or f"cloudtik node {spec['node_id']}")
    except Exception:  # cosmetic only
        pass
    random.seed()


def run_setup_commands(commands: list[str]) -> None:
    for i, command in enumerate(commands, 1):
        print(f"[cloudtik] setup command {i}/{len(commands)}: {command}", flush=True)
        rc = subprocess.run(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL).returncode
        if rc != 0:
            print(f"[cloudtik] setup command {i} failed with exit code {rc}", flush=True)
            raise SystemExit(SETUP_FAILED_EXIT)


def run_runtime(spec: dict[str, Any]) -> int:
    """Run the Dask process of this node until it ends; returns its exit code."""
    import dask

    dask.config.refresh()  # the environment changed since Dask was imported (fork)
    run_setup_commands(spec.get("setup_commands") or [])
    role = spec["role"]
    if role == "head":
        from distributed.cli import dask_scheduler as cli
    else:
        from distributed.cli import dask_worker as cli
    print(f"[cloudtik] starting dask {'scheduler' if role == 'head' else 'worker'}: "
          f"{' '.join(spec['argv'])}", flush=True)
    try:
        cli.main(args=spec["argv"], prog_name=f"dask {role}", standalone_mode=True)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def run_node(spec: dict[str, Any]) -> int:
    prepare_process(spec)
    try:
        code = run_runtime(spec)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException as e:  # the log is the only place this can go
        import traceback

        traceback.print_exc()
        print(f"[cloudtik] node failed: {e!r}", flush=True)
        code = 1
    # written before the process ends, so whoever sees it gone can say why
    try:
        Path(spec["node_dir"], "exitcode").write_text(str(code))
    except OSError:
        pass
    return code


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    Path(argv[0]).unlink(missing_ok=True)
    code = run_node(spec)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
