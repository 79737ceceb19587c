"""A failing job never delays another (issue 29).

The poller keeps each job apart: an unexpected error while submitting, staging in,
polling or staging out one job fails that job, with the stage and the cause in one line,
and every other job of the backend goes on in the same round.  Faults are injected by
real means where there are any (an input deleted before it is staged, the output folder
replaced by a file before results are copied) and otherwise by backends that fail on
purpose, installed as backend plugins (``faulty_backends``).  Outputs are checked at
submit like inputs.  A backend that does not answer writes one event when it stops and
one when it answers again; a cancel asked for meanwhile is said at once and carried out
when it answers.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time

import pytest

from jupyter_cloudtik.core.errors import ConfigError
from jupyter_cloudtik.hpc.base import JobRef
from jupyter_cloudtik.hpc.commands import build_spec

from . import faulty_backends
from .conftest import wait_for


@pytest.fixture
def faulty(tmp_path_factory):
    """The faulty backend types, installed as plugins (an entry point on sys.path)."""
    from jupyter_cloudtik.core import plugins

    root = str(faulty_backends.write_distribution(tmp_path_factory.mktemp("faulty")))
    sys.path.insert(0, root)
    plugins._entry_points.cache_clear()
    yield faulty_backends
    sys.path.remove(root)
    plugins._entry_points.cache_clear()


def _config(kind: str, backend_configs, faults: dict) -> tuple[dict, dict]:
    if kind == "local":
        config, secrets = {"type": "local"}, {}
    else:
        config, secrets = backend_configs[kind]()
    config = {**config, "type": f"faulty_{kind}", "faults": faults}
    if kind in ("local", "slurm"):  # inputs and results go through the session
        config["shared_filesystem"] = False
    if kind == "slurm":
        # this machine's Slurm runs jobs as root: it can run the session's interpreter, and
        # a built environment would have to wheel this test's own plugin distribution
        config["environment"] = {"python": sys.executable}
    return config, {("hpc", key): value for (_, key), value in secrets.items()}


def _one_line(reason: str) -> None:
    assert reason and "\n" not in reason and "Traceback" not in reason, reason


@pytest.mark.parametrize("kind", ["local", "slurm", "firecrest", "arc"])
def test_a_failing_job_never_delays_another(kind, faulty, make_client, backend_configs,
                                            tmp_path, caplog):
    """One backend, one state folder, five jobs: four fail, each at another stage, and
    the healthy one succeeds with its results where asked; no failure repeats."""
    caplog.set_level(logging.INFO, logger="jupyter_cloudtik.hpc")
    faults = {"submit": ["bad-submit"], "poll": ["bad-poll"], "state": ["bad-state"]}
    config, secrets = _config(kind, backend_configs, faults)
    client = make_client({"hpc": config}, secrets, retry_interval_max=0.3)
    be = client.manager.registry.get("hpc")
    (tmp_path / "in-good.txt").write_text("ok\n")
    (tmp_path / "in-bad.txt").write_text("never read\n")
    (tmp_path / "bad-parent").mkdir()

    def spec(name: str, *, first: str = "", **kw):
        return build_spec(command=["sh", "-c", f"{first}cat in.txt > result.txt"],
                          name=name, outputs=["result.txt"], **kw)

    good_in = f"in.txt={tmp_path / 'in-good.txt'}"
    specs = {
        # still running when the others have failed: the poller goes on meanwhile
        "good": spec("good", first="sleep 2; ", inputs=[good_in],
                     output=str(tmp_path / "good-out")),
        "bad-submit": spec("bad-submit", inputs=[good_in]),
        "bad-in": spec("bad-in", inputs=[f"in.txt={tmp_path / 'in-bad.txt'}"]),
        "bad-poll": spec("bad-poll", inputs=[good_in]),
        "bad-state": spec("bad-state", inputs=[good_in]),
        "bad-out": spec("bad-out", inputs=[good_in],
                        output=str(tmp_path / "bad-parent" / "out")),
    }
    be.down = True  # everything is recorded now and submitted by the poller later
    jobs = {name: client.submit(s, "hpc") for name, s in specs.items()}
    assert {j.state for j in jobs.values()} == {"unknown"}
    # real faults between submit and stage-in / stage-out: checked at submit, gone now
    (tmp_path / "in-bad.txt").unlink()
    shutil.rmtree(tmp_path / "bad-parent")
    (tmp_path / "bad-parent").write_text("a file where the output folder was\n")
    be.down = False
    ids = {name: j.id for name, j in jobs.items()}

    def failed(name: str):
        return (j := client.get(ids[name])).state == "failed" and j

    early = ("bad-submit", "bad-in", "bad-poll", "bad-state")
    wait_for(lambda: all(failed(n) for n in early), 60, what="the early failures")
    calls = {n: be.calls["poll", n] + be.calls["submit", n] for n in early}
    seen = {n: len(client.events(ids[n])) for n in early}
    polls = be.calls["poll", None]
    final = {name: client.wait(i, 120) for name, i in ids.items()}

    good = final["good"]
    assert good.state == "succeeded", good.reason
    assert (tmp_path / "good-out" / "result.txt").read_text() == "ok\n"
    reasons = {n: final[n].reason for n in final if n != "good"}
    for name, reason in reasons.items():
        assert final[name].state == "failed", (name, final[name])
        _one_line(reason)
    assert reasons["bad-submit"] == ("submit failed: InjectedFault: injected fault: submit "
                                     "of 'bad-submit'")
    assert reasons["bad-in"] == (f"stage-in failed: input 'in.txt': {tmp_path / 'in-bad.txt'}"
                                 " no longer exists")
    assert reasons["bad-poll"] == "poll failed: InjectedFault: injected fault: poll of 'bad-poll'"
    assert reasons["bad-state"].startswith("poll failed: backend 'hpc' reported 'bogus' for job")
    assert reasons["bad-out"] == (f"stage-out failed: cannot write output "
                                  f"'{tmp_path / 'bad-parent' / 'out'}': Not a directory")
    assert final["bad-in"].native_id is None and final["bad-submit"].native_id is None
    # a job whose state can no longer be followed is cancelled on the system
    assert be.calls["cancel", "bad-poll"] == 1 and be.calls["cancel", "bad-state"] == 1
    # nothing about the failed jobs happened again while the poller went on for the others
    assert be.calls["poll", None] > polls
    assert {n: be.calls["poll", n] + be.calls["submit", n] for n in early} == calls
    assert {n: len(client.events(ids[n])) for n in early} == seen
    for name in reasons:
        texts = [e.message for e in client.events(ids[name])]
        assert not any("Traceback" in t for t in texts), texts
    # the server's log has each unexpected error once, with its traceback
    for name in ("bad-submit", "bad-poll"):
        logged = [r for r in caplog.records if ids[name] in r.getMessage() and r.exc_info]
        assert len(logged) == 1, [r.getMessage() for r in logged]


def test_a_job_the_backend_fails_at_submit_is_failed_not_raised(faulty, make_client):
    """The first submit (in the caller's call) is kept apart too: the job is recorded
    failed with the reason, the caller gets it back instead of a traceback."""
    client = make_client({"hpc": {"type": "faulty_local", "faults": {"submit": ["boom"]}}})
    info = client.submit(build_spec(command=["true"], name="boom"), "hpc")
    assert info.state == "failed"
    assert info.reason == "submit failed: InjectedFault: injected fault: submit of 'boom'"
    ok = client.wait(client.submit(build_spec(command=["true"], name="fine"), "hpc").id, 30)
    assert ok.state == "succeeded", ok.reason
    # a job that never ran still gets its record: what was asked, and why it did not run
    from jupyter_cloudtik.hpc import provenance
    from jupyter_cloudtik.hpc.api import Job

    crate = Job(info.id, client).crate
    assert crate is not None, [e.message for e in client.events(info.id)]
    recorded = provenance.read(crate)
    assert recorded["job"]["command"] == ["true"] and recorded["id"] == info.id
    meta = json.loads((crate / provenance.CRATE_FILE).read_text())
    action = next(e for e in meta["@graph"] if e.get("@type") == "CreateAction")
    assert action["actionStatus"] == "http://schema.org/FailedActionStatus"
    assert "injected fault: submit of 'boom'" in action["error"]
    assert [e.step for e in client.events(info.id)].count("provenance") == 1
    assert [e.step for e in client.events(ok.id)].count("provenance") == 1  # not twice


def test_outputs_are_checked_at_submit(make_client, tmp_path):
    """An output nothing could write into is refused before anything is recorded, naming
    the field, the value and what is allowed (resolved like the inputs)."""
    client = make_client({"local": {"type": "local"}})
    (tmp_path / "a-file.txt").write_text("x")
    cases = [("/proc/self/results", "is inside the system folder /proc"),
             ("/sys/results", "is inside the system folder /sys"),
             (str(tmp_path / "a-file.txt"), "exists and is not a folder"),
             (str(tmp_path / "a-file.txt" / "results"),
              f"is under '{tmp_path / 'a-file.txt'}', which is a file, not a folder"),
             (str(tmp_path / "no" / "such" / "folder"), "the folder above")]
    if os.geteuid() != 0:  # root writes into read-only folders
        ro = tmp_path / "read-only"
        ro.mkdir()
        ro.chmod(0o555)
        cases.append((str(ro / "results"), "is read-only for this session"))
    for output, text in cases:
        with pytest.raises(ConfigError) as e:
            client.submit(build_spec(command=["true"], output=output), "local")
        assert e.value.field == "output", e.value.message
        assert e.value.message.startswith(f"output: '{output}' ") or \
            e.value.message.startswith(f"output: the folder above '{output}'"), e.value.message
        assert text in e.value.message, e.value.message
        assert "give a folder you can write" in e.value.message, e.value.message
    assert client.list() == []
    # a folder that does not exist yet under one that does is fine (it is created)
    info = client.wait(client.submit(build_spec(command=["sh", "-c", "echo 1 > r.txt"],
                                                output=str(tmp_path / "new" / "out")),
                                     "local").id, 30)
    assert info.state == "succeeded", info.reason
    assert (tmp_path / "new" / "out" / "r.txt").read_text() == "1\n"
    assert not list(tmp_path.glob(".cloudtik-write-check-*"))  # the check's file is gone


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a file system (root)")
def test_outputs_are_checked_by_writing_even_as_root(make_client, tmp_path):
    """Was ``os.access``: it answers for the mode bits and the mount, so as root a folder
    with no room left (here a tmpfs with no free inode) passed, and the job's results
    failed at stage-out.  Now a file is made and removed there; a read-only mount is
    refused the same way."""
    import subprocess

    client = make_client({"local": {"type": "local"}})
    full, ro = tmp_path / "full", tmp_path / "ro"
    mounted = []
    try:
        for folder, opts in ((full, "size=64k,nr_inodes=1"), (ro, "ro,size=64k")):
            folder.mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(folder)],
                           check=True, capture_output=True, timeout=30)
            mounted.append(folder)
        assert os.access(full, os.W_OK | os.X_OK)  # what the old check asked
        for output, text in ((full / "results", "refuses new files (No space left"),
                             (ro / "results", "is read-only for this session")):
            with pytest.raises(ConfigError) as e:
                client.submit(build_spec(command=["true"], output=str(output)), "local")
            assert e.value.field == "output" and text in e.value.message, e.value.message
            assert "\n" not in e.value.message
        assert client.list() == []
    finally:
        for folder in mounted:
            subprocess.run(["umount", str(folder)], capture_output=True, timeout=30)


def test_an_outage_is_one_event_and_a_cancel_meanwhile_waits_for_the_backend(
        faulty, make_client):
    """While the backend does not answer, polls and submit retries go on without an
    event each; one ``unavailable`` when it stops, one ``available`` (how long) when it
    answers.  A cancel asked for meanwhile says so at once and happens when it answers."""
    client = make_client({"hpc": {"type": "faulty_local"}}, retry_interval_max=0.2)
    be = client.manager.registry.get("hpc")
    keep = client.submit(build_spec(command=["sleep", "3"], name="keep"), "hpc")
    stop = client.submit(build_spec(command=["sleep", "60"], name="stop"), "hpc")
    try:
        _outage_and_cancels(client, be, keep, stop)
    finally:  # whatever failed above, the long job does not outlive the test
        be.down = False
        be.cancel(JobRef(stop.id, stop.id))


def _outage_and_cancels(client, be, keep, stop) -> None:
    wait_for(lambda: client.get(stop.id).state == "running", 30, what="running")
    be.down = True
    wait_for(lambda: client.get(keep.id).state == "unknown", 10, what="unknown")
    later = client.submit(build_spec(command=["true"], name="later"), "hpc")
    never = client.submit(build_spec(command=["true"], name="never"), "hpc")
    assert later.state == never.state == "unknown" and later.native_id is None
    # checked against the configured limits only, and the job says so (not only the log)
    assert any("checked against the configured limits only" in w for w in later.warnings), \
        later.warnings
    polls, submits = be.calls["poll", None], be.calls["submit", "later"]
    started = time.monotonic()
    for job in (stop, never):  # answered at once, without asking the silent backend
        info = client.cancel(job.id)
        assert info.state == "unknown", info
        (pending,) = [e for e in client.events(job.id) if (e.data or {}).get("pending")]
        assert pending.message == ("cancel requested; backend 'hpc' is unavailable, the job "
                                   "will be cancelled when it answers"), pending.message
    assert time.monotonic() - started < 2
    assert be.calls["cancel", "stop"] == 0
    wait_for(lambda: be.calls["poll", None] >= polls + 4 and
             be.calls["find", "later"] + be.calls["submit", "later"] >= submits + 3, 20,
             what="polls and submit retries while the backend is down")
    be.down = False
    final = {j.id: client.wait(j.id, 30) for j in (keep, stop, later, never)}
    assert final[keep.id].state == "succeeded", final[keep.id].reason
    assert final[later.id].state == "succeeded", final[later.id].reason
    assert final[stop.id].state == "cancelled", final[stop.id].reason
    assert final[never.id].state == "cancelled", final[never.id].reason
    assert be.calls["cancel", "stop"] == 1 and be.calls["submit", "never"] == 1
    for job in (keep, stop, later, never):
        events = client.events(job.id)
        steps = [e.step for e in events]
        assert steps.count("unavailable") == 1, steps
        (back,) = [e for e in events if e.step == "available"]
        assert back.message.startswith("backend 'hpc' answers again (it did not for "), back
        assert back.data["unavailable_seconds"] > 0.5
    stop_events = [e.message for e in client.events(stop.id)]
    assert "backend 'hpc' answers: the cancel asked for meanwhile is carried out" in \
        stop_events
