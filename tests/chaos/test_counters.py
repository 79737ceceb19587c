"""The chaos tests' counters see what they count (else a 0 would prove nothing): a process
tied to the folder only by its working folder, its environment or its output; a JSON value
of the store that does not parse; a broken ``.json`` file of the state folder."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jupyter_cloudtik.core.operations import Operations
from jupyter_cloudtik.core.store import Store

from .conftest import our_processes, state_corruption, wait_no_processes

pytestmark = pytest.mark.chaos

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_orphans_are_found_by_folder_environment_or_output(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    assert our_processes(base) == []
    with open(base / "out.log", "wb") as out:
        procs = [subprocess.Popen(SLEEP, cwd=base),
                 subprocess.Popen(SLEEP, env={**os.environ, "SOME_DIR": str(base / "x")}),
                 subprocess.Popen(SLEEP, stdout=out)]
    try:
        found = {p.pid for p in our_processes(base)}
        assert found == {p.pid for p in procs}
        assert our_processes(base, keep={procs[0].pid}) != []
        left = wait_no_processes(base, set(), timeout=0.5)  # they do not idle out
        assert len(left) == 3
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert wait_no_processes(base, set(), timeout=5) == []


def test_state_that_does_not_read_back_is_reported(tmp_path):
    store = Store(tmp_path)
    op = Operations(store).start("cluster.up", "cluster:a", params={"x": 1})
    assert state_corruption(tmp_path) == []
    with store.transaction() as conn:
        conn.execute("UPDATE operations SET params = ? WHERE id = ?", ('{"x": 1', op.id))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "info.json").write_text("{not json")
    problems = state_corruption(tmp_path)
    assert len(problems) == 2, problems
    assert problems[0].startswith("operations.params: not JSON")
    assert problems[1].startswith("sub/info.json")
    store.close()
