"""A hub sidekick SIGKILLed at random moments: the job gateway (``hub/job_gateway.py``, the
local HPC backend) under the real sidekick supervisor, while jobs are submitted through it.
The supervisor starts it again; every job answered to us is there exactly once and ends with
its result — or, if it was running in the side-kick's sandbox when the side-kick was killed
(the sandbox and what runs in it end together: core/sandbox.py), as failed, killed — a
submit whose answer was lost is there at most once (a client that finds none submits
again), no job runs twice, and nothing is left running after the supervisor's shutdown.
(JupyterHub itself is not started: the supervisor is the part a kill tests; the hub's own
tests, tests/hub, drive it under a real hub.)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request

import pytest

from jupyter_cloudtik.core.errors import ConflictError
from jupyter_cloudtik.hub.sidekicks import SidekickSpec
from jupyter_cloudtik.hub.sidekicks.supervisor import SidekickSupervisor

from .conftest import describe, rounds, seeded, wait_no_processes

ROUNDS = rounds(2)  # make test: 2; a campaign sets CLOUDTIK_CHAOS_ROUNDS
pytestmark = [pytest.mark.chaos, pytest.mark.slow,
              pytest.mark.timeout(120 + 30 * ROUNDS)]  # more rounds, more time

USER = "alice"
NAME = "job-gateway"


def http(method: str, url: str, headers: dict, body=None, timeout: float = 10.0):
    """(status, answer); (None, None) when the gateway died under the request."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={
        "Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return None, None


