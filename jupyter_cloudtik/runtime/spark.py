"""Spark: a standalone cluster (master on the head, a worker per worker node).

The Spark that runs is the one the ``pyspark`` distribution ships (its ``jars/``): nothing is
downloaded at run time.  A node starts the daemon's JVM directly (``java -cp jars/*
org.apache.spark.deploy.master.Master`` — what ``start-master.sh`` runs through
``spark-daemon.sh`` and ``spark-class``), as a child in the node's process group, so
stopping the node stops the JVM and nothing is left behind.

The core asks the master's own JSON (``<master UI>/json/``) which workers are alive, how
many cores and how much memory they offer, and which applications run: that is the
health check, the status view, and the idle check (no running application).

``client`` returns a ``SparkSession`` whose driver runs where the user is, pointed at the
master.  A pyspark on the nodes different from the client's is refused at boot, with
both versions named: the driver and the executors must run the same Spark.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core import env as envnames
from ..core import ports
from ..core.errors import ConfigError, ConflictError
from ..core.fuse import unmount_path
from .base import Runtime, RuntimeUnreachable, http_json
from .tls import SPARK_UI_ALPN, client_ssl_context

if TYPE_CHECKING:
    from ..core.models import ConnectInfo
    from ..providers.base import NodeProvider

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
JAVA_PACKAGE = "openjdk-17-jre-headless"
DEFAULT_DAEMON_MEMORY = "512m"
#: every node's ``spark-defaults.conf`` (the cluster's ``runtime.spark.conf`` overrides):
#: the master relays its workers' and the applications' UIs under ``/proxy/<id>/``, so the
#: Jupyter server reaches every UI of the cluster through the master's port
#: (``api/spark_ui.py``)
NODE_CONF = {"spark.ui.reverseProxy": "true"}
VERSION_MISMATCH_EXIT = 4
NO_JAVA_EXIT = 5
MOUNT_FAILED_EXIT = 6
CONNECT_FAILED_EXIT = 7
SUBMIT_CLASS = "org.apache.spark.deploy.SparkSubmit"
CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
CONNECT_APP_NAME = "Spark Connect server"
DEFAULT_CONNECT_MEMORY = "1g"
CONNECT_TIMEOUT = 240.0
MOUNT_TIMEOUT = 30.0
# what Spark's launcher adds for Java 17 (org.apache.spark.launcher.JavaModuleOptions)
JAVA_MODULE_OPTIONS = [
    "-XX:+IgnoreUnrecognizedVMOptions",
    "--add-modules=jdk.incubator.vector",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.invoke=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.net=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.cs=ALL-UNNAMED",
    "--add-opens=java.base/sun.security.action=ALL-UNNAMED",
    "--add-opens=java.base/sun.util.calendar=ALL-UNNAMED",
    "--add-opens=java.security.jgss/sun.security.krb5=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.type=pooled",
    "-Dio.netty.handler.ssl.defaultEndpointVerificationAlgorithm=NONE",
    "--sun-misc-unsafe-memory-access=allow",
    "--enable-native-access=ALL-UNNAMED",
]


def java_binary() -> str | None:
    """The ``java`` Spark would use: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def no_java_message() -> str:
    return (f"the Spark runtime needs a Java 17+ runtime and there is none (no java on PATH, "
            f"JAVA_HOME unset): install it, e.g. `apt-get install {JAVA_PACKAGE}`")


def pyspark_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("pyspark")
    except Exception:
        return None


def spark_home() -> Path:
    """The Spark inside the installed pyspark distribution (its jars, bin, sbin)."""
    import pyspark

    return Path(pyspark.__file__).parent


def scala_version(home: Path) -> str:
    for jar in home.glob("jars/spark-core_*.jar"):
        return jar.name.split("_", 1)[1].split("-", 1)[0]
    return "2.13"


def _free_port(host: str) -> int:
    return ports.free_port(host)


