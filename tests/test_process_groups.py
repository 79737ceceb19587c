"""A group number that is no longer ours is never signalled (core/process_groups.py).

In CI, ``down`` of a local cluster whose nodes had died SIGKILLed the process group its
record named; the number had meanwhile gone to another test's just-booted emulated server,
which powered off 0.4 s after starting.  These tests make the kernel hand the number to a
new process on purpose (a PID namespace of our own, whose next pid is set through
``ns_last_pid``) and check who survives; a scan of the tree keeps ``os.killpg`` in that one
module.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ast_parse import parse

ROOT = Path(__file__).resolve().parents[1]
DECIDER = Path("jupyter_cloudtik/core/process_groups.py")

REUSE = textwrap.dedent(r"""
    import json, os, signal, subprocess, sys, time
    from jupyter_cloudtik.core.process_groups import (GroupRef, group_running, signal_group,
                                                      terminate_group, writes_under)

    def next_pid_is(pid):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))

    def session(cmd, log=None):
        out = open(log, "ab") if log else subprocess.DEVNULL
        return subprocess.Popen(cmd, start_new_session=True, stdout=out, stderr=out)

    folder = sys.argv[1]
    result = {}
    # 1. our group ended; its number goes to somebody else's new group
    ours = session(["sleep", "60"])
    ref = GroupRef.of(ours.pid)
    time.sleep(0.6)  # beyond START_TOLERANCE: the start times tell the two apart
    ours.kill(); ours.wait()
    next_pid_is(ref.pgid)
    theirs = session(["sleep", "60"])
    result["reused"] = theirs.pid == ref.pgid
    result["running_after_reuse"] = group_running(ref)
    result["signalled"] = signal_group(ref, signal.SIGKILL)
    terminate_group(ref, grace=0.2, owned=writes_under(folder))
    time.sleep(0.2)
    result["theirs_alive"] = theirs.poll() is None
    theirs.kill(); theirs.wait()

    # 2. our leader died, a member of our group lives on (it logs to our folder): it is
    #    stopped, and only it
    leader = session(["bash", "-c", "sleep 60 & echo $! > " + folder + "/child; exit 0"],
                     log=folder + "/node.log")
    ref2 = GroupRef.of(leader.pid)
    leader.wait()
    while not os.path.exists(folder + "/child") or not open(folder + "/child").read():
        time.sleep(0.01)
    child = int(open(folder + "/child").read())
    result["member_running"] = group_running(ref2, writes_under(folder))
    result["member_without_proof"] = group_running(ref2)
    terminate_group(ref2, grace=2.0, owned=writes_under(folder))
    time.sleep(0.1)
    try:
        with open(f"/proc/{child}/stat") as f:
            result["member_alive"] = f.read().split(") ")[1][0] not in "ZX"
    except OSError:
        result["member_alive"] = False
    print(json.dumps(result))
""")


def _namespaces_available() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True)
    return probe.returncode == 0


def test_a_reused_group_number_is_not_signalled(tmp_path):
    if not _namespaces_available():  # CI runs as root with unshare: there it runs
        pytest.skip("needs root and unshare (a PID namespace whose next pid can be set)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", REUSE,
         str(tmp_path)], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["reused"], "the namespace did not hand the number on; nothing was tested"
    # the number is somebody else's now: not running for us, not signalled, they live
    assert r["running_after_reuse"] is False
    assert r["signalled"] == 0
    assert r["theirs_alive"] is True
    # a member of ours that outlived its leader is found by its proof, and stopped
    assert r["member_running"] is True and r["member_without_proof"] is False
    assert r["member_alive"] is False


def test_killpg_is_called_only_by_the_decider():
    """Every group signal of the package passes core/process_groups.py (the rule lives in
    one place; a new ``os.killpg`` elsewhere would bypass it)."""
    offenders = []
    for base in ("jupyter_cloudtik", "emulators/cloudtik_emulators"):
        for path in sorted((ROOT / base).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel == DECIDER:
                continue
            tree = parse(path.read_text(), str(rel))
            for node in ast.walk(tree):
                named = isinstance(node, ast.Attribute) and node.attr == "killpg"
                imported = isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                    a.name == "killpg" for a in node.names)
                if named or imported:
                    offenders.append(f"{rel}:{node.lineno}")
    left = offenders
    assert not left, f"os.killpg outside {DECIDER}: {left}"
