"""What the Slurm provider reads from Slurm's own commands (``squeue``, ``sacct``,
``sinfo``, ``scontrol show node``) and the job comment that carries a node's tags.

Pure functions of text, so the fuzzer (``fuzz/fuzz_slurm.py``) runs them without a
Slurm: odd lines are skipped, never an exception.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from .base import TAG_CLUSTER_NAME, TAG_LAUNCH_CONFIG, TAG_NODE_KIND, TAG_NODE_TYPE

COMMENT_PREFIX = "cloudtik/v1?"
# squeue lists a job in these states; all but COMPLETING are a node that is (or will be) there
ALIVE = {"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
         "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "STOPPED"}
SQUEUE_FORMAT = "%i|%T|%N|%M|%l|%r|%k"


def encode_comment(ns: str, tags: dict[str, str]) -> str:
    short = {"ns": ns, "cluster": tags.get(TAG_CLUSTER_NAME, ""),
             "kind": tags.get(TAG_NODE_KIND, ""), "type": tags.get(TAG_NODE_TYPE, ""),
             "launch": tags.get(TAG_LAUNCH_CONFIG, "")}
    return COMMENT_PREFIX + urllib.parse.urlencode(short)


def decode_comment(comment: str) -> dict[str, str] | None:
    comment = comment.strip()
    if not comment.startswith(COMMENT_PREFIX):
        return None
    q = dict(urllib.parse.parse_qsl(comment[len(COMMENT_PREFIX):], keep_blank_values=True))
    return {"ns": q.get("ns", ""), TAG_CLUSTER_NAME: q.get("cluster", ""),
            TAG_NODE_KIND: q.get("kind", ""), TAG_NODE_TYPE: q.get("type", ""),
            TAG_LAUNCH_CONFIG: q.get("launch", "")}


def parse_squeue_jobs(stdout: str, ns: str, cluster_name: str) -> dict[str, dict[str, Any]]:
    """``squeue -h -o SQUEUE_FORMAT`` lines of the jobs of cluster ``cluster_name`` in
    namespace ``ns`` (their comment says so): job id -> state, node, elapsed, limit, reason,
    tags."""
    out: dict[str, dict[str, Any]] = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|", 6)
        if len(parts) < 7:
            continue
        tags = decode_comment(parts[6])
        if not tags or tags["ns"] != ns or tags[TAG_CLUSTER_NAME] != cluster_name:
            continue
        out[parts[0]] = {"state": parts[1], "node": parts[2], "elapsed": parts[3],
                         "time_limit": parts[4], "reason": parts[5], "tags": tags}
    return out


def parse_sacct_job(stdout: str, job_id: str) -> dict[str, str]:
    """``sacct -X -n -P -o JobID,State,ExitCode,Elapsed,Timelimit,NodeList`` of one job."""
    for line in stdout.splitlines():
        f = line.split("|")
        if len(f) >= 6 and f[0] == job_id:
            return {"state": f[1], "exit_code": f[2], "elapsed": f[3],
                    "time_limit": f[4], "node": f[5]}
    return {}


def parse_sinfo(stdout: str) -> list[dict[str, Any]]:
    """``sinfo -h -o %P|%a|%l|%D|%C|%N|%m`` lines: one row per partition."""
    rows = []
    for line in stdout.splitlines():
        f = line.strip().split("|")
        if len(f) >= 7:
            rows.append({"name": f[0].rstrip("*"), "default": f[0].endswith("*"),
                         "avail": f[1], "time_limit": f[2], "nodes": f[3],
                         "cpus": f[4], "nodelist": f[5], "memory": f[6]})
    return rows


def sinfo_cpus(text: str) -> tuple[int, int, int, int] | None:
    """sinfo's ``%C``: allocated/idle/other/total CPUs, or None for another shape."""
    # deferred: start-up (transport.slurm ~22 ms, loads asyncio)
    from ..transport.slurm import slurm_int

    counts = [slurm_int(x) for x in text.split("/")]
    if len(counts) != 4 or None in counts:
        return None
    return counts[0], counts[1], counts[2], counts[3]  # type: ignore[return-value]


def free_memory(nodes: list[dict[str, str]]) -> int:
    """Bytes not allocated on the idle or partly used nodes of ``scontrol show node -o``."""
    # deferred: start-up (transport.slurm ~22 ms, loads asyncio)
    from ..transport.slurm import slurm_int

    free = 0
    for n in nodes:
        real = slurm_int(n.get("RealMemory"))
        if real is not None and n.get("State", "").split("+")[0] in ("IDLE", "MIXED"):
            free += max(real - (slurm_int(n.get("AllocMem")) or 0), 0) * 2**20
    return free


def memory_per_core(nodes: list[dict[str, str]]) -> int | None:
    """The smallest memory per core of ``scontrol show node -o`` rows (None: none says)."""
    # deferred: start-up (transport.slurm ~22 ms, loads asyncio)
    from ..transport.slurm import slurm_int

    shares = [mem * 2**20 // max(slurm_int(n.get("CPUTot")) or 1, 1)
              for n in nodes if (mem := slurm_int(n.get("RealMemory"))) is not None]
    return min(shares) if shares else None
