"""Secrets never leak (logs, events, answers, errors, ps, files) and shell-injection attempts
in names, paths and option values do nothing."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

import pytest
from storage_helpers import ps_output

from jupyter_cloudtik.core.errors import CloudTikError
from jupyter_cloudtik.storage.mounts import fuse_problem

INJECTIONS = ["x; touch pwned", "$(touch pwned)", "`touch pwned`", "a|touch pwned",
              "--config=/etc/passwd", "-rf"]


class PsSampler:
    """Samples every process's command line while the test runs."""

    def __init__(self) -> None:
        self.samples: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(ps_output())
            self._stop.wait(0.05)

    def __enter__(self) -> PsSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def test_secrets_never_leak(client, s3_server, webdav_server, sftp_server, tmp_path,
                            caplog, capsys, state_dir):
    caplog.set_level(logging.DEBUG)
    secrets = [s3_server.password, webdav_server.password, sftp_server.password,
               "wrong-but-secret-9f8e7d"]
    seen: list[str] = []
    (s3_server.root / "leak-check").mkdir(exist_ok=True)
    (s3_server.root / "leak-check" / "f.txt").write_text("data")
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "g.txt").write_text("g")

    with PsSampler() as ps:
        for srv in (s3_server, webdav_server, sftp_server):
            name = f"leak{srv.kind}"
            info = client.add(name, srv.kind, srv.storage_options(),
                              source="leak-check" if srv.kind == "s3" else "",
                              read_only=False)
            seen.append(json.dumps(info.to_dict()))
            seen.append(json.dumps(client.test(name)))
            seen.append(json.dumps(client.ls(f"{name}:")))
            op = client.start_copy(str(tmp_path / "up"), f"{name}:uploaded")
            seen.append(json.dumps(client.wait(op)))
            bad = f"bad{srv.kind}"
            client.add(bad, srv.kind, srv.storage_options(password="wrong-but-secret-9f8e7d"))
            for call in (lambda b=bad: client.test(b), lambda b=bad: client.ls(f"{b}:"),
                         lambda b=bad: client.wait(client.start_copy(f"{b}:", str(tmp_path)))):
                with pytest.raises(CloudTikError) as e:
                    call()
                seen.append(e.value.message)
                seen.append(repr(e.value))
        if fuse_problem() is None:
            client.wait(client.start_mount("leaks3"))
            seen.append(json.dumps(client.mounts()))
            time.sleep(0.5)  # let ps see the mount process
            client.wait(client.start_unmount("leaks3"))
        seen.append(json.dumps([i.to_dict() for i in client.list()]))

    events = client.manager.store.query("SELECT message, data FROM events")
    seen += [f"{r[0]} {r[1]}" for r in events]
    ops = client.manager.store.query("SELECT params, result, reason FROM operations")
    seen += [repr(tuple(r)) for r in ops]
    seen.append(caplog.text)
    captured = capsys.readouterr()
    seen += [captured.out, captured.err]
    for f in Path(state_dir).rglob("*"):
        if f.is_file():
            seen.append(f.read_bytes().decode(errors="replace"))
    assert not list((Path(state_dir) / "storage" / "run").glob("*.conf")), \
        "temporary rclone configs were left behind"
    assert ps.samples and any("lsjson" in s for s in ps.samples)
    if fuse_problem() is None:  # the mount process was seen, with only a config path
        assert any(" mount " in s and "--config" in s for s in ps.samples)
    everything = "\n".join(seen)
    for secret in secrets:
        assert secret not in everything, "a secret leaked into answers, events, logs or files"
        for sample in ps.samples:
            assert secret not in sample, "a secret was visible in ps"


def _no_pwned(*roots: Path) -> None:
    for root in roots:
        found = [p for p in Path(root).rglob("pwned*") if p.name == "pwned"]
        assert not found, f"an injected command ran: {found}"


def test_injection_attempts_do_nothing(client, s3_server, tmp_path, workdir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (s3_server.root / "inject").mkdir(exist_ok=True)
    client.add("inj", "s3", s3_server.storage_options(), source="inject", read_only=False)

    for bad in INJECTIONS:
        # names: refused before anything runs
        with pytest.raises(CloudTikError) as e:
            client.add(bad, "s3", s3_server.storage_options())
        assert e.value.field == "name"

    local = tmp_path / "payload"
    local.mkdir()
    for i, bad in enumerate(INJECTIONS):
        (local / f"f{i}.txt").write_text(bad)
        # remote paths are literal object names, never flags or commands
        client.wait(client.start_copy(str(local), f"inj:{bad}"))
        assert (s3_server.root / "inject" / bad.lstrip("/") / f"f{i}.txt").exists() or any(
            (s3_server.root / "inject").rglob(f"f{i}.txt"))
        listing = client.ls(f"inj:{bad}")
        assert f"f{i}.txt" in [e["name"] for e in listing["entries"]]
        # local paths with the same text are literal folders too
        dest = tmp_path / "down" / bad.replace("/", "_")
        client.wait(client.start_copy(f"inj:{bad}", str(dest)))
        assert (dest / f"f{i}.txt").read_text() == bad

    # option values and sources reach rclone only inside the 0600 config file
    client.add("inj2", "webdav", {"url": "http://127.0.0.1:9/$(touch pwned)",
                                  "user": "`touch pwned`", "pass": "x; touch pwned"},
               source="$(touch pwned)")
    with pytest.raises(CloudTikError):
        client.test("inj2")
    with pytest.raises(CloudTikError):
        client.add("inj3", "webdav", {"url": "http://x\n[evil]\ntype = local"})

    # '..' cannot climb out of a storage's source
    with pytest.raises(CloudTikError) as e:
        client.ls("inj:../other-bucket")
    assert e.value.field == "path"
    _no_pwned(tmp_path, workdir, s3_server.root, Path(os.getcwd()))


KILLED_INSIDE_CONFIG_FILE = """
import os, signal, sys
from pathlib import Path
from jupyter_cloudtik.storage.rclone import Remote, config_file
remote = Remote("s3", {"provider": "Rclone"}, {"secret_access_key": sys.argv[2]})
with config_file(Path(sys.argv[1]), {"r": remote}) as path:
    print(path, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # as a server killed in the middle of a copy
"""


def test_a_killed_process_s_rclone_config_is_removed_by_the_next_manager(
        make_client, state_dir):
    """A config with a credential in plain text, left by a process SIGKILLed inside
    ``config_file`` (tests/chaos: the server killed during a copy), is deleted when the
    next storage manager opens the state folder; a live process's config stays."""
    import subprocess
    import sys

    from jupyter_cloudtik.storage.rclone import Remote, write_config

    run_dir = Path(state_dir) / "storage" / "run"
    secret = "chaos-SECRET-" + os.urandom(6).hex()
    r = subprocess.run([sys.executable, "-c", KILLED_INSIDE_CONFIG_FILE, str(run_dir), secret],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == -9, r.stderr
    left = Path(r.stdout.strip())
    assert left.parent == run_dir and secret in left.read_text()  # what the kill leaves
    mine = write_config(run_dir, {"r": Remote("s3", {"provider": "Rclone"})})
    foreign = run_dir / "rclone-notapid.conf"  # not written by write_config: left alone
    foreign.write_text("")
    make_client()  # a face opening the storage feature: a server's start, a kernel, the CLI
    assert not left.exists(), "a killed process's credentials stayed on disk"
    assert mine.exists() and foreign.exists()
    mine.unlink()
    foreign.unlink()
