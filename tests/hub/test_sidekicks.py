"""Side-kick services: real processes on 127.0.0.1, supervised by the real supervisor.

The job gateway (the RFC's example) runs a real job on the ``local`` HPC backend; a tiny
http.server script stands in for services whose health we control (``/fail``) and that
report whether they got a secret (never the secret itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import stat
import sys
import time
import urllib.error
import urllib.request

import psutil
import pytest

from jupyter_cloudtik.core.errors import ConfigError, NotFoundError, PermissionDeniedError
from jupyter_cloudtik.hub.sidekicks import (
    TOKEN_HEADER,
    SidekickCatalog,
    SidekickError,
    SidekickSpec,
    SidekickSupervisor,
    load_specs,
)

SECRET = "s3cr3t-VALUE-8d7f2a"  # must never show up outside the service's own output

SERVICE = r"""
import hashlib, json, os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
prefix = os.environ["CLOUDTIK_SIDEKICK_PREFIX"]
failing = False
if os.environ.get("MY_SECRET"):
    print("debug: my secret is", os.environ["MY_SECRET"], flush=True)
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        global failing
        path = self.path[len(prefix):] if self.path.startswith(prefix) else None
        status, body = 404, {}
        if path == "/health":
            status = 500 if failing else 200
        elif path == "/fail":
            failing, status = True, 200
        elif path == "/secret":
            got = hashlib.sha256(os.environ.get("MY_SECRET", "").encode()).hexdigest()
            status, body = 200, {"match": got == os.environ.get("EXPECTED_SHA")}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""


def service_spec(name: str = "svc", **kw) -> SidekickSpec:
    return SidekickSpec.from_dict({
        "name": name, "command": [sys.executable, "-c", SERVICE], "health_interval": 0.2,
        "health_timeout": 1, "unhealthy_after": 2, "startup_timeout": 15,
        "stop_timeout": 2, **kw})


def gone(pid: int | None) -> bool:
    if pid is None or not psutil.pid_exists(pid):
        return True
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return not psutil.pid_exists(pid)  # half-way through exiting


@contextlib.asynccontextmanager
async def supervised(tmp_path, log, **kw):
    """A supervisor whose side-kicks are all stopped (and checked gone) at the end."""
    sup = SidekickSupervisor(tmp_path / "sk", log=log, restart_backoff=0.1, **kw)
    pids: set[int] = set()
    orig = sup._launch

    async def launch(e):  # remember every process started, to prove each one is gone
        try:
            await orig(e)
        finally:
            if e.proc is not None:
                pids.add(e.proc.pid)

    sup._launch = launch  # type: ignore[method-assign]
    try:
        yield sup
    finally:
        await sup.shutdown()
        left = [p for p in pids if not gone(p)]
        assert not left, f"side-kick processes left running: {left}"