def _spark_time(value: str | None) -> float:
    """Epoch seconds of a time in Spark's REST answers (``2026-12-01T13:01:23.456GMT``)."""
    if not value:
        return 0.0
    from datetime import datetime, timezone

    try:
        parsed = datetime.strptime(value.replace("GMT", ""), "%Y-%m-%dT%H:%M:%S.%f")
    except ValueError:
        return 0.0
    return parsed.replace(tzinfo=timezone.utc).timestamp()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def daemon_command(java: str, home: Path, conf_dir: Path, memory: str, cls: str,
                   args: list[str]) -> list[str]:
    """The JVM command of a master or worker daemon (what ``spark-class`` builds)."""
    slf4j = sorted(home.glob("jars/slf4j-api-*.jar"))  # first, as spark-class puts it
    cp = ":".join([f"{conf_dir}/", *map(str, slf4j[:1]), f"{home}/jars/*"])
    # the daemons only coordinate: a quick-starting JIT and a small GC suit them
    return [java, "-cp", cp, f"-Xmx{memory}", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
            *JAVA_MODULE_OPTIONS, cls, *args]


#: the standalone master's RPC port on a cloud node (Spark's default); the security group
#: opens it to the VPC only (providers/huaweicloud/workspace.py)
NODE_MASTER_PORT = 7077
#: the master UI on the head's loopback (Spark's default port): it has no authentication
#: and can kill applications (``spark.ui.killEnabled``), so it is never on a network
NODE_UI_PORT = 8080
NODE_WORKER_PORT = 7078
NODE_WORKER_UI_PORT = 8081


