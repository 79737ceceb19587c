"""The cloud-init user data that turns a fresh server into a Dask head or worker.

The script is the same for every server of one ``create`` call (N servers, one call): a
server learns who it is (its id, which is also its Dask worker name, and its private IP)
from the instance metadata service.  It installs the same dask/distributed versions the
user has (unless the image already has them), runs the cluster's setup commands, and
starts the scheduler or the worker in the background, logging to ``$NODE_DIR/node.log``.

It carries no credentials: nodes reach cloud services as their IAM agency (instance
identity); the script only names the OBS bucket.
"""

from __future__ import annotations

import base64
import shlex
from typing import Any

SCHEDULER_PORT = 8786
DASHBOARD_PORT = 8787
MAX_USER_DATA = 32 * 1024  # ECS refuses more (base64-encoded)
DASK_HTTP_ROUTES = [
    "distributed.http.scheduler.prometheus",
    "distributed.http.scheduler.info",
    "distributed.http.scheduler.json",
    "distributed.http.scheduler.api",
    "distributed.http.health",
    "distributed.http.proxy",
    "distributed.http.statics",
]

TEMPLATE = r"""#!/bin/bash
# jupyter_cloudtik node bootstrap: {role} of cluster {cluster}
set -uo pipefail
NODE_DIR="${{CLOUDTIK_NODE_DIR:-/opt/cloudtik}}"
META="${{CLOUDTIK_METADATA_URL:-http://169.254.169.254}}"
mkdir -p "$NODE_DIR/work" && cd "$NODE_DIR" || exit 1
exec >>"$NODE_DIR/node.log" 2>&1
echo "[cloudtik] $(date -u +%FT%TZ) bootstrap of a {role} node"
PY="$(command -v python3 || command -v python)"

# 1. the runtime: the versions the user's client has
if ! "$PY" -c 'import sys, dask, distributed
sys.exit((dask.__version__, distributed.__version__) != ({dask!r}, {distributed!r}))' \
    2>/dev/null; then
  echo "[cloudtik] installing dask=={dask} distributed=={distributed}"
  "$PY" -m pip install --quiet "dask=={dask}" "distributed=={distributed}" "bokeh>=3.1" || exit 1
fi

# 2. who am I: the instance metadata service
read -r NODE_ID NODE_IP < <("$PY" - "$META" <<'PYEOF'
import json, sys, urllib.request
base = sys.argv[1].rstrip("/")
get = lambda p: urllib.request.urlopen(base + p, timeout=10).read().decode()
print(json.loads(get("/openstack/latest/meta_data.json"))["uuid"],
      get("/latest/meta-data/local-ipv4"))
PYEOF
)
[ -n "${{NODE_IP:-}}" ] || {{ echo "[cloudtik] no metadata service"; exit 1; }}
echo "[cloudtik] node $NODE_ID at $NODE_IP"
export CLOUDTIK_NODE_ID="$NODE_ID" CLOUDTIK_CLUSTER={cluster_q} CLOUDTIK_NODE_ROLE={role}
{storage_env}
# 3. setup commands of the cluster config
{setup}
# 4. start the runtime in the background (cloud-init must finish)
export DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES={routes_q}
{start}
echo $! > "$NODE_DIR/runtime.pid"
echo "[cloudtik] runtime started (pid $(cat "$NODE_DIR/runtime.pid"))"
"""


def _start_command(role: str, runtime: dict[str, Any]) -> str:
    dask_opts = runtime.get("dask") or {}
    if role == "head":
        args = ["-m", "distributed.cli.dask_scheduler", "--host", "$NODE_IP", "--port",
                str(SCHEDULER_PORT), "--dashboard-address", f"$NODE_IP:{DASHBOARD_PORT}",
                *[shlex.quote(o) for o in dask_opts.get("scheduler_options", [])]]
    else:
        args = ["-m", "distributed.cli.dask_worker", shlex.quote(runtime["scheduler_address"]),
                "--name", "$NODE_ID", "--host", "$NODE_IP",
                "--nthreads", str(max(int(runtime.get("nthreads") or 1), 1)),
                "--memory-limit", str(int(runtime.get("memory_limit") or 0)),
                "--local-directory", '"$NODE_DIR/work"', "--dashboard-address", "$NODE_IP:0",
                "--death-timeout", "120",
                *(["--nanny"] if dask_opts.get("nanny") else ["--no-nanny"]),
                *[shlex.quote(o) for o in dask_opts.get("worker_options", [])]]
    return f'nohup "$PY" {" ".join(args)} >>"$NODE_DIR/node.log" 2>&1 &'


def render(role: str, runtime: dict[str, Any], *, storage: dict[str, Any] | None = None,
           versions: tuple[str, str] | None = None) -> str:
    """The user data script of a node of ``role`` (head or worker)."""
    if versions is None:
        import dask
        import distributed

        versions = (dask.__version__, distributed.__version__)
    setup = "\n".join(
        f'echo "[cloudtik] setup: {i + 1}"\n( {cmd} ) || {{ echo "[cloudtik] setup command '
        f'{i + 1} failed"; exit 1; }}'
        for i, cmd in enumerate(runtime.get("setup_commands") or [])) or ":"
    storage_env = ""
    if storage:
        storage_env = (f"export CLOUDTIK_OBS_BUCKET={shlex.quote(storage['bucket'])} "
                       f"CLOUDTIK_OBS_ENDPOINT={shlex.quote(storage.get('endpoint') or '')}")
    return TEMPLATE.format(
        role=role, cluster=runtime.get("cluster_name", ""),
        cluster_q=shlex.quote(runtime.get("cluster_name", "")), dask=versions[0],
        distributed=versions[1], setup=setup, storage_env=storage_env,
        routes_q=shlex.quote(repr(DASK_HTTP_ROUTES)), start=_start_command(role, runtime))


def encode(script: str) -> str:
    data = base64.b64encode(script.encode()).decode()
    if len(data) > MAX_USER_DATA:
        from ...core.errors import ConfigError

        raise ConfigError(
            f"setup_commands: the node start-up script is {len(data)} bytes base64-encoded; "
            f"ECS accepts at most {MAX_USER_DATA}; shorten setup_commands (e.g. put them in a "
            "script in the workspace bucket)", field="setup_commands")
    return data