async def wait_for(pred, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def checks_until(sup: SidekickSupervisor, pred, timeout: float = 10.0) -> None:
    """Health-check rounds by hand (no background loop) until ``pred()`` holds."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out running health checks"
        await sup.run_health_checks_once()
        await asyncio.sleep(0.05)


async def http(method: str, url: str, body=None, headers=None, timeout: float = 10.0):
    def call():
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={
            "Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")
    return await asyncio.to_thread(call)


def base_url(sup: SidekickSupervisor, user: str, name: str) -> tuple[str, dict]:
    target, headers = sup.proxy_target(user, name)
    return target + sup.get(user, name).prefix, headers


# --- the job gateway ------------------------------------------------------------------------

def test_job_gateway_runs_jobs_and_is_restarted_after_kill(tmp_path, sklog):
    spec = SidekickSpec.from_dict({
        "name": "job-gateway", "entry_point": "jupyter_cloudtik.hub.job_gateway",
        "description": "HPC jobs over HTTP", "health_interval": 0.2, "health_timeout": 2,
        "startup_timeout": 40, "stop_timeout": 5,
        "env": {"CLOUDTIK_JOB_GATEWAY_BACKEND": "local"}})

    async def main():
        # local jobs allowed (they run in the side-kick's sandbox: test_sidekick_sandbox.py)
        async with supervised(tmp_path, sklog, allow_local_execution=True) as sup:
            info = await sup.start("alice", spec)
            assert info.state == "running" and info.port and info.pid
            assert info.prefix == "/services/cloudtik/sidekicks/alice/job-gateway"
            assert info.last_health["ok"] is True
            again = await sup.start("alice", spec)  # idempotent
            assert (again.pid, again.port, again.state) == (info.pid, info.port, "running")
            assert [i.name for i in sup.list("alice")] == ["job-gateway"]

            url, headers = base_url(sup, "alice", "job-gateway")
            status, _ = await http("GET", f"{url}/health")
            assert status == 403  # the token is required: any local user reaches 127.0.0.1
            status, body = await http("GET", f"{url}/health", headers=headers)
            assert (status, body["user"]) == (200, "alice")

            for bad, field in [({"command": "echo hi"}, "command"),
                               ({}, "command"),
                               ({"command": ["true"], "script": "true"}, "command"),
                               ({"script": "true", "nodes": 0}, "nodes"),
                               ({"script": "true", "bogus": 1}, "bogus"),
                               ({"script": "true", "backend": "nope"}, "backend"),
                               # parameters the job cannot receive: refused, not dropped
                               ({"script": "true", "parameters": {"n": 1}}, "parameters.n"),
                               ({"script": "true", "allow_unknown_parameters": "yes"},
                                "allow_unknown_parameters")]:
                status, err = await http("POST", f"{url}/jobs", bad, headers)
                assert status == 400, (bad, err)
                assert err["field"] == field and field in err["message"], err

            status, job = await http("POST", f"{url}/jobs", {
                "command": [sys.executable, "-c", "print('hello from the job')"]}, headers)
            assert status == 201, job
            assert job["backend"] == "local" and job["state"] in ("queued", "running",
                                                                  "succeeded")
            job_url = f"{url}/jobs/{job['id']}"

            async def state():
                return (await http("GET", job_url, headers=headers))[1]
            deadline = time.monotonic() + 30
            while (j := await state())["state"] not in ("succeeded", "failed"):
                assert time.monotonic() < deadline, j
                await asyncio.sleep(0.2)
            assert j["state"] == "succeeded" and j["user"] == "alice", j
            status, logs = await http("GET", f"{job_url}/logs", headers=headers)
            assert status == 200 and "hello from the job" in logs["text"]
            status, err = await http("GET", f"{url}/jobs/nosuchjob", headers=headers)
            assert status == 404 and err["field"] == "job"

            # killed from outside: noticed, restarted, healthy again on the same port
            sup.start_background()
            old_pid = info.pid
            os.kill(old_pid, signal.SIGKILL)
            await wait_for(lambda: sup.get("alice", "job-gateway").restarts == 1, 10,
                           "the restart")
            new = await wait_for(lambda: (i := sup.get("alice", "job-gateway")).state
                                 == "running" and i, 40, "running again")
            assert new.pid != old_pid and new.restarts == 1
            assert "exited" in (new.reason or "") or new.reason is None
            assert gone(old_pid)
            status, body = await http("GET", f"{base_url(sup, 'alice', 'job-gateway')[0]}"
                                      "/health", headers=sup.proxy_target(
                                          "alice", "job-gateway")[1])
            assert status == 200
            # the earlier job is still known to the restarted gateway (its state dir)
            url, headers = base_url(sup, "alice", "job-gateway")
            status, j = await http("GET", f"{url}/jobs/{job['id']}", headers=headers)
            assert status == 200 and j["state"] == "succeeded"

            text = await sup.logs("alice", "job-gateway", tail=500)
            assert "starting on port" in text and "restarting" in text
            assert "job gateway for alice" in text
            mode = stat.S_IMODE(sup.log_path("alice", "job-gateway").stat().st_mode)
            assert mode == 0o600

            stopped = await sup.stop("alice", "job-gateway")
            assert stopped.state == "stopped" and stopped.pid is None
            assert gone(new.pid)

    asyncio.run(main())


# --- health, restarts, stopping ----------------------------------------------------------------

def test_unhealthy_service_is_restarted_after_unhealthy_after_checks(tmp_path, sklog):
    async def main():
        async with supervised(tmp_path, sklog) as sup:
            info = await sup.start("alice", service_spec())
            sup.start_background()
            url, headers = base_url(sup, "alice", "svc")
            status, _ = await http("GET", f"{url}/fail", headers=headers)
            assert status == 200
            t0 = time.monotonic()
            await wait_for(lambda: sup.get("alice", "svc").restarts == 1, 10, "a restart")
            # two failed checks 0.2 s apart: not before the second one
            assert time.monotonic() - t0 >= 0.2
            new = await wait_for(lambda: (i := sup.get("alice", "svc")).state == "running"
                                 and i, 10, "running again")
            assert new.pid != info.pid and gone(info.pid)
            assert "2 health checks failed in a row" in new.reason
            await wait_for(lambda: (h := sup.get("alice", "svc").last_health)
                           and h["ok"] and h["time"] > t0 + 0.2, 5, "a good check")
            assert any("health check failed" in line for line in sklog.lines)

    asyncio.run(main())


def test_gives_up_after_max_restarts(tmp_path, sklog):
    async def main():
        async with supervised(tmp_path, sklog) as sup:
            spec = service_spec(max_restarts=1, restart_window=60)
            info = await sup.start("alice", spec)
            os.kill(info.pid, signal.SIGKILL)
            await checks_until(sup, lambda: sup.get("alice", "svc").state != "running")
            second = await wait_for(lambda: (i := sup.get("alice", "svc")).state
                                    == "running" and i, 10, "the restart")
            assert second.restarts == 1
            os.kill(second.pid, signal.SIGKILL)
            await checks_until(sup, lambda: sup.get("alice", "svc").state != "running")
            failed = await wait_for(lambda: (i := sup.get("alice", "svc")).state
                                    == "failed" and i, 10, "giving up")
            assert "gave up after 1 restarts" in failed.reason and failed.pid is None
            # a failed side-kick can be started again by hand
            fresh = await sup.start("alice", spec)
            assert fresh.state == "running" and fresh.restarts == 0

    asyncio.run(main())


def test_stop_and_stop_user(tmp_path, sklog):
    async def main():
        async with supervised(tmp_path, sklog) as sup:
            a = await sup.start("alice", service_spec("svc-a"))
            b = await sup.start("alice", service_spec("svc-b"))
            c = await sup.start("bob", service_spec("svc-a"))
            assert len({a.port, b.port, c.port}) == 3
            assert os.getpgid(a.pid) == a.pid  # its own process group
            stopped = await sup.stop("alice", "svc-a")
            assert stopped.state == "stopped" and gone(a.pid)
            assert sup.get("bob", "svc-a").state == "running"
            infos = await sup.stop_user("alice")
            assert {i.name: i.state for i in infos} == {"svc-a": "stopped",
                                                        "svc-b": "stopped"}
            assert gone(b.pid) and not gone(c.pid)
            assert [i.user for i in sup.list() if i.state == "running"] == ["bob"]
            with pytest.raises(NotFoundError) as e:
                await sup.stop("alice", "nope")
            assert e.value.field == "sidekick"
            assert sup.touch("alice", "svc-a") is False
            # stop while starting: the start fails clearly, nothing is left
            slow = service_spec("slow", command=[sys.executable, "-c",
                                                 "import time; time.sleep(60)"],
                                startup_timeout=30)
            starting = asyncio.create_task(sup.start("alice", slow))
            await wait_for(lambda: sup._entries.get(("alice", "slow"))
                           and sup._entries[("alice", "slow")].pid, 5, "the spawn")
            pid = sup._entries[("alice", "slow")].pid
            await sup.stop("alice", "slow")
            with pytest.raises(SidekickError, match="stopped while starting"):
                await starting
            assert gone(pid)
        assert gone(c.pid)  # shutdown stopped bob's too

    asyncio.run(main())


def test_idle_timeout_stops_the_sidekick(tmp_path, sklog):
    async def main():
        async with supervised(tmp_path, sklog) as sup:
            info = await sup.start("alice", service_spec(idle_timeout_minutes=0.01))  # 0.6s
            sup.start_background()
            for _ in range(4):  # activity keeps it alive past the timeout
                await asyncio.sleep(0.3)
                assert sup.touch("alice", "svc")
            assert sup.get("alice", "svc").state == "running"
            stopped = await wait_for(lambda: (i := sup.get("alice", "svc")).state
                                     == "stopped" and i, 5, "the idle stop")
            assert "idle" in stopped.reason and gone(info.pid)

    asyncio.run(main())


def test_start_failures_are_clear(tmp_path, sklog):
    async def main():
        async with supervised(tmp_path, sklog) as sup:
            crash = service_spec("crash", command=[
                sys.executable, "-c", "import sys; print('cannot work'); sys.exit(3)"])
            with pytest.raises(SidekickError) as e:
                await sup.start("alice", crash)
            assert "exited with code 3 while starting" in e.value.message
            assert "cannot work" in e.value.message
            assert sup.get("alice", "crash").state == "failed"

            mute = service_spec("mute", command=[sys.executable, "-c",
                                                 "import time; time.sleep(60)"],
                                startup_timeout=0.6)
            with pytest.raises(SidekickError) as e:
                await sup.start("alice", mute)
            assert "within startup_timeout 0.6s" in e.value.message
            assert "/services/cloudtik/sidekicks/alice/mute/health" in e.value.message
            assert sup.get("alice", "mute").state == "failed"
            assert sup.get("alice", "mute").pid is None  # it was killed

            missing = service_spec("missing", command=["/nonexistent/service-binary"])
            with pytest.raises(SidekickError, match="nonexistent"):
                await sup.start("alice", missing)

    asyncio.run(main())


def test_orphans_of_an_earlier_supervisor_are_stopped(tmp_path, sklog):
    async def main():
        async with supervised(tmp_path, sklog) as first:
            info = await first.start("alice", service_spec())
            later = SidekickSupervisor(tmp_path / "sk", log=sklog)  # after a crash
            killed = await later.recover_orphans()
            assert [(r["user"], r["name"], r["pid"]) for r in killed] == [
                ("alice", "svc", info.pid)]
            assert gone(info.pid)
            assert await later.recover_orphans() == []
            await later.shutdown()

    asyncio.run(main())


# --- secrets --------------------------------------------------------------------------------------

def test_secret_reaches_the_process_but_nothing_else(tmp_path, sklog):
    secrets = {"svc-token": SECRET}
    spec = service_spec(env={"MY_SECRET": {"secret": "svc-token"},
                             "EXPECTED_SHA": hashlib.sha256(SECRET.encode()).hexdigest()})

    async def main():
        async with supervised(tmp_path, sklog, secret_resolver=secrets.__getitem__) as sup:
            info = await sup.start("alice", spec)
            url, headers = base_url(sup, "alice", "svc")
            status, body = await http("GET", f"{url}/secret", headers=headers)
            assert (status, body) == (200, {"match": True})
            proc = psutil.Process(info.pid)
            assert SECRET not in " ".join(proc.cmdline())
            shown = [repr(info), json.dumps(info.to_dict()), repr(sup), repr(spec),
                     json.dumps(spec.to_dict()), repr(sup._entries[("alice", "svc")]),
                     *sklog.lines, json.dumps([i.to_dict() for i in sup.list()])]
            logs = await sup.logs("alice", "svc")
            assert "debug: my secret is ***" in logs
            shown.append(logs)
            await sup.stop("alice", "svc")
            shown.extend(sklog.lines)
            shown.append((tmp_path / "sk" / "sidekicks" / "processes.json").read_text())
            assert not [s for s in shown if SECRET in s]
            # the process's own output is written as is: documented, not redactable
            assert SECRET in sup.log_path("alice", "svc").read_text()

        async with supervised(tmp_path / "2", sklog) as sup:  # no resolver configured
            with pytest.raises(ConfigError) as e:
                await sup.start("alice", spec)
            assert e.value.field == "env.MY_SECRET" and "svc-token" in e.value.message

        async with supervised(tmp_path / "3", sklog, secret_resolver={}.__getitem__) as sup:
            with pytest.raises(ConfigError) as e:
                await sup.start("alice", spec)
            assert e.value.field == "env.MY_SECRET" and "KeyError" in e.value.message

    asyncio.run(main())


# --- specs ----------------------------------------------------------------------------------------

GOOD = {"name": "ok", "command": ["x"]}


@pytest.mark.parametrize("patch,field", [
    ({"name": "Bad_Name"}, "name"),
    ({"name": "a" * 41}, "name"),
    ({"entry_point": "pkg.mod"}, "command"),  # both
    ({"command": None}, "command"),  # neither
    ({"command": "echo hi"}, "command"),
    ({"command": ["echo", 3]}, "command"),
    ({"command": None, "entry_point": "pkg.mod:fn; rm"}, "entry_point"),
    ({"env": {"PORT": "1"}}, "env.PORT"),
    ({"env": {"X": {"secret": ""}}}, "env.X"),
    ({"env": {"X": {"secret": "n", "other": 1}}}, "env.X"),
    ({"env": {"X": [1]}}, "env.X"),
    ({"env": {"1X": "v"}}, "env.1X"),
    ({"health_path": "health"}, "health_path"),
    ({"health_interval": 0}, "health_interval"),
    ({"health_timeout": "2"}, "health_timeout"),
    ({"unhealthy_after": 0}, "unhealthy_after"),
    ({"unhealthy_after": 1.5}, "unhealthy_after"),
    ({"max_restarts": -1}, "max_restarts"),
    ({"idle_timeout_minutes": -1}, "idle_timeout_minutes"),
    ({"startup_timeout": True}, "startup_timeout"),
    ({"allowed_users": "bob"}, "allowed_users"),
    ({"allowed_groups": [""]}, "allowed_groups"),
    ({"description": 3}, "description"),
    ({"cmd": ["x"]}, "cmd"),
])
def test_bad_specs_name_the_field(patch, field):
    d = {k: v for k, v in {**GOOD, **patch}.items() if v is not None}
    with pytest.raises(ConfigError) as e:
        SidekickSpec.from_dict(d)
    assert e.value.field == field, e.value.message
    assert field.split(".")[-1] in e.value.message


def test_spec_defaults_files_and_permissions(tmp_path):
    s = SidekickSpec.from_dict({"name": "job-gateway",
                                "entry_point": "jupyter_cloudtik.hub.job_gateway"})
    assert (s.health_path, s.health_interval, s.health_timeout, s.unhealthy_after,
            s.startup_timeout, s.idle_timeout_minutes, s.max_restarts, s.restart_window) \
        == ("/health", 5.0, 2.0, 3, 30.0, 0.0, 5, 600.0)
    assert s.argv("py") == ["py", "-m", "jupyter_cloudtik.hub.job_gateway"]
    f = SidekickSpec.from_dict({"name": "f", "entry_point": "pkg.mod:main"})
    assert f.argv("py")[:2] == ["py", "-c"] and "m.main()" in f.argv("py")[2]
    assert s.allows("anyone")  # no allow-lists: everyone

    (tmp_path / "sidekicks.yaml").write_text("""
sidekicks:
  job-gateway:
    entry_point: jupyter_cloudtik.hub.job_gateway
    env: {TOKEN: {secret: arc-token}}
    allowed_groups: [hpc]
  public:
    command: [my-service, --flag]
    allowed_users: ["*"]
""")
    cat = SidekickCatalog.from_file(tmp_path / "sidekicks.yaml")
    assert [x.name for x in cat.for_user("bob")] == ["public"]
    assert [x.name for x in cat.for_user("bob", ["hpc"])] == ["job-gateway", "public"]
    assert cat.specs["job-gateway"].secret_names() == ["arc-token"]
    assert cat.specs["job-gateway"].to_dict()["env"] == {"TOKEN": {"secret": "arc-token"}}
    with pytest.raises(PermissionDeniedError):
        cat.get("job-gateway", "bob")
    with pytest.raises(NotFoundError, match="available to you: public"):
        cat.get("nope", "bob")
    assert cat.get("job-gateway", "bob", ["hpc"]).name == "job-gateway"
    with pytest.raises(ConfigError) as e:
        load_specs({"a": {"name": "b", "command": ["x"]}})
    assert e.value.field == "sidekicks.a.name"
    with pytest.raises(ConfigError) as e:
        load_specs({"a": {"command": ["x"], "health_interval": -1}})
    assert e.value.field == "sidekicks.a.health_interval"
    assert TOKEN_HEADER == "X-CloudTik-Sidekick-Token"


def test_process_records_are_written_by_one_thread_at_a_time(tmp_path):
    """Side-kicks stopped together (a shutdown, a user's session ending) rewrite
    ``processes.json`` from several threads; two of them once renamed the same temporary
    file (``FileNotFoundError`` in the shutdown, seen in a full run)."""
    sup = SidekickSupervisor(tmp_path / "sk")

    async def main():
        await asyncio.gather(*(asyncio.to_thread(sup._write_records) for _ in range(200)))

    asyncio.run(main())
    assert json.loads((tmp_path / "sk" / "sidekicks" / "processes.json").read_text()) == []
