"""The FirecREST v2 emulator's status routes (``/status/systems|partitions|userinfo``) and
its admin routes for Slurm (``/_emulator/slurm``) and the system's limits
(``/_emulator/system``).  Split from ``firecrest.py`` (issue 29).
"""

from __future__ import annotations

import time

from ._service import AdminHandler
from .firecrest_model import (
    COMMAND_TIMEOUT,
    MAX_PART_SIZE,
    OPS_SIZE_LIMIT,
    SCHEDULE_SECONDS,
    SLURM_DOWN,
    Handler,
)


class SlurmFaultHandler(AdminHandler):
    """POST /_emulator/slurm {"down": true}: slurmctld stops answering while FirecREST
    itself is up — its answers are then 500s with Slurm's "Unable to contact slurm
    controller", as the real server's are.  {"qos": {...}} sets the user's QOS limits
    (as ``--qos`` does), {"age": seconds} moves every finished job's end that far back
    (for the ``time_window`` of the job listing)."""

    def post(self, what: str = "") -> None:
        body = self.json_body() or {}
        if "down" in body:
            self.svc.slurm_down = bool(body["down"])
        if "age" in body:
            self.svc.age = float(body["age"] or 0)
        if "qos" in body:  # {"max_submit_jobs": n, "max_wall": seconds}; null: none
            self.svc.qos = dict(body["qos"] or {})
        self.reply({"ok": True})


class SystemConfigHandler(AdminHandler):
    """POST /_emulator/system {"max_ops_file_size": bytes, "command_timeout": seconds,
    "fs_delay": seconds, "schedule_delay": seconds}: the system's limits as a site
    configures them (null: the default), a slow file system, how long a new job waits for
    Slurm's scheduler (0: at once)."""

    def post(self, what: str = "") -> None:
        body = self.json_body() or {}
        svc = self.svc
        if "max_ops_file_size" in body:
            svc.ops_limit = int(body["max_ops_file_size"] or OPS_SIZE_LIMIT)
        if "command_timeout" in body:
            svc.command_timeout = float(body["command_timeout"] or COMMAND_TIMEOUT)
        if "fs_delay" in body:
            svc.fs_delay = float(body["fs_delay"] or 0)
        if "schedule_delay" in body:  # see firecrest.SCHEDULE_SECONDS
            value = body["schedule_delay"]
            svc.schedule_delay = SCHEDULE_SECONDS if value is None else float(value)
        self.reply({"ok": True})


class SystemsHandler(Handler):
    def get(self) -> None:
        s = self.svc
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        health = [{"serviceType": t, "lastChecked": now, "latency": 0.01, "healthy": True,
                   "message": None} for t in ("scheduler", "ssh", "filesystem")]
        health[2]["path"] = str(s.root)
        # S3DataTransfer is a CamelModel inside the snake-case DataOperation, and its
        # SecretStr fields (privateUrl, accessKeyId, secretAccessKey) are dumped masked;
        # multipart and bucketLifecycleConfiguration are plain BaseModels: snake case
        # inside (firecrest-v2 src/firecrest/config.py: S3DataTransfer, MultipartUpload,
        # BucketLifecycleConfiguration; seen beside the real server)
        transfer = {"serviceType": "s3", "name": "stage", "privateUrl": "**********",
                    "publicUrl": s.base_url, "accessKeyId": "**********",
                    "secretAccessKey": "**********", "region": "us-east-1", "ttl": 3600,
                    "tenant": None,
                    "multipart": {"use_split": False, "max_part_size": MAX_PART_SIZE,
                                  "parallel_runs": 3, "tmp_folder": "tmp"},
                    "bucketLifecycleConfiguration": {"days": 10}} if s.staging else None
        self.reply({"systems": [{
            "name": s.system,
            "ssh": {"host": "localhost", "port": 22, "proxyHost": None, "proxyPort": None,
                    "maxClients": 100, "timeout": {"connection": 5, "login": 5,
                                                   "commandExecution": s.command_timeout,
                                                   "idleTimeout": 60, "keepAlive": 5}},
            "scheduler": {"type": "slurm", "connectionMode": "ssh", "version": "22.05.8",
                          "apiUrl": None, "apiVersion": None, "timeout": 10},
            "servicesHealth": health,
            "probing": {"services": {}, "intervalCheck": 60}, "lastHealthCheck": now,
            "fileSystems": [{"path": str(s.root), "dataType": "scratch",
                             "defaultWorkDir": True}],
            # FirecREST leaves this one in snake case
            "dataOperation": {"datatransfer_jobs_directives": ["#SBATCH --nodes=1"],
                              "max_ops_file_size": s.ops_limit, "data_transfer": transfer},
        }]})


class PartitionsHandler(Handler):
    def get(self, system: str) -> None:
        if not self.system_ok(system):
            return
        if self.svc.slurm_down:
            msg, _ = SLURM_DOWN["partitions"]
            self.fail(500, msg, causedBy=[msg])
            return
        # scontrol's PartitionName, TotalCPUs, TotalNodes, State: no default, no MaxTime
        self.reply({"partitions": [
            {"name": k, "cpus": (v.get("cpus") or 1) * v.get("nodes", 1),
             "totalNodes": v.get("nodes", 1), "partition": v.get("state", "UP")}
            for k, v in self.svc.partitions.items()]})


class UserinfoHandler(Handler):
    def get(self, system: str) -> None:
        if not self.system_ok(system):
            return
        self.reply({"user": {"id": "1000", "name": self.user}, "group": {"id": "100",
                    "name": "users"}, "groups": [{"id": "100", "name": "users"}],
                    "accounts": self._accounts()})

    def _accounts(self) -> list[dict[str, object]] | None:
        """``sacctmgr show assoc`` of the user (firecrest-v2 sacctmgr_accounts.py): with
        associations (the emulator enforces them, see firecrest_model.INVALID_ACCOUNT)
        ``[{name, default}]`` (``default``: sacctmgr's DefaultAccount; slurm_cli_client.py,
        ``get_accounts``), in sacctmgr's order (the association tree's, by name here);
        none: null (seen beside the real server, ``AccountingStorageEnforce=
        associations``)."""
        svc = self.svc
        if not svc.accounts:
            return None
        names = sorted(svc.accounts)
        return [{"name": a, "default": a == svc.default_account} for a in names]
