"""Starting local nodes: each node's folder, credentials and record, its Dask command
line (TLS, the dashboard added once it is up), and its processes, forked by the
launcher daemon (``launcher.py``) or executed, in a sandbox when the state folder is
shared."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from ...core.errors import ConfigError, NodeLaunchError
from ...core.store import dumps
from ...runtime.tls import ensure_cluster_tls, node_files
from ..base import TAG_CLUSTER_NAME, TAG_NODE_KIND
from . import launcher
from .node import SCHEDULER_FROM_HEAD, scrub_environment

#: the preload that gives each node its dashboard once it is up (not while it starts)
DASHBOARD_LATER = "jupyter_cloudtik.providers.local.dashboard_later"
DASK_HTTP_ROUTES = [
    "distributed.http.scheduler.prometheus",
    "distributed.http.scheduler.info",
    "distributed.http.scheduler.json",
    "distributed.http.scheduler.api",  # check_idle, retire_workers: used by the reaper
    "distributed.http.health",
    "distributed.http.statics",
    # not "distributed.http.proxy" (worker pages through the scheduler's port): it imports
    # jupyter-server-proxy and aiohttp (0.2 s); dashboard_later.py adds it with the dashboard
]


class LocalNodeStart:
    """Creating nodes (a part of ``LocalNodeProvider``)."""

    def create_node(
        self, node_config: dict[str, Any], tags: dict[str, str], count: int
    ) -> dict[str, dict[str, Any]]:
        runtime = node_config.get("runtime") or {}
        role = runtime.get("role") or tags.get(TAG_NODE_KIND, "worker")
        env = scrub_environment(dict(os.environ))
        env["DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES"] = repr(DASK_HTTP_ROUTES)
        env.update(node_config.get("env") or {})
        resources = runtime.get("resources") or {}
        now = time.time()
        specs = []
        for _ in range(count):
            node_id = f"{self.cluster_name}-{role}-{secrets.token_hex(3)}"
            node_dir = self._node_dir(node_id)
            node_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            node_env = dict(env)
            node_env.update({str(k): str(v) for k, v in (runtime.get("env") or {}).items()})
            for item in runtime.get("secret_files") or ():
                # credentials the node needs: a 0600 file in its own 0700 folder
                path = node_dir / Path(item["name"]).name
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(item["content"])
                if item.get("env"):
                    node_env[item["env"]] = str(path)
            spec = {
                "node_id": node_id,
                "cluster": self.cluster_name,
                "state_dir": str(self.context.state_dir),
                "node_dir": str(node_dir),
                "log": str(node_dir / "node.log"),
                "role": role,
                "argv": self._dask_argv(role, node_id, node_dir, runtime),
                "env": node_env,
                "setup_commands": runtime.get("setup_commands") or [],
                "memory_limit": runtime.get("memory_limit") or 0,
                "title": f"cloudtik {role} {node_id}",
                # runtimes other than Dask start their own processes (runtime/base.py)
                "runtimes": runtime.get("types") or ["dask"],
                "runtime": {k: v for k, v in runtime.items() if k != "secret_files"},
                "host": self.internal_ip(node_id),
            }
            head = runtime.get("head_node_id") if role == "worker" else None
            if head:  # the worker waits for its head's scheduler file (node.py)
                spec["head"] = {"node_dir": str(self._node_dir(head)),
                                "host": (self.internal_ip(head) or "127.0.0.1")
                                if self.host in ("0.0.0.0", "") else None}
            info = {"node_dir": str(node_dir), "launch_method": self.launch_method,
                    "runtimes": spec["runtimes"]}
            with self.store.transaction() as conn:
                conn.execute(
                    "INSERT INTO local_nodes (node_id, cluster, tags, state, resources, info,"
                    " created_at, updated_at) VALUES (?, ?, ?, 'pending', ?, ?, ?, ?)",
                    (node_id, self.cluster_name, dumps({**tags, TAG_CLUSTER_NAME:
                     self.cluster_name}), dumps(resources), dumps(info), now, now),
                )
            specs.append(spec)

        try:
            launched = self._launch(specs)
        except Exception as e:
            for spec in specs:
                self._mark_terminated(spec["node_id"], f"launch failed: {e}")
            raise NodeLaunchError(f"could not start local {role} processes: {e}") from e
        out = {}
        with self.store.transaction() as conn:
            for item in launched:
                conn.execute(
                    "UPDATE local_nodes SET state = 'running', pid = ?, pid_started = ?,"
                    " updated_at = ? WHERE node_id = ? AND state = 'pending'",
                    (item["pid"], item["started"], time.time(), item["node_id"]),
                )
                out[item["node_id"]] = {"pid": item["pid"]}
        return out

    def _dask_argv(
        self, role: str, node_id: str, node_dir: Path, runtime: dict[str, Any]
    ) -> list[str]:
        dask_opts = runtime.get("dask") or {}
        tls: list[str] = []
        # with TLS the dashboards (no authentication of their own) stay on loopback
        dash_host = "127.0.0.1" if self.tls else self.host
        if self.tls:
            ensure_cluster_tls(self.context.state_dir, self.cluster_name)
            files = node_files(self.context.state_dir, self.cluster_name)
            if self.sandbox is not None:  # the node sees its own folder only: a copy there
                files = _copy_into(files, node_dir / "tls")
            tls = ["--protocol", "tls", "--tls-ca-file", files["ca"], "--tls-cert",
                   files["cert"], "--tls-key", files["key"]]
        own = [str(o) for o in dask_opts.get("scheduler_options" if role == "head"
                                              else "worker_options", [])]
        # the dashboard comes a moment after the node is up (dashboard_later.py), unless
        # the config's own options say how it should be
        later = [] if any(o.startswith(("--dashboard", "--no-dashboard")) and
                          not o.startswith("--dashboard-address") for o in own) else [
            "--no-dashboard", "--preload", DASHBOARD_LATER]
        if role == "head":
            return [
                "--host", self.host, "--port", "0",
                "--dashboard-address", f"{dash_host}:0", *later,
                "--scheduler-file", str(node_dir / "scheduler.json"),
                *tls,
                *own,
            ]
        if not (runtime.get("scheduler_address") or runtime.get("head_node_id")):
            raise ConfigError("node_config.runtime.scheduler_address: a worker node needs its "
                              "scheduler's address or its head node (runtime.head_node_id); "
                              "neither is given", field="node_config.runtime.scheduler_address")
        argv = [
            runtime.get("scheduler_address") or SCHEDULER_FROM_HEAD,  # node.py fills it in
            "--name", node_id,
            "--nthreads", str(max(int(runtime.get("nthreads") or 1), 1)),
            "--memory-limit", str(int(runtime.get("memory_limit") or 0)),
            "--local-directory", str(node_dir / "work"),
            "--host", self.host,
            "--dashboard-address", f"{dash_host}:0", *later,
            "--death-timeout", "60",
            *tls,
        ]
        argv += ["--nanny", "--nworkers", "1"] if dask_opts.get("nanny") else ["--no-nanny"]
        return argv + own

    def _launch(self, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.launch_method == "fork" and sys.platform.startswith("linux"):
            state_dir = self.context.state_dir
            launcher.ensure_running(
                state_dir, self.settings.launcher_idle_seconds,
                env=scrub_environment(dict(os.environ)),
            )
            try:
                return launcher.request(state_dir, {"op": "launch", "specs": specs})
            except launcher.LauncherUnavailable:
                # the launcher exited between hello and launch (idle); start it again
                launcher.ensure_running(
                    state_dir, self.settings.launcher_idle_seconds,
                    env=scrub_environment(dict(os.environ)),
                )
                return launcher.request(state_dir, {"op": "launch", "specs": specs})
        return [self._exec(spec) for spec in specs]

    def _exec(self, spec: dict[str, Any]) -> dict[str, Any]:
        node_dir = Path(spec["node_dir"])
        spec_path = node_dir / "spec.json"
        fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f)
        argv = [sys.executable, "-m", "jupyter_cloudtik.providers.local.node", str(spec_path)]
        env = spec["env"]
        if self.sandbox is not None:
            # the node sees its own folder (and its head's, for the scheduler file) and
            # nothing of the state folder: not the key, nor other nodes' credentials
            self.sandbox.check()
            self.sandbox.prepare(node_dir)
            head = (spec.get("head") or {}).get("node_dir")
            argv = self.sandbox.command(argv, writable=[node_dir],
                                        readable=[head] if head else [], cwd=node_dir)
            env = self.sandbox.environment(env, home=node_dir)
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=env, start_new_session=True, close_fds=True,
        )
        return {"node_id": spec["node_id"], "pid": proc.pid,
                "started": psutil.Process(proc.pid).create_time()}


def _copy_into(files: dict[str, str], folder: Path) -> dict[str, str]:
    """Copies of the cluster's TLS files in a node's own folder (0600), by the same keys."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    out = {}
    for key, path in files.items():
        target = folder / Path(path).name
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(Path(path).read_bytes())
        out[key] = str(target)
    return out
