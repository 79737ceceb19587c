"""A real dask-gateway-server (local backend) on loopback ports, for tests, benchmarks and
trying the dask-gateway provider without a gateway of your own.

``GatewayServer(folder).start()`` writes a config (basic auth with one shared password,
the unsafe local backend that runs schedulers and workers as this user) and starts
``dask-gateway-server``; ``stop()`` ends it and every process it started.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from jupyter_cloudtik.core import ports
from jupyter_cloudtik.core.process_groups import (
    GroupRef,
    signal_child,
    signal_group,
    writes_under,
)

CONFIG = """
import os, sys
c.DaskGateway.backend_class = "dask_gateway_server.backends.local.UnsafeLocalBackend"
c.DaskGateway.authenticator_class = "dask_gateway_server.auth.SimpleAuthenticator"
c.SimpleAuthenticator.password = {password!r}
c.DaskGateway.address = "127.0.0.1:{api_port}"
c.Proxy.address = "127.0.0.1:{proxy_port}"
c.DaskGateway.log_level = "WARN"
bindir = os.path.dirname(sys.executable)
c.ClusterConfig.scheduler_cmd = [os.path.join(bindir, "dask"), "scheduler"]
c.ClusterConfig.worker_cmd = [os.path.join(bindir, "dask"), "worker"]
c.ClusterConfig.worker_cores = 1
c.ClusterConfig.worker_memory = "1 G"
c.LocalClusterConfig.local_directory = {workdir!r}
c.DaskGateway.cluster_manager_options = None
# the options a site's gateway typically offers (the docs' cluster_options use them)
from dask_gateway_server.options import Float, Integer, Options
c.Backend.cluster_options = Options(
    Integer("worker_cores", default=1, min=1, max=4, label="Worker cores"),
    Float("worker_memory", default=1, min=0.25, max=8, label="Worker memory (GiB)"),
    handler=lambda o: {{"worker_cores": o.worker_cores,
                        "worker_memory": int(o.worker_memory * 2**30)}})
"""


def _free_port() -> int:
    return ports.free_port()


class GatewayServer:
    def __init__(self, root: Path, password: str = "gw-secret") -> None:
        self.root = root
        self.password = password
        self.api_port, self.proxy_port = _free_port(), _free_port()
        self.address = f"http://127.0.0.1:{self.proxy_port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> GatewayServer:
        (self.root / "work").mkdir(parents=True, exist_ok=True)
        cfg = self.root / "gateway_config.py"
        cfg.write_text(CONFIG.format(password=self.password, api_port=self.api_port,
                                     proxy_port=self.proxy_port,
                                     workdir=str(self.root / "work")))
        server = Path(sys.executable).parent / "dask-gateway-server"
        with open(self.root / "gateway.log", "wb") as log:
            self.proc = subprocess.Popen([str(server), "-f", str(cfg)], stdout=log,
                                         stderr=subprocess.STDOUT, cwd=self.root,
                                         start_new_session=True, env=dict(os.environ))
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.address}/api/health", timeout=1)
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("dask-gateway-server did not start: "
                                       + (self.root / "gateway.log").read_text()[-2000:]
                                       ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is None:
            return
        import signal

        ref = GroupRef.of(self.proc.pid) if self.proc.poll() is None else \
            GroupRef(self.proc.pid, None)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            signal_child(self.proc, signal.SIGKILL)
            self.proc.wait()
        # the local backend's schedulers and workers are in the server's session: what of
        # it logs to our folder (the number itself may be somebody else's once reaped)
        signal_group(ref, signal.SIGKILL, writes_under(self.root))