def test_job_gateway_sidekick_sigkilled_at_random_moments(tmp_path):
    seed, rng = seeded("sidekick chaos")
    n = ROUNDS
    # where each job marks its run: in the side-kick's own folder, the only one of this
    # machine its sandbox (and so its jobs) may write
    runs = tmp_path / "sk" / "sidekicks" / USER / NAME / "runs"
    runs.mkdir(parents=True)
    spec = SidekickSpec.from_dict({
        "name": NAME, "entry_point": "jupyter_cloudtik.hub.job_gateway",
        "health_interval": 0.2, "health_timeout": 2, "startup_timeout": 40,
        # each round's kill is a first restart (no growing backoff): rounds last longer
        # than the window; the supervisor's give-up rule is tested in tests/hub
        "stop_timeout": 5, "max_restarts": 1000, "restart_window": 2,
        "env": {"CLOUDTIK_JOB_GATEWAY_BACKEND": "local"}})
    jobs: dict[str, int] = {}  # tag -> factor
    answered: dict[str, set[str]] = {}
    history: list[str] = []
    counts: dict[str, list[str]] = {k: [] for k in (
        "lost jobs", "duplicated jobs", "jobs run more than once", "wrong job results",
        "stuck jobs", "gateway errors", "orphaned processes")}
    killed: list[str] = []  # ended with their side-kick's sandbox: failed, and said so

    def command(tag: str, factor: int) -> list[str]:
        code = (f"import os, time; open(os.path.join({str(runs)!r}, {tag!r}), 'a')"
                f".write(f'{{os.getpid()}}\\n'); time.sleep(0.3); print('result', {factor * 7})")
        return [sys.executable, "-c", code]

    async def main() -> None:
        sup = SidekickSupervisor(tmp_path / "sk", restart_backoff=0.1,
                                 allow_local_execution=True)
        try:
            info = await sup.start(USER, spec)
            sup.start_background()

            def where():
                target, headers = sup.proxy_target(USER, NAME)
                return target + sup.get(USER, NAME).prefix, headers

            async def running(old_pid=None):
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    i = sup.get(USER, NAME)
                    if i.state == "running" and i.pid and i.pid != old_pid:
                        url, headers = where()
                        status, _ = await asyncio.to_thread(http, "GET", f"{url}/health",
                                                            headers)
                        if status == 200:
                            return i
                    await asyncio.sleep(0.1)
                raise AssertionError(f"the gateway did not run again: {sup.get(USER, NAME)}")

            def submit(tag: str) -> None:
                try:
                    url, headers = where()
                except ConflictError:
                    # the kill came before this submit: the supervisor says "restarting"
                    # (the proxy's 409) and nothing was sent; resubmitted below once it runs
                    return
                status, body = http("POST", f"{url}/jobs", headers,
                                    {"command": command(tag, jobs[tag])})
                if status == 201:
                    answered[tag].add(body["id"])
                elif status is not None:
                    counts["gateway errors"].append(f"submit {tag}: {status} {body}")

            def listed() -> dict[str, list[dict]]:
                url, headers = where()
                status, body = http("GET", f"{url}/jobs", headers)
                assert status == 200, (status, body)
                out: dict[str, list[dict]] = {}
                for j in body["jobs"]:
                    for tag in jobs:
                        if any(f"'{tag}'" in a for a in j.get("command") or []):
                            out.setdefault(tag, []).append(j)
                return out

            for i in range(1, n + 1):
                tags = [f"r{i}j{k}" for k in range(rng.randint(1, 3))]
                delay = rng.uniform(0.0, 1.5)
                group = rng.random() < 0.5
                pid = info.pid
                history.append(f"round {i}: submit {tags}, SIGKILL of the gateway "
                               f"{'group' if group else 'process'} after {delay:.2f}s")

                def kill(pid=pid, group=group):
                    try:
                        os.killpg(pid, signal.SIGKILL) if group else os.kill(
                            pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

                loop = asyncio.get_running_loop()
                killer = loop.call_later(delay, kill)
                for tag in tags:
                    jobs[tag] = rng.randint(2, 99)
                    answered[tag] = set()
                    await asyncio.to_thread(submit, tag)
                await asyncio.sleep(max(0.0, delay + 0.05))
                killer.cancel()
                kill()  # if the timer fired during a request it already did this
                info = await running(old_pid=pid)
                # the next poll finishes the work: each job found (or submitted again if
                # its answer was lost and no job carries it), polled until it ends
                found = await asyncio.to_thread(listed)
                for tag in tags:
                    if not found.get(tag) and not answered[tag]:
                        await asyncio.to_thread(submit, tag)
                found = await asyncio.to_thread(listed)
                for tag in tags:
                    for j in found.get(tag, []):
                        deadline = time.monotonic() + 60
                        url, headers = where()
                        while j["state"] not in ("succeeded", "failed", "cancelled"):
                            if time.monotonic() > deadline:
                                counts["stuck jobs"].append(f"{tag} {j['id']}: {j['state']}")
                                break
                            await asyncio.sleep(0.2)
                            status, j = await asyncio.to_thread(
                                http, "GET", f"{url}/jobs/{j['id']}?refresh=true", headers)
                            assert status == 200, (status, j)
            found = await asyncio.to_thread(listed)
            url, headers = where()
            for tag, factor in jobs.items():
                ids = {j["id"] for j in found.get(tag, [])}
                if not ids or not answered[tag] <= ids:
                    counts["lost jobs"].append(f"{tag}: answered {sorted(answered[tag])}, "
                                               f"listed {sorted(ids)}")
                if len(ids) > 1:
                    counts["duplicated jobs"].append(f"{tag}: {sorted(ids)}")
                pids = (runs / tag).read_text().split() if (runs / tag).exists() else []
                if len(pids) > 1:
                    counts["jobs run more than once"].append(f"{tag}: pids {pids}")
                for j in found.get(tag, []):
                    _, logs = await asyncio.to_thread(http, "GET",
                                                      f"{url}/jobs/{j['id']}/logs", headers)
                    if j["state"] == "failed" and "without an exit code" in (
                            j.get("reason") or "") and not pids[1:]:
                        killed.append(tag)
                        continue
                    if j["state"] != "succeeded" or f"result {factor * 7}" not in (
                            (logs or {}).get("text") or ""):
                        counts["wrong job results"].append(
                            f"{tag} {j['id']}: {j['state']} {j.get('reason')!r}")
        finally:
            await sup.shutdown()

    asyncio.run(main())
    left = wait_no_processes(tmp_path, set(), timeout=10)
    if left:
        counts["orphaned processes"].append(describe(left))
        for p in left:
            p.kill()
    summary = ", ".join(f"{k} = {len(v)}" for k, v in counts.items()) + \
        f", killed with the side-kick (reported failed) = {len(killed)}"
    print(f"sidekick chaos, seed {seed}, {n} rounds: {summary}")
    bad = {k: v for k, v in counts.items() if v}
    log = tmp_path / "sk"
    tails = "\n".join(p.read_text(errors="replace")[-3000:] for p in log.rglob("*.log"))
    assert not bad, (
        f"seed {seed} (replay: CLOUDTIK_CHAOS_SEED={seed} CLOUDTIK_CHAOS_ROUNDS={n}); "
        f"{summary}\n" + "\n".join(f"{k}:\n  " + "\n  ".join(v) for k, v in bad.items())
        + "\nrounds:\n  " + "\n  ".join(history) + "\nsidekick logs:\n" + tails)
