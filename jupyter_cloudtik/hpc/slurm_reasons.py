"""Slurm's pending reasons: which mean "never", which are only a first answer.

A backend that sees Slurm only through an API (FirecREST) cannot ask Slurm why a job
waits beyond its reason code, so the reading of each code lives here, with where in
Slurm's source (or squeue(1)) it comes from.  A job Slurm will never start is cancelled
and failed by the backend instead of waiting for ever; a provisional reason keeps it
queued, shown as such, until Slurm settles.
"""

from __future__ import annotations

# pending reasons for which Slurm will never start the job (the request exceeds what the
# partition, account or QOS allows; squeue(1) "JOB REASON CODES", Slurm 22.05);
# FirecREST cannot tell before submitting
NEVER_STARTS = {
    "PartitionTimeLimit": "the time limit is longer than the partition allows",
    "BadConstraints": "no node has the requested features",
    "DependencyNeverSatisfied": "a job it depends on will never end as asked",
    "InvalidAccount": "the account is not valid",
    "InvalidQOS": "the QOS is not valid",
    "AssocMaxWallDurationPerJobLimit": "the time limit is longer than the account allows",
    "QOSMaxWallDurationPerJobLimit": "the time limit is longer than the QOS allows",
    "AssocMaxNodesPerJobLimit": "more nodes than the account allows",
    "QOSMaxNodePerJobLimit": "more nodes than the QOS allows",
    "AssocMaxCpuPerJobLimit": "more CPUs than the account allows",
    "QOSMaxCpuPerJobLimit": "more CPUs than the QOS allows",
}
# the reasons about the job's time limit: their message names it
TIME_REASONS = ("PartitionTimeLimit", "AssocMaxWallDurationPerJobLimit",
                "QOSMaxWallDurationPerJobLimit")
# pending reasons that are not final: the real server answered PartitionConfig first for
# a job over the partition's time limit and PartitionTimeLimit a moment later (issue 29's
# outside check).  In Slurm's source the first is the submit's answer (job_mgr.c,
# _select_nodes_parts: ESLURM_REQUESTED_PART_CONFIG_UNAVAILABLE -> WAIT_PART_CONFIG), the
# second the scheduler's (job_scheduler.c, _job_runnable_test2 -> job_limits_check).
# PartitionNodeLimit "can also indicate that required nodes are DOWN or DRAINED"
# (squeue(1)).  Such a job stays queued, its reason shown as provisional
PROVISIONAL = {
    "PartitionConfig": "the partition may not fit the job's nodes, CPUs or memory",
    "PartitionNodeLimit": "more nodes than the partition has up now",
}
# ...but a PartitionConfig still there after the scheduler's passes is job_limits_check's
# own answer: _part_access_check refused the job for something no pass changes (more CPUs
# than the partition has — "FIXME: NON_EXISTANT_WAIT_PART_CPU_LIMIT" there —, an account,
# QOS or group the partition does not allow).  Slurm's main scheduler runs at least every
# sched_interval (60 s by default); after ``settle_time`` (default three such passes) the
# reason counts as final
SETTLES = {
    "PartitionConfig": "the partition cannot take the job as asked: more CPUs than it has, "
                       "or an account, QOS or group it does not allow",
}
SETTLE_TIME = 180.0
