"""Slurm with accounting (slurmdbd + MariaDB), as real sites run it: squeue forgets a job
``MinJobAge`` seconds after it ends, sacct does not.  A cluster of its own with the
smallest MinJobAge, so forgetting takes seconds, not five minutes."""

from __future__ import annotations

import pytest

from jupyter_cloudtik.hpc.commands import build_spec

from .conftest import wait_for


@pytest.fixture(scope="module")
def forgetful_slurm(tmp_path_factory):
    from cloudtik_emulators.slurm import SlurmCluster, missing_programs

    missing = missing_programs(accounting=True)
    if missing:
        pytest.skip(f"Slurm with accounting is not installed ({', '.join(missing)})")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm-forgetful"), min_job_age=2,
                           accounting=True).start()
    yield cluster
    cluster.stop()


def test_the_test_slurm_has_accounting(slurm):
    r = slurm.run("sacct", "-n", "-X", "-o", "JobID", check=False)
    assert r.returncode == 0, r.stderr
    assert "accounting_storage/slurmdbd" in slurm.conf.read_text()
    assert slurm.timings["total"] < 20, slurm.timings


def test_a_job_cancelled_outside_is_cancelled_after_squeue_forgets_it(
        make_client, forgetful_slurm, tmp_path):
    config = {"type": "slurm", "env": forgetful_slurm.env, "workdir": str(tmp_path / "jobs")}
    client = make_client({"s": config})
    info = client.submit(build_spec(command="sleep 120", time="5m"), "s")
    native = wait_for(lambda: (j := client.get(info.id)).state == "running" and j.native_id,
                      60, what="running")
    client.close()  # nobody watches while it ends and squeue forgets it
    forgetful_slurm.run("scancel", native)
    wait_for(lambda: not forgetful_slurm.run("squeue", "-h", "--states=all", "-j", native,
                                             check=False).stdout.strip(), 90,
             interval=0.5, what="squeue to forget the job")
    client2 = make_client({"s": config})
    job = wait_for(lambda: (j := client2.get(info.id)).state not in
                   ("running", "queued", "unknown") and j, 30, what="a final state")
    # only accounting knows: the script was killed before it could leave an exit code
    assert (job.state, job.native_state) == ("cancelled", "CANCELLED"), job
    token = client2.manager._row(info.id)["client_token"]
    # the comment (the client token) is kept in sacct too
    assert client2.manager.backend("s").find(token, info.id) == native
