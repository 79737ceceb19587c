"""The embedded ``local`` provider: a node is a group of processes on this machine.

The head node runs ``dask scheduler`` (with its dashboard), each worker node one
``dask worker`` limited to its declared threads and memory.  The "cloud" this provider asks
is the ``local_nodes`` table plus the process table: a node exists while its recorded
process (pid and start time) is alive, so a node that crashed is seen as gone and ``up``
replaces it.

Nodes share this machine the way ``distributed.LocalCluster``'s workers do: by default a
worker gets ``ceil(cores / workers)`` threads and a share of the memory such that the
workers of one cluster never declare more than the machine has (``fill_resources``).
Declared cores and memory are limits the nodes run under, not reservations: several
clusters at once may declare more than the machine in total (oversubscription).  That is
allowed, with a loud warning once the live local nodes of every cluster in the same state
folder would declare more than ``oversubscription_warning`` (2) times this machine's cores
or memory.  Refused before anything starts is only what cannot run at all: one node asking
more memory than the machine has, GPUs (there are none), or more nodes than the machine's
memory holds processes for (``NODE_MEMORY_FLOOR`` each).  An administrator who sets
``cpu_overcommit`` / ``memory_overcommit`` makes the declared totals a hard limit again
(this machine's cores / memory times the factor).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
from traitlets import Bool, Enum, Float, Unicode, default
from traitlets.config import Configurable

from ...core import env as envnames
from ...core.errors import ConfigError, NodeLaunchError
from ...core.sandbox import sandbox_for
from ...core.store import dumps, loads
from ...core.units import format_bytes
from ...runtime.tls import attach, ensure_cluster_tls, is_loopback, node_files, remove_cluster_tls
from ..base import (
    TAG_CLUSTER_NAME,
    TAG_NODE_KIND,
    Capacity,
    ConnectInfo,
    NodeProvider,
    ProviderContext,
)
from . import launcher
from .node import CANCELLED_MARK, SCHEDULER_FROM_HEAD, scrub_environment
from .processes import find_marked_processes, is_alive, terminate_group

if TYPE_CHECKING:
    from ...runtime.base import Runtime

LOCAL_MIGRATIONS = [
    """
    CREATE TABLE local_nodes (
        node_id TEXT PRIMARY KEY,
        cluster TEXT NOT NULL,
        tags TEXT NOT NULL,
        state TEXT NOT NULL,
        pid INTEGER,
        pid_started REAL,
        resources TEXT NOT NULL DEFAULT '{}',
        info TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        terminated_at REAL,
        exit_reason TEXT
    );
    CREATE INDEX local_nodes_cluster ON local_nodes(cluster, state);
    """,
]

PENDING_GRACE_SECONDS = 60.0
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


#: what a node's processes take whatever it declares (a Dask worker alone is ~100 MiB
#: resident): this machine's memory over it is how many local nodes can run at all
NODE_MEMORY_FLOOR = 128 * 2**20
#: the default factor of ``oversubscription_warning``
OVERSUBSCRIPTION_WARNING = 2.0


def machine_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def machine_memory() -> int:
    return psutil.virtual_memory().total


class LocalProvider(Configurable):
    """Settings of the local provider (``c.LocalProvider.*``)."""

    cpu_overcommit = Float(
        None, allow_none=True,
        help="Unset (the default): local nodes may declare any number of cores in total, "
             "as LocalCluster's workers share the machine (a warning past "
             "oversubscription_warning). Set: a hard limit, the nodes of every cluster may "
             "declare at most this machine's cores times this factor; more is refused.",
    ).tag(config=True)
    memory_overcommit = Float(
        None, allow_none=True,
        help="Unset (the default): no limit on the memory local nodes declare in total "
             "(one node may not declare more than the machine has). Set: a hard limit of "
             "this machine's memory times this factor for all of them.",
    ).tag(config=True)
    oversubscription_warning = Float(
        OVERSUBSCRIPTION_WARNING,
        help="A start or scale whose local nodes (of every cluster) would declare more "
             "than this many times this machine's cores or memory goes ahead with a "
             "warning (an event, and a message in the magics, the CLI and the panel). "
             "0: never warn.",
    ).tag(config=True)
    launch_method = Enum(
        ["fork", "exec"], default_value="fork",
        help="fork: nodes are forked from a launcher daemon with Dask preloaded (fast). "
             "exec: each node is a fresh `python` process.",
    ).tag(config=True)
    prewarm = Bool(
        True, help="Start the launcher in the background when the magics are loaded "
                   "(`%load_ext jupyter_cloudtik`) or the Jupyter server starts, so the "
                   "first `%cluster up` does not wait for Dask to be imported.",
    ).tag(config=True)
    launcher_idle_seconds = Float(
        help="Seconds the launcher daemon stays after its last node ended "
             "(env CLOUDTIK_LAUNCHER_IDLE; default 300).",
    ).tag(config=True)
    host = Unicode(
        "127.0.0.1", help="Address schedulers and workers listen on."
    ).tag(config=True)
    terminate_grace = Float(
        2.0, help="Seconds between SIGTERM and SIGKILL when stopping a node."
    ).tag(config=True)

    @default("launcher_idle_seconds")
    def _default_idle(self) -> float:
        try:
            return float(os.environ.get(envnames.LAUNCHER_IDLE, "300"))
        except ValueError:
            return 300.0


def prewarm_in_background(settings) -> threading.Thread:
    """``prewarm_launcher`` in a daemon thread: a face that will likely need the launcher
    (``%load_ext``, the Jupyter server's start) starts it without waiting for it."""

    def run() -> None:
        try:
            prewarm_launcher(settings)
        except Exception:  # only an optimisation: `up` starts the launcher anyway
            pass

    t = threading.Thread(target=run, name="cloudtik-prewarm", daemon=True)
    t.start()
    return t


def prewarm_launcher(settings) -> bool:
    """Start the local launcher now if this setup will use it; True if it was asked to."""
    local = LocalProvider(parent=settings)
    if not (local.prewarm and local.launch_method == "fork"
            and settings.default_provider == "local" and sys.platform.startswith("linux")):
        return False
    launcher.ensure_running(settings.state_dir, local.launcher_idle_seconds,
                            env=scrub_environment(dict(os.environ)))
    return True


class LocalNodeProvider(NodeProvider):
    provider_type = "local"
    delivers_secret_files = True  # 0600 files in the node's own folder
    #: runtime.pip / sync_env: the nodes run this very Python, nothing to install
    installs_packages = "shared"
    #: a new head's workers are forked right after it and read its scheduler file
    #: themselves (node.py: ``scheduler_address``): the first ``up`` does not wait for
    #: the scheduler to answer before it starts the workers
    workers_find_scheduler = True
    config_schema = {
        "type": "object",
        "title": "Local machine",
        "description": "Nodes are processes on the machine running Jupyter.",
        "additionalProperties": False,
        "properties": {
            "type": {"const": "local"},
            "host": {
                "type": "string",
                "title": "Listen address",
                "description": "Address the scheduler and workers bind to.",
                "default": "127.0.0.1",
            },
            "launch_method": {
                "enum": ["fork", "exec"],
                "title": "Launch method",
                "description": "fork (fast, from a preloaded launcher) or exec.",
            },
        },
    }
    node_config_schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "env": {
                "type": "object",
                "additionalProperties": {"type": "string", "x-cloudtik-names": "command"},
                "description": "Extra environment variables for the node's processes.",
            },
        },
    }

    def __init__(
        self, provider_config: dict[str, Any], cluster_name: str, context: ProviderContext
    ) -> None:
        super().__init__(provider_config, cluster_name, context)
        self.settings = LocalProvider(parent=context.settings)
        self.store = context.store
        self.store.ensure_schema("local", LOCAL_MIGRATIONS)
        self.host = provider_config.get("host") or self.settings.host
        self.launch_method = provider_config.get("launch_method") or self.settings.launch_method
        self.nodes_dir = launcher.local_dir(context.state_dir) / "nodes"
        # a state folder shared by many users (the hub sidekick) runs each node in its
        # own sandbox (core/sandbox.py): started one by one (no shared warm launcher),
        # and spoken to over TLS even on loopback, so nobody else on this machine can
        # give its workers tasks (and read what they were given)
        self.sandbox = sandbox_for(context.state_dir)
        if self.sandbox is not None:
            self.launch_method = "exec"
        # off loopback, nothing answers without the cluster's certificate (runtime.tls)
        self.tls = not is_loopback(self.host) or self.sandbox is not None

    def bootstrap_config(self, cluster_config: dict[str, Any]) -> dict[str, Any]:
        """Nodes are about to be launched (an ``up`` or a scale): the launcher, if none
        runs, starts loading Dask now, while the operation places and records them."""
        if self.launch_method == "fork" and sys.platform.startswith("linux"):
            launcher.start_soon(self.context.state_dir, self.settings.launcher_idle_seconds,
                                scrub_environment(dict(os.environ)))
        return cluster_config

    # defaults -------------------------------------------------------------------------
    @classmethod
    def default_node_types(cls, provider_config: dict[str, Any]) -> dict[str, Any]:
        return {
            "head": {"node_config": {}, "resources": {"CPU": 0}},
            "worker": {
                "node_config": {},
                # threads and memory: shares of this machine (fill_resources)
                "resources": {},
                "min_workers": 1,
                # a policy cap only: the capacity check refuses what the machine cannot hold
                "max_workers": max(machine_cpus(), 8),
            },
        }

    @classmethod
    def fill_resources(
        cls, provider_config: dict[str, Any], node_type: dict[str, Any]
    ) -> dict[str, Any]:
        """Shares of this machine, as ``distributed.LocalCluster`` gives its workers: with
        ``n`` workers of the type (``min_workers``, at least 1) on ``cores`` cores, a worker
        without a declared ``CPU`` gets ``ceil(cores / n)`` threads, and without a declared
        ``memory`` ``machine memory x CPU / max(cores, n x CPU)``: its share of the cores,
        never more than 1/n of the memory, so the cluster's workers never declare more
        memory than the machine has.  Declared values are kept exactly."""
        res = dict(node_type.get("resources") or {})
        cores = max(machine_cpus(), 1)
        n = max(int(node_type.get("min_workers") or 0), 1)
        if "CPU" not in res:
            res["CPU"] = max(1, -(-cores // n))
        if "memory" not in res:
            cpu = float(res["CPU"] or 0)
            res["memory"] = int(machine_memory() * cpu / max(cores, n * cpu)) if cpu else 0
        res.setdefault("GPU", 0)
        return res

    def _live_use(self) -> tuple[dict[str, dict[str, float]], int]:
        """What the live local nodes of every cluster declare (cluster -> totals), and how
        many nodes they are."""
        in_use: dict[str, dict[str, float]] = {}
        nodes = 0
        for row in self._rows(states=("pending", "running")):
            if row["state"] == "running" and not is_alive(row["pid"], row["pid_started"]):
                continue
            nodes += 1
            res = loads(row["resources"], {})
            use = in_use.setdefault(row["cluster"], {"CPU": 0, "memory": 0, "GPU": 0})
            for k in use:
                use[k] += res.get(k, 0) or 0
        return in_use, nodes

    def capacity(self) -> Capacity:
        s = self.settings
        cores, memory = machine_cpus(), machine_memory()
        in_use, nodes = self._live_use()
        used_cpu = sum(u["CPU"] for u in in_use.values())
        used_mem = int(sum(u["memory"] for u in in_use.values()))
        most_nodes = memory // NODE_MEMORY_FLOOR
        limits = []
        if s.cpu_overcommit is not None:
            limits.append(f"c.LocalProvider.cpu_overcommit = {s.cpu_overcommit:g}")
        if s.memory_overcommit is not None:
            limits.append(f"c.LocalProvider.memory_overcommit = {s.memory_overcommit:g}")
        return Capacity(
            cpus=(None if s.cpu_overcommit is None
                  else max(cores * s.cpu_overcommit - used_cpu, 0)),
            memory=(None if s.memory_overcommit is None
                    else max(int(memory * s.memory_overcommit) - used_mem, 0)),
            gpus=0,
            max_nodes=max(most_nodes - nodes, 0),
            node_memory=memory,
            description=(
                f"this machine has {cores} CPU cores and {memory / 2**30:.1f} GiB of memory"
                f", room for at most {most_nodes} local nodes ("
                f"{format_bytes(NODE_MEMORY_FLOOR)} each at least)"
                + (f"; hard limits set: {', '.join(limits)}" if limits else "")
            ),
            in_use=in_use,
        )

    def oversubscription(self, cpus: float, memory: int) -> str | None:
        """The warning when the live local nodes of every cluster plus new ones declaring
        ``cpus`` cores and ``memory`` would declare more than ``oversubscription_warning``
        times this machine's cores or memory."""
        factor = self.settings.oversubscription_warning
        if factor <= 0 or (cpus <= 0 and memory <= 0):
            return None
        cores, mem = machine_cpus(), machine_memory()
        in_use, _nodes = self._live_use()
        total_cpu = cpus + sum(u["CPU"] for u in in_use.values())
        total_mem = memory + sum(u["memory"] for u in in_use.values())
        if total_cpu <= cores * factor + 1e-9 and total_mem <= mem * factor:
            return None
        return (
            f"the local nodes would declare {total_cpu:g} cores and {format_bytes(total_mem)}"
            f" on this machine's {cores} cores and {format_bytes(mem)} "
            f"({total_cpu / cores:.1f}x, {total_mem / mem:.1f}x): they share it and run "
            "slower; fewer or smaller workers avoid it "
            f"(c.LocalProvider.oversubscription_warning = {factor:g})"
        )

    def offers(self, query=None):
        """This machine as one offer: its cores and memory, free without limit unless an
        overcommit factor is set (then minus what live local nodes of every cluster
        declare), room for as many nodes as its memory holds processes for, no node
        bigger than its memory (``node_max``), and who owns the live nodes."""
        import platform
        import socket

        from ...placement.model import Offer, OfferSet

        cap = self.capacity()
        s = self.settings
        owners = {r[0]: r[1] for r in self.store.query("SELECT name, owner FROM clusters")}
        instances = []
        for row in self._rows(states=("pending", "running")):
            if row["state"] == "running" and not is_alive(row["pid"], row["pid_started"]):
                continue
            instances.append({"cluster": row["cluster"], "owner": owners.get(row["cluster"])})
        host = socket.gethostname()
        return OfferSet([Offer(
            key=f"local/{host}", provider="local", region="local", availability_zone=host,
            arch=platform.machine(), price_per_hour=0.0,
            total={"CPU": machine_cpus() * (s.cpu_overcommit or 1),
                   "memory": float(int(machine_memory() * (s.memory_overcommit or 1))),
                   "GPU": 0.0, "instances": float(machine_memory() // NODE_MEMORY_FLOOR)},
            # None: no limit on the total (oversubscription is allowed, with a warning)
            free={"CPU": cap.cpus, "memory": cap.memory, "GPU": cap.gpus,
                  "instances": cap.max_nodes},
            node_max={"memory": float(machine_memory())},
            instances=instances, description=cap.description)])

    # records --------------------------------------------------------------------------
    def _rows(self, states: tuple[str, ...] = ("pending", "running"), cluster: str | None = None):
        marks = ",".join("?" * len(states))
        sql = f"SELECT * FROM local_nodes WHERE state IN ({marks})"
        params: list[Any] = list(states)
        if cluster is not None:
            sql += " AND cluster = ?"
            params.append(cluster)
        return self.store.query(sql, params)

    def _row(self, node_id: str):
        return self.store.query_one("SELECT * FROM local_nodes WHERE node_id = ?", (node_id,))

    def _node_dir(self, node_id: str) -> Path:
        return self.nodes_dir / node_id

    def _mark_terminated(self, node_id: str, reason: str) -> None:
        now = time.time()
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE local_nodes SET state = 'terminated', terminated_at = ?, updated_at = ?,"
                " exit_reason = COALESCE(exit_reason, ?) WHERE node_id = ? AND state != "
                "'terminated'",
                (now, now, reason, node_id),
            )

    def _refresh(self, row) -> bool:
        """Is the node still there?  Marks it terminated when its process is gone."""
        if row["state"] == "running":
            if is_alive(row["pid"], row["pid_started"]):
                return True
            self._mark_terminated(row["node_id"], self._exit_reason(row["node_id"]))
            return False
        # pending: the launch may still be under way, or its requester died mid-way (a
        # sandboxed node's own pid is one of its namespace's: only what Popen gave counts)
        pidfile = self._node_dir(row["node_id"]) / "pid"
        if pidfile.exists() and self.sandbox is None:
            try:
                pid = int(pidfile.read_text())
            except ValueError:
                pid = 0
            if is_alive(pid):
                started = psutil.Process(pid).create_time()
                with self.store.transaction() as conn:
                    conn.execute(
                        "UPDATE local_nodes SET state = 'running', pid = ?, pid_started = ?,"
                        " updated_at = ? WHERE node_id = ?",
                        (pid, started, time.time(), row["node_id"]),
                    )
                return True
        if time.time() - row["created_at"] < PENDING_GRACE_SECONDS:
            return True
        self._mark_terminated(row["node_id"], "never started")
        return False

    def _exit_reason(self, node_id: str) -> str:
        d = self._node_dir(node_id)
        killed = d / "killed"
        if killed.exists():
            return f"killed: {killed.read_text().strip()}"
        code = d / "exitcode"
        if code.exists():
            value = code.read_text().strip()
            if value.startswith("-"):
                import signal

                try:
                    return f"killed by {signal.Signals(-int(value)).name}"
                except ValueError:
                    pass
            return f"exited with code {value}"
        return "process ended"

    # NodeProvider -------------------------------------------------------------------------
    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        out = []
        for row in self._rows(cluster=self.cluster_name):
            tags = loads(row["tags"], {})
            if any(tags.get(k) != v for k, v in tag_filters.items()):
                continue
            if self._refresh(row):
                out.append(row["node_id"])
        return out

    def is_running(self, node_id: str) -> bool:
        row = self._row(node_id)
        return bool(row) and row["state"] == "running" and is_alive(row["pid"], row["pid_started"])

    def is_terminated(self, node_id: str) -> bool:
        row = self._row(node_id)
        return row is None or row["state"] == "terminated" or not self._refresh(row)

    def node_tags(self, node_id: str) -> dict[str, str]:
        row = self._row(node_id)
        return loads(row["tags"], {}) if row else {}

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        with self.store.transaction() as conn:
            row = conn.execute(
                "SELECT tags FROM local_nodes WHERE node_id = ?", (node_id,)
            ).fetchone()
            if row is None:
                return
            merged = {**loads(row["tags"], {}), **tags}
            conn.execute(
                "UPDATE local_nodes SET tags = ?, updated_at = ? WHERE node_id = ?",
                (dumps(merged), time.time(), node_id),
            )

    def internal_ip(self, node_id: str) -> str | None:
        return "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host

    def node_info(self, node_id: str) -> dict[str, Any]:
        row = self._row(node_id)
        if row is None:
            return {}
        info = loads(row["info"], {})
        info.update({"pid": row["pid"], "state": row["state"]})
        for t in info.get("runtimes") or ():  # what a runtime's node wrote (its ports)
            if t != "dask":
                try:
                    info[t] = json.loads(
                        (self._node_dir(node_id) / f"runtime-{t}.json").read_text())
                except (OSError, ValueError):
                    pass
        if row["exit_reason"]:
            info["exit_reason"] = row["exit_reason"]
        return info

    def node_logs(self, node_id: str, tail: int = 200) -> str:
        log = self._node_dir(node_id) / "node.log"
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-tail:]) if tail else "\n".join(lines)

    def recent_nodes(self, limit: int = 50) -> list[str]:
        rows = self.store.query(
            "SELECT node_id FROM (SELECT node_id, created_at FROM local_nodes WHERE cluster = ?"
            " ORDER BY created_at DESC LIMIT ?) ORDER BY created_at",
            (self.cluster_name, limit),
        )
        return [r[0] for r in rows]

    def node_failure_hint(self, node_id: str) -> str:
        reason = self._exit_reason(node_id)
        tail = self.node_logs(node_id, tail=8)
        return f"{reason}; log {self._node_dir(node_id) / 'node.log'} ends with:\n{tail}"

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

    def terminate_node(self, node_id: str) -> None:
        self.terminate_nodes([node_id])

    def terminate_nodes(self, node_ids: list[str]) -> None:
        rows = [r for r in (self._row(n) for n in node_ids) if r is not None]
        # signal every node first, then wait for all: N nodes stop in one grace period
        threads = [
            threading.Thread(
                target=terminate_group,
                args=(r["pid"], r["pid_started"], self.settings.terminate_grace),
            )
            for r in rows if r["pid"]
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in rows:  # a launch still in flight sees this and does not start (node.py)
            try:
                (self._node_dir(r["node_id"]) / CANCELLED_MARK).touch()
            except OSError:
                pass
        # a process whose pid never reached the record (crash mid-launch) is still marked
        for pid, _node in find_marked_processes(
            self.context.state_dir, node_ids=[r["node_id"] for r in rows]
        ).items():
            terminate_group(pid, None, self.settings.terminate_grace)
        for r in rows:
            self._mark_terminated(r["node_id"], "terminated")
            shutil.rmtree(self._node_dir(r["node_id"]) / "work", ignore_errors=True)

    def sweep_orphans(self) -> int:
        """Stop processes marked as this cluster's nodes that no live record knows."""
        known = {r["node_id"] for r in self._rows(cluster=self.cluster_name)}
        orphans = {
            pid: node for pid, node in find_marked_processes(
                self.context.state_dir, cluster=self.cluster_name
            ).items() if node not in known
        }
        for pid in orphans:
            terminate_group(pid, None, self.settings.terminate_grace)
        return len(orphans)

    def connect_info(self, head_node_id: str) -> ConnectInfo | None:
        row = self._row(head_node_id)
        types = (loads(row["info"], {}) if row else {}).get("runtimes") or ["dask"]
        if types != ["dask"]:
            return self._runtimes_connect_info(head_node_id, types)
        return self._dask_connect_info(head_node_id)

    def _runtimes_connect_info(self, head_node_id: str,
                               types: list[str]) -> ConnectInfo | None:
        """Dask's scheduler file plus what every other runtime's head wrote (None until
        all of them are up)."""
        from ...runtime.base import runtime_class

        host = self.internal_ip(head_node_id) or "127.0.0.1"
        extra = {}
        for t in types:
            if t == "dask":
                continue
            part = runtime_class(t)().head_info(self._node_dir(head_node_id), host)
            if part is None:
                return None
            extra[t] = part
        if "dask" in types:
            info = self._dask_connect_info(head_node_id)
            if info is not None:
                info.extra.update(extra)
            return info
        first = extra[types[0]]
        return ConnectInfo(scheduler_address=first.get("master_url") or "",
                           dashboard_link=first.get("ui"), http_address=first.get("ui"),
                           extra=extra)

    def _dask_connect_info(self, head_node_id: str) -> ConnectInfo | None:
        path = self._node_dir(head_node_id) / "scheduler.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        host = self.internal_ip(head_node_id)
        port = (data.get("services") or {}).get("dashboard")
        address = data["address"]
        if self.host in ("0.0.0.0", ""):
            scheme = address.split("://", 1)[0]
            address = f"{scheme}://{host}:{address.rsplit(':', 1)[1]}"
        dash = "127.0.0.1" if self.tls else host
        info = ConnectInfo(
            scheduler_address=address,
            dashboard_link=f"http://{dash}:{port}/status" if port else None,
            http_address=f"http://{dash}:{port}" if port else None,
            extra={"tls": True} if self.tls else {},
        )
        return attach(info, self.context.state_dir, self.cluster_name)

    def forget_history(self) -> int:
        """Every ended node of this cluster: its folder (log included) and its record."""
        rows = self.store.query(
            "SELECT node_id FROM local_nodes WHERE cluster = ? AND state = 'terminated'",
            (self.cluster_name,))
        for r in rows:
            shutil.rmtree(self._node_dir(r["node_id"]), ignore_errors=True)
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM local_nodes WHERE cluster = ? AND state = 'terminated'",
                         (self.cluster_name,))
        return len(rows)

    def _runtimes_run(self) -> list[Runtime]:
        """Every runtime that a node of this cluster ran here (its rows' ``runtimes``),
        each once; one no longer installed is passed over (nothing can release for it)."""
        from ...runtime.base import installed, runtime_class

        types: list[str] = []
        for r in self.store.query("SELECT info FROM local_nodes WHERE cluster = ?",
                                  (self.cluster_name,)):
            for t in loads(r["info"], {}).get("runtimes") or ["dask"]:
                if t not in types:
                    types.append(t)
        have = set(installed())
        return [runtime_class(t)() for t in types if t in have]

    def cleanup(self) -> None:
        """Forget node folders of this cluster that ended more than a week ago, and its
        TLS material (a next ``up`` makes a new CA)."""
        if not self._rows(cluster=self.cluster_name):
            remove_cluster_tls(self.context.state_dir, self.cluster_name)
            for rt in self._runtimes_run():
                rt.release_local(self.context.state_dir, self.cluster_name)
        cutoff = time.time() - 7 * 24 * 3600
        rows = self.store.query(
            "SELECT node_id FROM local_nodes WHERE cluster = ? AND state = 'terminated'"
            " AND terminated_at < ?",
            (self.cluster_name, cutoff),
        )
        for r in rows:
            shutil.rmtree(self._node_dir(r["node_id"]), ignore_errors=True)
        with self.store.transaction() as conn:
            conn.execute(
                "DELETE FROM local_nodes WHERE cluster = ? AND state = 'terminated'"
                " AND terminated_at < ?",
                (self.cluster_name, cutoff),
            )


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
