"""Notebook jobs sharing a host do not take each other's kernel ports (papermill_runner.py).

With the kernel on TCP, jupyter_client picks its five ports in the papermill process
(bind to port 0, close) and the kernel binds them seconds later; another process binding
a port in between can be handed one, and that job's kernel dies with "Address already in
use".  Several jobs start at once through the local backend while a neighbour process
binds and holds ephemeral ports the way other jobs' kernels do: it makes the window
likely to be hit on a quiet host.  Measured on a 2-core host: with the kernel on TCP (the
``python -m papermill`` line before papermill_runner) this test failed 5 runs of 5, losing
3 to 6 of its 8 jobs to "Address already in use"; without the neighbour, 30 plain
papermill runs (10 at once, 3 rounds) all succeeded.  Every job must succeed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

from jupyter_cloudtik.hpc.commands import build_spec

from .conftest import _nb

JOBS = 8

# binds ports on loopback as fast as a few kernels starting would, holding each for 2 s
_NEIGHBOUR = textwrap.dedent("""
    import collections, socket, sys, time
    end = time.monotonic() + float(sys.argv[1])
    held = collections.deque()
    n = 0
    while time.monotonic() < end:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        held.append((time.monotonic(), s))
        n += 1
        while held and (held[0][0] < time.monotonic() - 2 or len(held) > 3000):
            held.popleft()[1].close()
        if n % 100 == 0:
            time.sleep(0.05)
""")


def _stream_text(nb_bytes: bytes) -> str:
    nb = json.loads(nb_bytes)
    return "".join("".join(o.get("text") or "") for c in nb["cells"]
                   for o in c.get("outputs", []) if o.get("output_type") == "stream")


def test_concurrent_notebook_jobs_on_one_host_all_succeed(make_client, notebooks, tmp_path):
    client = make_client({"local": {"type": "local"}})
    neighbour = subprocess.Popen([sys.executable, "-c", _NEIGHBOUR, "120"])
    try:
        t0 = time.monotonic()
        infos = [client.submit(build_spec(str(notebooks["param"]), parameters={"factor": k},
                                          inputs=[str(notebooks["data"])]), "local")
                 for k in range(1, JOBS + 1)]
        done = [client.wait(i.id, timeout=150) for i in infos]
        elapsed = time.monotonic() - t0
    finally:
        neighbour.kill()
        neighbour.wait()
    failed = {i.id: (i.reason, client.logs(i.id).text[-600:]) for i in done
              if i.state != "succeeded"}
    assert not failed, failed
    for k, info in enumerate(done, start=1):
        paths = {p.name: p for p in client.fetch(info.id, tmp_path / info.id)}
        assert paths["result.txt"].read_text() == str(6 * k)
        executed = paths["param.out.ipynb"].read_bytes()
        assert f"result {6 * k}" in _stream_text(executed)
        # the kernel ran on IPC sockets: no TCP warning from ipykernel in the log
        assert "running over TCP" not in client.logs(info.id).text
    print(f"{JOBS} concurrent jobs in {elapsed:.1f} s")


def test_runner_keeps_the_cli_exit_codes_and_error_cell(make_client, tmp_path):
    """A failed cell: non-zero and papermill's error cell; a dead kernel: 138, as the CLI."""
    client = make_client({"local": {"type": "local"}})
    books = {"fail": _nb(("x = 1", ["parameters"]), ("print('before', x)\n1 / 0", [])),
             "dead": _nb(("x = 1", ["parameters"]), ("import os\nos._exit(3)", []))}
    infos = {}
    for name, nb in books.items():
        path = tmp_path / f"{name}.ipynb"
        path.write_text(json.dumps(nb))
        infos[name] = client.submit(build_spec(str(path), parameters={"x": 5}), "local")
    fail = client.wait(infos["fail"].id, timeout=120)
    dead = client.wait(infos["dead"].id, timeout=120)
    assert fail.state == "failed" and fail.exit_code == 1, (fail.exit_code, fail.reason)
    assert fail.error["ename"] == "ZeroDivisionError"
    executed = {p.name: p for p in client.fetch(fail.id, tmp_path / "f")}["fail.out.ipynb"]
    nb = json.loads(executed.read_bytes())
    assert any("papermill-error-cell-tag" in (c["metadata"].get("tags") or [])
               for c in nb["cells"])
    assert "before 5" in _stream_text(executed.read_bytes())  # parameters.json was read
    log = client.logs(fail.id).text
    assert "Executing Cell" in log and "PapermillExecutionError" in log  # --log-output
    assert dead.state == "failed" and dead.exit_code == 138, (dead.exit_code, dead.reason)
    assert "DeadKernelError" in client.logs(dead.id).text


def test_socket_folder_is_private_and_short_enough(tmp_path, monkeypatch):
    """A temporary folder too deep for a unix socket's path (a site's long TMPDIR): the
    sockets go to a new 0700 folder in /tmp instead."""
    import os
    import stat
    import tempfile

    from jupyter_cloudtik.hpc import papermill_runner

    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    folder = papermill_runner.ipc_dir()
    assert folder is not None
    try:
        assert folder.startswith("/tmp/ct-"), folder
        assert len(os.path.join(folder, "k-99")) <= papermill_runner.SOCKET_PATH_MAX
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        assert not list(deep.iterdir())  # the one made under the deep folder was removed
    finally:
        os.rmdir(folder)


def test_the_kernel_listens_on_sockets_a_cancel_removes(make_client, notebooks, tmp_path,
                                                         monkeypatch):
    """While the job runs its kernel's five sockets and connection file are in a private
    folder under the job's temporary folder; cancelling the job (SIGTERM to its processes)
    removes it (before, each cancel left the folder behind)."""
    from .conftest import wait_for

    tmp = tmp_path / "t"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # the local backend's jobs get our environment
    client = make_client({"local": {"type": "local"}})
    info = client.submit(build_spec(str(notebooks["long"]), parameters={"seconds": 300}),
                         "local")
    wait_for(lambda: "sleeping" in client.logs(info.id).text, 90, what="the job's output")
    folders = [p for p in tmp.iterdir() if p.name.startswith("ct-")]
    assert len(folders) == 1, list(tmp.iterdir())
    sockets = sorted(p.name for p in folders[0].iterdir() if p.is_socket())
    assert sockets == [f"k-{i}" for i in range(1, 6)]
    assert json.loads((folders[0] / "kernel.json").read_text())["transport"] == "ipc"
    client.cancel(info.id)
    assert client.wait(info.id, timeout=60).state == "cancelled"
    # the folder with the connection file (mkstemp's file in TMPDIR before) and sockets
    wait_for(lambda: not list(tmp.iterdir()), 10, what="the socket folder to go")
