"""Refusing, before anything is queued, what Slurm would refuse or never run: the
partition's state and time limit, a job bigger than the largest node (it would pend
forever), unknown accounts and QOS (``sacctmgr`` when accounting runs), and the real
job scripts through ``sbatch --test-only``, whose refusal is quoted.  Every refusal
names the provider field.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import ConfigError
from ..core.units import format_bytes, parse_bytes, parse_duration
from .base import NODE_KIND_HEAD, NODE_KIND_WORKER

# which provider field a refusal of ``sbatch --test-only`` is about (Slurm's own words)
REFUSAL_FIELDS = (("partition", "partition"), ("account", "account"), ("qos", "qos"),
                  ("time limit", "walltime"), ("node configuration", "cores"),
                  ("memory", "memory"), ("gres", "gpus"))


class SlurmChecks:
    """The up-front check of a cluster's config against Slurm (a part of
    ``SlurmNodeProvider``)."""

    def check(self, cfg: dict[str, Any] | None = None) -> None:
        """Refuse, naming the field, what Slurm would refuse or never run; queue nothing."""
        if self._checked:
            return
        self._checking = True
        try:
            if self._sinfo is None:  # both round trips at once; sinfo's error comes first
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(2) as pool:
                    asks = [pool.submit(self._partitions), pool.submit(self._all_nodes)]
                for f in asks:
                    f.result()
            self._check(cfg)
        finally:
            self._checking = False
        self._checked = True

    def _check(self, cfg: dict[str, Any] | None) -> None:
        p = self.provider_config
        part = self.partition()
        if part["avail"] != "up":
            raise ConfigError(f"provider.partition: partition '{part['name']}' is "
                              f"{part['avail']} (sinfo)", field="provider.partition")
        walltime = p.get("walltime")
        if walltime:
            seconds = parse_duration(walltime, field="provider.walltime")
            limit = part["time_limit"]
            if limit not in ("infinite", "UNLIMITED", "n/a"):
                max_s = parse_duration(limit, field="provider.walltime")
                if seconds and max_s and seconds > max_s:
                    raise ConfigError(
                        f"provider.walltime: {walltime} is over the time limit of partition "
                        f"'{part['name']}' (sinfo TIMELIMIT {limit})",
                        field="provider.walltime", value=walltime)
        # one job must fit on one node of the partition, or Slurm keeps it pending forever
        self._check_fit(cfg, part)
        # Slurm's own answers, asked at once (each is a round trip to slurmctld/slurmdbd)
        asks: list[tuple[str, str, list[str], bytes | None]] = []
        for key, what in (("account", "account"), ("qos", "qos")):
            if p.get(key):
                fmt = "Account" if key == "account" else "Name"
                asks.append((key, what, ["sacctmgr", "-n", "-P", "show", what,
                                         f"format={fmt}"], None))
        # over SSH the session's environment on the system: refused here if it cannot be
        # had (a Python of another version, a wheel for another platform), then staged
        self.prepare_environment((cfg or {}).get("runtime"))
        # the real job scripts, through sbatch --test-only (nothing is queued)
        asks.append(("worker", "sbatch", ["sbatch", "--test-only",
                                          f"--job-name={self._job_name('worker')}"],
                     self.job_script(NODE_KIND_WORKER, self._resources(cfg, "worker"),
                                     {"scheduler_address": "tcp://127.0.0.1:1"}).encode()))
        if self.mode == "job":
            asks.append(("head", "sbatch", ["sbatch", "--test-only",
                                            f"--job-name={self._job_name('head')}"],
                         self.job_script(NODE_KIND_HEAD, self._resources(cfg, "head"),
                                         {}).encode()))
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(asks)) as pool:
            answers = list(pool.map(lambda a: self._run(a[2], a[2][0], input=a[3]), asks))
        for (key, what, _argv, _input), r in zip(asks, answers, strict=True):
            if what == "sbatch":
                if r.rc != 0:
                    answer = r.message.strip()
                    low = answer.lower()
                    fld = next((f for word, f in REFUSAL_FIELDS if word in low),
                               "job_extra_directives")
                    raise ConfigError(f"provider.{fld}: sbatch refused the {key} job script: "
                                      f"{answer}", field=f"provider.{fld}")
                continue
            value = p[key]
            if r.rc == 0:  # accounting runs: it is the list of what exists
                known = sorted({x.strip() for x in r.stdout.splitlines() if x.strip()})
                if value not in known:
                    raise ConfigError(
                        f"provider.{key}: '{value}' is not a{'n' if key == 'account' else ''} "
                        f"{what} Slurm knows (sacctmgr show {what}: {', '.join(known)})",
                        field=f"provider.{key}", value=value)

    def _check_fit(self, cfg: dict[str, Any] | None, part: dict[str, str]) -> None:
        nodes = self.nodes()
        res = self._resources(cfg, "worker")
        # deferred: start-up (transport.slurm ~23 ms, loads asyncio)
        from ..transport.slurm import slurm_int

        cpus = max((c for n in nodes if (c := slurm_int(n.get("CPUTot"))) is not None),
                   default=None)
        if cpus is not None and int(res.get("CPU") or 1) > cpus:
            raise ConfigError(
                f"provider.cores: {res.get('CPU')} cores per worker job; the largest node of "
                f"partition '{part['name']}' has {cpus} (scontrol show node CPUTot)",
                field="provider.cores", value=res.get("CPU"))
        mem = max((m for n in nodes if (m := slurm_int(n.get("RealMemory"))) is not None),
                  default=None)
        if mem is not None and self.job_memory(res) > mem * 2**20:
            raise ConfigError(
                f"provider.memory: {format_bytes(self.job_memory(res))} per worker job; the "
                f"largest node of partition '{part['name']}' has {mem} MB (scontrol show "
                "node RealMemory)", field="provider.memory",
                value=self.provider_config.get("memory"))

    def _resources(self, cfg: dict[str, Any] | None, type_name: str) -> dict[str, Any]:
        if cfg:
            head = cfg.get("head_node_type", "head")
            types = cfg.get("available_node_types") or {}
            if type_name == "worker":
                names = [t for t in types if t != head]
                if names:
                    return types[names[0]].get("resources") or {}
            elif head in types:
                return types[head].get("resources") or {}
        res = self.fill_resources(self.provider_config,
                                  self.default_node_types(self.provider_config)[type_name])
        res["memory"] = parse_bytes(res["memory"], field="provider.memory") if res.get(
            "memory") else 0
        return res

    def bootstrap_config(self, cluster_config: dict[str, Any]) -> dict[str, Any]:
        self.check(cluster_config)
        return cluster_config
