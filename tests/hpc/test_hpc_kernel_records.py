"""The kernels' records when the next server cannot end a killed server's kernel job
(hpc/kernels/records.py): the job is never reported as ended unless it is known to be.
(The job ended for real is test_hpc_docs_kernels::test_the_next_server_ends_and_reports_
the_kernels_of_a_killed_one, on the real Slurm.)"""

from __future__ import annotations

import logging
import subprocess
import sys

from jupyter_cloudtik.core.secrets import SecretStore
from jupyter_cloudtik.core.settings import CloudTik
from jupyter_cloudtik.core.store import Store
from jupyter_cloudtik.hpc.kernels.records import KernelRecords, end_orphans
from jupyter_cloudtik.hpc.settings import HPC, BackendRegistry


def _gone_pid() -> int:
    """The pid of a process that has exited."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _registry(tmp_path, backends):
    settings = CloudTik(state_dir=str(tmp_path / "state"))
    store = Store(settings.state_dir)
    return BackendRegistry(HPC(backends=backends), store.state_dir, SecretStore(store),
                           logging.getLogger("test"), settings), store


def _controller_gone(tmp_path) -> str:
    """A slurm.conf whose controller does not listen (port 9), answering at once."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=gone\nSlurmctldHost=localhost\nSlurmctldPort=9\n"
                    "AuthType=auth/none\nMessageTimeout=1\nTCPTimeout=1\n"
                    "NodeName=localhost CPUs=1\nPartitionName=debug Nodes=localhost\n")
    return str(conf)


def test_a_job_that_cannot_be_ended_is_said_and_never_reported_as_ended(tmp_path, caplog):
    # daint's controller does not answer; cscs is no longer configured
    registry, store = _registry(tmp_path, {"daint": {
        "type": "slurm", "env": {"SLURM_CONF": _controller_gone(tmp_path)},
        "workdir": str(tmp_path / "jobs")}})
    records = KernelRecords(store)
    for kid, backend in (("k-daint", "daint"), ("k-cscs", "cscs")):
        records.started(kid, backend=backend, profile="debug", job_id=f"kernel-{kid}",
                        native_id="4242")
    # both were started by a server that is gone
    store.execute("UPDATE hpc_kernels SET owner_pid = ?, owner_started = 1.0", (_gone_pid(),))
    assert {r["id"] for r in records.orphans()} == {"k-daint", "k-cscs"}

    with caplog.at_level(logging.WARNING):
        unresolved = end_orphans(records, registry, logging.getLogger("test"),
                                 unresolved_only=True)
    said = " ".join(caplog.messages)
    # the one whose backend does not answer is tried again soon; the other by a next server
    assert len(unresolved) == 1 and unresolved[0].startswith("HPC kernel k-daint: "), unresolved
    assert "job 4242 on daint cannot be ended now" in unresolved[0]
    assert "tried again in a minute and when a server starts" in unresolved[0]
    assert ("HPC kernel k-cscs: the server that started it" in said and "job 4242 on cscs "
            "cannot be ended now" in said and "(tried again when a server starts)" in said), said
    # neither is reported as ended, and both are still there to be ended
    assert records.reported() == []
    assert {r["id"] for r in records.orphans()} == {"k-daint", "k-cscs"}


def test_a_live_servers_kernels_are_not_orphans(tmp_path):
    _, store = _registry(tmp_path, {})
    records = KernelRecords(store)
    records.started("mine", backend="daint", profile="debug", job_id="kernel-mine",
                    native_id="1")
    assert records.orphans() == []
    records.forget("mine")
    assert store.query("SELECT id FROM hpc_kernels") == []


def test_a_server_killed_while_submitting_is_reported_with_the_jobs_folder(tmp_path):
    """The row is written before sbatch; a server killed before sbatch's answer leaves no
    job id: the report says so and names the folder a job of it would run in."""
    registry, store = _registry(tmp_path, {"daint": {
        "type": "slurm", "env": {"SLURM_CONF": _controller_gone(tmp_path)},
        "workdir": str(tmp_path / "jobs")}})
    records = KernelRecords(store)
    records.started("k-mid", backend="daint", profile="debug", job_id="kernel-mid",
                    native_id=None)
    store.execute("UPDATE hpc_kernels SET owner_pid = ?, owner_started = 1.0", (_gone_pid(),))
    said = end_orphans(records, registry, logging.getLogger("test"))
    (line,) = said
    folder = registry.get("daint").folder("kernel-mid")
    assert "stopped while submitting its job to daint; no job id was recorded" in line, line
    assert f"(a job running in {folder} would be it)" in line, line
    (reported,) = records.reported()
    assert reported["id"] == "k-mid" and reported["job"] is None and reported["orphaned"]
