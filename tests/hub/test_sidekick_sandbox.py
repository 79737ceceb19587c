"""A side-kick runs what a user asks of it where no credential is (issue 26, critical).

The job gateway runs alice's jobs on its ``local`` backend.  Without a sandbox that meant
as the sidekick's account, next to its state folder: ``cat <state>/secret.key`` and every
catalogue secret was hers.  Here a real supervisor (with a real secret store in its state
folder, a catalogue secret in its own environment, bob's side-kick running beside alice's)
starts the real job gateway in the real bubblewrap sandbox, and alice's job tries what an
attacker would: the key, the database, the supervisor's and other processes' environments,
bob's side-kick's folder and log.  Nothing of them may reach her job's output.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from jupyter_cloudtik.core.sandbox import Sandbox
from jupyter_cloudtik.core.secrets import SecretStore
from jupyter_cloudtik.core.store import Store
from jupyter_cloudtik.hub.sidekicks import SidekickSpec
from tests.hub.test_sidekicks import base_url, http, service_spec, supervised

SERVICE_CANARY = "service-env-canary-5e1f0c"  # a catalogue secret read from the service env
GATEWAY_SECRET = "gateway-admin-secret-93ab1d"  # the side-kick's own credential (admin's)
BOB_SECRET = "bob-sidekick-secret-c4d2e7"
DB_SECRET = "a-storage-password-in-the-db"

ATTACK = r"""
set +e
echo "uid=$(id -u)"
cat {state}/secret.key
cat {state}/state.db | tr -c '[:print:]' '.'
ls -laR {state}
cat {root}/sidekicks/bob/echo.log
ls -la {root}/sidekicks/bob/echo
for p in /proc/[0-9]*; do tr '\0' ' ' < $p/environ; tr '\0' ' ' < $p/cmdline; echo; done
env
echo ATTACK-DONE
"""


def _job_log(url, headers, job_id):
    async def main():
        deadline = time.monotonic() + 60
        while True:
            status, job = await http("GET", f"{url}/jobs/{job_id}?refresh=1", headers=headers)
            assert status == 200, job
            if job["state"] in ("succeeded", "failed", "cancelled"):
                break
            assert time.monotonic() < deadline, job
            await asyncio.sleep(0.2)
        status, logs = await http("GET", f"{url}/jobs/{job_id}/logs", headers=headers)
        assert status == 200, logs
        return job, logs["text"]
    return main()


def test_a_users_job_in_the_job_gateway_reads_no_credential(tmp_path, sklog, monkeypatch):
    state = tmp_path / "state"
    store = Store(state)
    SecretStore(store).put("hub:storage:physics-data", "secret_access_key", DB_SECRET)
    key = (state / "secret.key").read_text().strip()
    monkeypatch.setenv("HWC_SK", SERVICE_CANARY)  # as docs/hub.md's catalogue file has it
    gateway = SidekickSpec.from_dict({
        "name": "jobgw", "entry_point": "jupyter_cloudtik.hub.job_gateway",
        "health_interval": 0.2, "startup_timeout": 40,
        "env": {"CLOUDTIK_JOB_GATEWAY_BACKEND": "local", "ARC_TOKEN": {"secret": "arc"}}})
    echo = service_spec("echo", env={"MY_SECRET": {"secret": "b"}})
    sandbox = Sandbox(hidden=(str(state.resolve()),))
    forbidden = [key, DB_SECRET, SERVICE_CANARY, GATEWAY_SECRET, BOB_SECRET]

    async def main():
        async with supervised(state / "hub", sklog, sandbox=sandbox,
                              allow_local_execution=True) as sup:
            await sup.start("bob", echo, secret_resolver=lambda ref: BOB_SECRET)
            await sup.start("alice", gateway, secret_resolver=lambda ref: GATEWAY_SECRET)
            url, headers = base_url(sup, "alice", "jobgw")
            script = ATTACK.format(state=state, root=state / "hub")
            status, job = await http("POST", f"{url}/jobs", {"script": script}, headers)
            assert status == 201, job
            job, text = await _job_log(url, headers, job["id"])
            assert "ATTACK-DONE" in text, text[-2000:]
            for value in forbidden:
                assert value not in text, (value, text[-3000:])
            if os.geteuid() == 0:  # the sandbox's own account, not the service's
                assert "uid=65534" in text, text[:500]
            # the side-kick's own log and info do not carry its secrets either
            for value in forbidden:
                assert value not in await sup.logs("alice", "jobgw", 500)

    asyncio.run(main())


def test_on_a_hub_that_does_not_allow_it_the_gateway_offers_no_local_backend(tmp_path, sklog):
    gateway = SidekickSpec.from_dict({
        "name": "jobgw", "entry_point": "jupyter_cloudtik.hub.job_gateway",
        "health_interval": 0.2, "startup_timeout": 40})

    async def main():
        async with supervised(tmp_path / "hub", sklog) as sup:
            await sup.start("alice", gateway)
            url, headers = base_url(sup, "alice", "jobgw")
            for body in ({"command": [sys.executable, "-c", "print(1)"]},
                         {"script": "id", "backend": "local"},
                         {"script": "id", "backend": "dask"},
                         {"script": "id", "backend": "dask:anything"}):
                status, err = await http("POST", f"{url}/jobs", body, headers)
                assert status == 403 and err["field"] == "backend", (body, err)
                assert "allow_local_execution" in err["message"], err
            status, listing = await http("GET", f"{url}/backends", headers=headers)
            assert status == 200
            local = [b for b in listing["backends"] if b["name"] == "local"]
            assert local and local[0]["available"] is False, listing
            status, jobs = await http("GET", f"{url}/jobs", headers=headers)
            assert status == 200 and jobs["jobs"] == []  # nothing ran

    asyncio.run(main())
