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
import time
from pathlib import Path
from typing import Any

from ...core.env import scrub_environment  # noqa: F401  (kept importable from here)
from .processes import CLUSTER_ENV, NODE_ID_ENV, STATE_DIR_ENV

SETUP_FAILED_EXIT = 3
CANCELLED_EXIT = 4
#: written by ``terminate_nodes`` into a node folder: a launch still in flight must not start
CANCELLED_MARK = "cancelled"
#: a worker's scheduler address in its argv until the node reads it from its head's
#: scheduler file (the worker may be forked before the head's scheduler listens)
SCHEDULER_FROM_HEAD = "{scheduler of the head}"
#: how long a worker waits for its head's scheduler file (Dask's own --death-timeout)
HEAD_WAIT_SECONDS = 60.0

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
    # The log fd above is what marks this process as the node's (processes.py).  Checking
    # the mark only now closes the race with a terminate that came while the launch was in
    # flight: it writes the mark and then looks for marked processes, so either it finds
    # this one or this one sees the mark.
    if (node_dir / CANCELLED_MARK).exists():
        print("[cloudtik] node was terminated before it started", flush=True)
        os._exit(CANCELLED_EXIT)
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
    """Run the runtimes of this node until they end; returns the exit code.

    Runtimes other than Dask (Spark) start their processes as children first; Dask runs
    in this process (forked from the launcher with Dask preloaded)."""
    import dask

    dask.config.refresh()  # the environment changed since Dask was imported (fork)
    run_setup_commands(spec.get("setup_commands") or [])
    types = spec.get("runtimes") or ["dask"]
    children = []
    if types != ["dask"]:
        # deferred: start-up (runtime.base ~25 ms, loads urllib.request, importlib.metadata)
        from ...runtime.base import runtime_class

        for t in types:
            proc = runtime_class(t)().start_local(spec) if t != "dask" else None
            if isinstance(proc, list):
                children.extend(proc)
            elif proc is not None:
                children.append(proc)
    if "dask" not in types:
        return _wait_children(children)
    role = spec["role"]
    argv = list(spec["argv"])
    if SCHEDULER_FROM_HEAD in argv:
        argv[argv.index(SCHEDULER_FROM_HEAD)] = scheduler_of_head(spec["head"])
    if role == "head":
        from distributed.cli import dask_scheduler as cli
    else:
        from distributed.cli import dask_worker as cli
    print(f"[cloudtik] starting dask {'scheduler' if role == 'head' else 'worker'}: "
          f"{' '.join(argv)}", flush=True)
    try:
        cli.main(args=argv, prog_name=f"dask {role}", standalone_mode=True)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def scheduler_of_head(head: dict[str, Any]) -> str:
    """The address in the head's scheduler file, once its scheduler listens (polled often:
    Dask's own ``--scheduler-file`` looks every 0.1 s); an exit if the head ends first."""
    node_dir = Path(head["node_dir"])
    deadline = time.monotonic() + HEAD_WAIT_SECONDS
    while True:
        try:
            address = json.loads((node_dir / "scheduler.json").read_text())["address"]
            break
        except (OSError, ValueError, KeyError):
            pass
        if (node_dir / "exitcode").exists():
            print(f"[cloudtik] the head node {node_dir.name} ended before its scheduler was "
                  "up; this worker stops", flush=True)
            raise SystemExit(1)
        if time.monotonic() > deadline:
            print(f"[cloudtik] the head node {node_dir.name} wrote no scheduler file within "
                  f"{HEAD_WAIT_SECONDS:.0f} s; this worker stops", flush=True)
            raise SystemExit(1)
        time.sleep(0.005)
    if head.get("host"):  # the scheduler binds every interface: its address names none
        scheme, rest = address.split("://", 1)
        address = f"{scheme}://{head['host']}:{rest.rsplit(':', 1)[1]}"
    return address


def _wait_children(children: list[subprocess.Popen]) -> int:
    """The node lives as long as all of its runtime's processes (the first that ends ends
    it); stopping it (SIGTERM to its group) waits for them, so none is left behind as an
    orphan."""
    import signal

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    code = 0
    try:
        # the first to end ends the node (a dead JVM must not be hidden by a live mount)
        while children and all(proc.poll() is None for proc in children):
            time.sleep(0.2)
        code = next((p.returncode for p in children if p.returncode is not None), 0)
    finally:
        for proc in children:
            if proc.poll() is None:
                proc.terminate()
        for proc in children:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return code


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