def node_shell_start(role: str, runtime: dict[str, Any]) -> str:
    """The shell lines that start this runtime's daemon on a cloud node (user data), as
    ``start_local`` does on the local provider's nodes: the same JVM command
    (``daemon_command``), from the Spark the node's pyspark ships, in the background.

    Expects ``$PY``, ``$NODE_DIR`` and ``$NODE_IP`` (userdata.py's template).  The master
    listens on ``$NODE_IP:7077`` and its UI on the head's loopback only; a worker offers
    the node's declared cores and memory."""
    import shlex

    opts = runtime.get("spark") or {}
    conf = {**NODE_CONF, **(opts.get("conf") or {})}
    memory = str(opts.get("daemon_memory") or DEFAULT_DAEMON_MEMORY)
    if role == "head":
        args = ["--host", "$NODE_IP", "--port", str(NODE_MASTER_PORT), "--webui-port",
                str(NODE_UI_PORT)]
        # the UI binds to SPARK_LOCAL_IP: the node's loopback (userdata.py NODE_LOOPBACK)
        cls, local_ip = MASTER_CLASS, "${NODE_LOOPBACK:-127.0.0.1}"
    else:
        res = runtime.get("resources") or {}
        cores = max(int(res.get("CPU") or 1), 1)
        mem_mb = max(int((res.get("memory") or 0) // 2**20), 1024)
        master = opts.get("master_url") or ""
        args = ["--host", "$NODE_IP", "--port", str(NODE_WORKER_PORT), "--webui-port",
                str(NODE_WORKER_UI_PORT), "--cores", str(cores), "--memory", f"{mem_mb}m",
                "--work-dir", '"$NODE_DIR/work"', shlex.quote(master)]
        cls, local_ip = WORKER_CLASS, "$NODE_IP"
    # the JVM command of daemon_command, with the node's paths left to the shell
    cmd = daemon_command("java", Path("SPARKHOME"), Path("SPARKCONF"), memory, cls, args)
    cmd[2] = '"$SPARK_CONF_DIR/:$SPARK_HOME/jars/*"'
    line = " ".join(c if c.startswith(("$", '"')) or c in args else shlex.quote(c)
                    for c in cmd)
    defaults = "".join(f"{k} {v}\n" for k, v in conf.items())
    what = "master" if role == "head" else "worker"
    return "\n".join([
        'read -r SPARK_HOME SPARK_SCALA_VERSION < <("$PY" -c \'import glob, os, pyspark; '
        'h = os.path.dirname(pyspark.__file__); '
        'j = glob.glob(h + "/jars/spark-core_*.jar"); '
        'print(h, j[0].split("_", 1)[1].split("-", 1)[0] if j else "2.13")\')',
        '[ -d "${SPARK_HOME:-}/jars" ] || { echo "[cloudtik] pyspark has no Spark jars '
        'here"; exit 1; }',
        'export SPARK_HOME SPARK_SCALA_VERSION SPARK_CONF_DIR="$NODE_DIR/spark-conf" '
        'SPARK_LOCAL_DIRS="$NODE_DIR/work"',
        'mkdir -p "$SPARK_CONF_DIR" && printf %s ' + shlex.quote(defaults)
        + ' > "$SPARK_CONF_DIR/spark-defaults.conf"',
        f'echo "[cloudtik] $(date -u +%FT%T.%3NZ) starting spark {what}"',
        f'SPARK_LOCAL_IP="{local_ip}" nohup {line} >>"$NODE_DIR/node.log" 2>&1 &',
        'echo $! >> "$NODE_DIR/runtime.pid"',
        # the head's mutual-TLS relay in front of the master UI watches it
        *(['echo $! > "$NODE_DIR/spark.pid"'] if role == "head" else []),
    ])


def driver_log_path() -> Path:
    """Where the driver JVM of this process writes what it prints: the state folder's
    ``spark/driver-<pid>.log``, not the notebook (its warnings, stage progress bars and
    executor errors at shutdown are noise to a notebook's reader)."""
    # deferred: start-up (core.settings ~18 ms, loads traitlets, jupyter_core)
    from ..core.settings import default_settings

    folder = Path(default_settings().state_dir) / "spark"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder / f"driver-{os.getpid()}.log"


@contextlib.contextmanager
def jvm_output_to(path: Path) -> Iterator[None]:
    """File descriptors 1 and 2 point at ``path`` while the driver's JVM is started: the
    JVM inherits them (pyspark starts it without redirecting its output, and ipykernel
    forwards this process's descriptors into the notebook), then this process gets its
    own back.  Python-level output of other threads (sys.stdout of a kernel) is not a
    descriptor write and is unaffected."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        os.close(fd)
        for target, old in zip((1, 2), saved, strict=True):
            os.dup2(old, target)
            os.close(old)


def release_storage_mounts(state_dir: str | os.PathLike[str], cluster: str) -> int:
    """Unmount what is left of a cluster's storage mounts under the default root once its
    last node is gone.  rclone unmounts on SIGTERM, but one killed after the grace period
    (a loaded machine) leaves a dead FUSE mount behind.  Returns how many were removed."""
    root = os.path.normpath(str(Path(state_dir) / "spark-storage" / cluster)) + os.sep
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return 0
    points = [f[1].replace("\\040", " ") for f in (line.split() for line in lines)
              if len(f) >= 3 and f[2].startswith("fuse") and (f[1] + os.sep).startswith(root)]
    return sum(1 for mp in sorted(points, reverse=True) if unmount_path(mp, lazy=True))


def storage_root(spec: dict[str, Any], opts: dict[str, Any]) -> Path:
    """Where the cluster's storages are mounted on every node: ``runtime.spark.storage_root``
    or, by default, a folder of the cluster in the state folder (the local provider's nodes
    and the notebook's driver share the machine, so they all see the one path)."""
    if opts.get("storage_root"):
        return Path(opts["storage_root"])
    return Path(spec["state_dir"]) / "spark-storage" / spec["cluster"]


def mount_storages(spec: dict[str, Any],
                   opts: dict[str, Any]) -> tuple[list[subprocess.Popen], dict[str, str]]:
    """Mount the cluster's storages (``storage: {remotes: [...]}``: the node's rclone config
    has one remote per storage) read-only at ``<storage root>/NAME``, so Spark jobs read
    them as local paths, the same on the driver and every executor.

    A path that is already a mount point (another node of the cluster on this machine
    mounted it) is used as it is.  The ``rclone mount`` processes are children of the node
    (returned to be waited for and stopped with it; rclone unmounts on SIGTERM)."""
    names = [n for n in os.environ.get(envnames.STORAGES, "").split(",") if n]
    rclone, conf = os.environ.get(envnames.RCLONE), os.environ.get("RCLONE_CONFIG")
    if not names:
        return [], {}
    if not rclone or not conf:
        print("[cloudtik] storages are named but this node has no rclone config: "
              "they are not mounted", flush=True)
        return [], {}
    root = storage_root(spec, opts)
    procs: list[subprocess.Popen] = []
    paths: dict[str, str] = {}
    for name in names:
        path = root / name
        paths[name] = str(path)
        if os.path.ismount(path):
            continue
        path.mkdir(parents=True, exist_ok=True)
        # argv, never a shell: names are checked storage names, paths are ours
        cmd = [rclone, "mount", "--config", conf, "--read-only", "--dir-cache-time", "5s",
               f"{name}:", str(path)]
        print(f"[cloudtik] mounting storage {name} at {path}", flush=True)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        procs.append(proc)
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not os.path.ismount(path) and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        if not os.path.ismount(path):
            for p in procs:
                p.terminate()
            print(f"[cloudtik] could not mount storage {name} at {path} (rclone "
                  f"{'exited ' + str(proc.returncode) if proc.poll() is not None else 'hung'})"
                  "; is FUSE there (/dev/fuse, fusermount3 from Debian's fuse3)?", flush=True)
            raise SystemExit(MOUNT_FAILED_EXIT)
    return procs, paths


def start_connect_server(java: str, home: Path, conf_dir: Path, env: dict[str, str],
                         host: str, master_url: str,
                         memory: str) -> tuple[subprocess.Popen, str]:
    """A Spark Connect server beside the master (``runtime.spark.connect: true``): a driver
    application on the cluster that notebooks reach over gRPC, so they need no JVM.

    What ``sbin/start-connect-server.sh`` runs (``spark-submit --class
    org.apache.spark.sql.connect.service.SparkConnectServer``), from the connect jar of the
    pyspark distribution, started directly as a child of the head node like the master.
    Returns the process and the ``sc://host:port`` URL once the port accepts connections."""
    port = _free_port(host)
    args = ["--master", master_url, "--class", CONNECT_CLASS, "--name", CONNECT_APP_NAME,
            "--conf", f"spark.connect.grpc.binding.port={port}",
            "--conf", f"spark.connect.grpc.binding.address={host}",
            "--conf", f"spark.driver.host={host}", "--conf", f"spark.driver.bindAddress={host}",
            "spark-internal"]
    cmd = daemon_command(java, home, conf_dir, memory, SUBMIT_CLASS, args)
    print(f"[cloudtik] starting spark connect server: {' '.join(args)}", flush=True)
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return proc, f"sc://{host}:{port}"
        except OSError:
            time.sleep(0.2)
    proc.terminate()
    print(f"[cloudtik] the Spark Connect server did not listen on {host}:{port} within "
          f"{CONNECT_TIMEOUT:.0f} s", flush=True)
    raise SystemExit(CONNECT_FAILED_EXIT)


class SparkRuntime(Runtime):
    name = "spark"
    client_method = "spark"

    def release_local(self, state_dir: str | os.PathLike[str], cluster: str) -> None:
        """Dead FUSE mounts of the cluster's storages (``release_storage_mounts``)."""
        release_storage_mounts(state_dir, cluster)

    # config ------------------------------------------------------------------------------
    def validate(self, cfg: dict[str, Any]) -> None:
        if cfg.get("provider", {}).get("type") != "local":
            return  # remote nodes install Java and pyspark themselves
        if pyspark_version() is None:
            raise ConfigError(
                "runtime: the Spark runtime needs pyspark here: "
                "pip install 'jupyter_cloudtik[spark]'", field="runtime.types", value="spark")
        if java_binary() is None:
            raise ConfigError(f"runtime: {no_java_message()}", field="runtime.types",
                              value="spark")

    def node_config(self, cfg: dict[str, Any], role: str,
                    info: ConnectInfo | None) -> dict[str, Any]:
        opts = dict((cfg.get("runtime") or {}).get("spark") or {})
        out = {"version": opts.get("version") or pyspark_version(),
               "conf": dict(opts.get("conf") or {}),
               "daemon_memory": opts.get("daemon_memory") or DEFAULT_DAEMON_MEMORY,
               "connect": bool(opts.get("connect")),
               "connect_memory": opts.get("connect_memory") or DEFAULT_CONNECT_MEMORY}
        if opts.get("storage_root"):
            out["storage_root"] = str(opts["storage_root"])
        if info is not None:
            out["master_url"] = (info.extra.get("spark") or {}).get("master_url")
        return out

    # on a node --------------------------------------------------------------------------
    def start_local(self, spec: dict[str, Any]) -> list[subprocess.Popen]:
        runtime = spec.get("runtime") or {}
        opts = runtime.get("spark") or {}
        role = spec["role"]
        here = pyspark_version()
        wanted = opts.get("version")
        if wanted and here != wanted:
            print(f"[cloudtik] refusing to start Spark: this node has pyspark {here or 'none'}"
                  f", the client uses pyspark {wanted}; install pyspark=={wanted} on the "
                  "nodes (or the client's version)", flush=True)
            raise SystemExit(VERSION_MISMATCH_EXIT)
        java = java_binary()
        if java is None:
            print(f"[cloudtik] {no_java_message()}", flush=True)
            raise SystemExit(NO_JAVA_EXIT)
        home = spark_home()
        node_dir = Path(spec["node_dir"])
        host = spec.get("host") or "127.0.0.1"
        conf_dir = node_dir / "spark-conf"
        conf_dir.mkdir(exist_ok=True)
        conf = {**NODE_CONF, **(opts.get("conf") or {})}
        (conf_dir / "spark-defaults.conf").write_text(
            "".join(f"{k} {v}\n" for k, v in conf.items()))
        env = dict(os.environ, SPARK_HOME=str(home), SPARK_CONF_DIR=str(conf_dir),
                   SPARK_LOCAL_IP=host, SPARK_LOCAL_DIRS=str(node_dir / "work"),
                   # what load-spark-env.sh sets; executors' launcher needs it
                   SPARK_SCALA_VERSION=scala_version(home))
        memory = opts.get("daemon_memory") or DEFAULT_DAEMON_MEMORY
        mounts, paths = mount_storages(spec, opts)
        if role == "head":
            port, ui = _free_port(host), _free_port(host)
            args = ["--host", host, "--port", str(port), "--webui-port", str(ui)]
            cls = MASTER_CLASS
        else:
            res = runtime.get("resources") or {}
            cores = max(int(res.get("CPU") or 1), 1)
            mem_mb = max(int((res.get("memory") or 0) // 2**20), 1024)
            port = _free_port(host)
            args = ["--host", host, "--port", str(port), "--webui-port",
                    str(_free_port(host)), "--cores", str(cores), "--memory", f"{mem_mb}m",
                    "--work-dir", str(node_dir / "work"), opts["master_url"]]
            cls = WORKER_CLASS
        cmd = daemon_command(java, home, conf_dir, memory, cls, args)
        print(f"[cloudtik] starting spark {'master' if role == 'head' else 'worker'} "
              f"(pyspark {here}): {' '.join(cmd[-len(args) - 1:])}", flush=True)
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
        if role != "head":
            _write_json(node_dir / "runtime-spark.json",
                        {"worker_port": port, "host": host, "version": here})
            return [proc, *mounts]
        url = f"http://{host}:{ui}"
        while proc.poll() is None:  # the master answers its JSON: it is up
            try:
                http_json(f"{url}/json/", timeout=1)
                break
            except (RuntimeUnreachable, LookupError):
                time.sleep(0.05)
        children = [proc, *mounts]
        facts = {"master_url": f"spark://{host}:{port}", "ui": url, "version": here,
                 "started_at": time.time(), "storage": paths}
        if proc.poll() is None and opts.get("connect"):
            connect, facts["connect_url"] = start_connect_server(
                java, home, conf_dir, env, host, facts["master_url"],
                opts.get("connect_memory") or DEFAULT_CONNECT_MEMORY)
            children.append(connect)
        if proc.poll() is None:
            _write_json(node_dir / "runtime-spark.json", facts)
        return children

    # from the core ----------------------------------------------------------------------
    @staticmethod
    def _ui(info: ConnectInfo) -> str:
        ui = (info.extra.get("spark") or {}).get("ui")
        if not ui:
            raise LookupError("no Spark master UI in the connect info")
        return ui

    def _get(self, info: ConnectInfo, path: str) -> Any:
        """The master UI's JSON at ``path``: through the head's mutual-TLS relay when the
        provider recorded one and this process holds the cluster's client certificate
        (Huawei Cloud), else at the recorded UI address."""
        relay = (info.extra.get("spark") or {}).get("ui_tls_address")
        if relay and info.credentials:
            return http_json(relay + path, context=client_ssl_context(
                info.credentials, alpn=SPARK_UI_ALPN))
        return http_json(self._ui(info) + path)

    async def _state(self, info: ConnectInfo) -> dict[str, Any]:
        return await asyncio.to_thread(self._get, info, "/json/")

    async def connected_workers(self, info: ConnectInfo, prov: NodeProvider,
                                node_ids: list[str]) -> dict[str, str]:
        state = await self._state(info)
        alive = {(w.get("host"), int(w.get("port") or 0)): w["id"]
                 for w in state.get("workers") or () if w.get("state") == "ALIVE"}
        hosts = {h for h, _ in alive}
        out: dict[str, str] = {}
        for n in node_ids:
            facts = (await asyncio.to_thread(prov.node_info, n)).get("spark") or {}
            port = facts.get("worker_port")
            host = facts.get("host") or await asyncio.to_thread(prov.internal_ip, n)
            if port is not None and (host, int(port)) in alive:
                out[n] = alive[(host, int(port))]
            elif port is None and host in hosts:  # one worker per host (cloud nodes)
                out[n] = next(i for (h, _), i in alive.items() if h == host)
        return out

    async def idle_since(self, info: ConnectInfo) -> float | None:
        """No running application (the Connect server's own application aside: it runs
        as long as the cluster) and no running job of the Connect server, since the last
        application or Connect job ended (or the master started)."""
        state = await self._state(info)
        facts = info.extra.get("spark") or {}
        active = [a for a in state.get("activeapps") or () if isinstance(a, dict)]
        connect = [a for a in active
                   if facts.get("connect_url") and a.get("name") == CONNECT_APP_NAME]
        if len(active) > len(connect):
            return None
        ends = [(a.get("starttime", 0) + a.get("duration", 0)) / 1000
                for a in state.get("completedapps") or () if isinstance(a, dict)]
        for app in connect:
            jobs = await asyncio.to_thread(
                self._get, info, f"/proxy/{app['id']}/api/v1/applications/{app['id']}/jobs")
            if any(j.get("status") == "RUNNING" for j in jobs or ()):
                return None
            ends += [_spark_time(j.get("completionTime")) for j in jobs or ()]
        started = facts.get("started_at") or time.time()
        return max([started, *(e for e in ends if e)])

    async def observe(self, info: ConnectInfo) -> dict[str, Any]:
        s = await self._state(info)
        return {
            "master": s.get("url"), "ui": self._ui(info), "status": s.get("status"),
            "connect": (info.extra.get("spark") or {}).get("connect_url"),
            "alive_workers": s.get("aliveworkers"),
            "cores": s.get("cores"), "cores_used": s.get("coresused"),
            "memory_mb": s.get("memory"), "memory_used_mb": s.get("memoryused"),
            "running_applications": [
                {"id": a.get("id"), "name": a.get("name"), "cores": a.get("cores"),
                 "state": a.get("state")} for a in s.get("activeapps") or ()],
            "completed_applications": len(s.get("completedapps") or ()),
        }

    def client(self, info: ConnectInfo, app_name: str | None = None, **conf: Any) -> Any:
        """A ``SparkSession`` on the cluster (a driver in this process)."""
        facts = info.extra.get("spark") or {}
        master = facts.get("master_url")
        if not master:
            raise ConflictError("this cluster does not run Spark (runtime.types has no "
                                "'spark')", field="runtime")
        here = pyspark_version()
        if here is None:
            raise ConfigError("pyspark is not installed here: pip install "
                              "'jupyter_cloudtik[spark]'", field="runtime")
        if facts.get("version") and facts["version"] != here:
            raise ConflictError(
                f"the cluster runs pyspark {facts['version']} and this client has pyspark "
                f"{here}: install pyspark=={facts['version']} here", field="runtime")
        if facts.get("connect_url"):
            return self._connect_session(facts["connect_url"], conf)
        if java_binary() is None:
            raise ConfigError(f"runtime: {no_java_message()}", field="runtime")
        from pyspark.sql import SparkSession

        # a Spark Connect session made earlier in this process (another cluster) left
        # pyspark's process-wide switch on, which turns every later builder into a Connect
        # one ("CONNECT_URL_NOT_SET"): this one is asked for a classic driver
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        active = SparkSession.getActiveSession()
        if active is not None:
            try:
                same = active.sparkContext.master == master
            except Exception:  # a Connect session has no SparkContext here
                same = False
            if same:
                return active
            active.stop()  # a session on another (or a restarted) cluster
        # the local provider's nodes share this machine: the driver listens where the
        # master does; a cloud provider says None (the driver's own address, which the
        # executors on the nodes connect back to: the notebook must be in their network)
        host = facts.get("driver_host", master.split("//", 1)[1].rsplit(":", 1)[0])
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = SparkSession.builder.master(master).appName(app_name or "cloudtik")
        if host:
            builder = builder.config("spark.driver.host", host).config(
                "spark.driver.bindAddress", host)
        for k, v in conf.items():
            builder = builder.config(k, str(v))
        from pyspark import SparkContext

        if SparkContext._gateway is not None:  # the driver's JVM runs already
            return builder.getOrCreate()
        with jvm_output_to(driver_log_path()):
            return builder.getOrCreate()

    @staticmethod
    def _connect_session(url: str, conf: dict[str, Any]) -> Any:
        """A Spark Connect session (no JVM here) on the cluster's Connect server."""
        try:
            import grpc  # noqa: F401
            import pandas  # noqa: F401
            import pyarrow  # noqa: F401
        except ImportError as e:
            raise ConfigError(
                f"this cluster runs a Spark Connect server and its client needs "
                f"{e.name} here: pip install 'jupyter_cloudtik[spark]' (pyspark[connect])",
                field="runtime") from None
        # pyspark's Connect client reads ``sys.modules["__main__"].__spec__`` on import;
        # IPython's main module (a kernel's, or any InteractiveShell's) has none, and the
        # import fails with AttributeError: an interactive __main__'s spec is None
        main = sys.modules.get("__main__")
        if main is not None and not hasattr(main, "__spec__"):
            main.__spec__ = None
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        # a classic driver of this process (on another cluster: this one serves Connect)
        # makes pyspark refuse any Connect session ("SESSION_ALREADY_EXIST"); as for a
        # classic session on another cluster, it is stopped
        classic = SparkSession._instantiatedSession
        if classic is not None:
            classic.stop()
        elif SparkContext._active_spark_context is not None:
            SparkContext._active_spark_context.stop()
        builder = SparkSession.builder.remote(url)
        for k, v in conf.items():
            builder = builder.config(k, str(v))
        return builder.getOrCreate()
