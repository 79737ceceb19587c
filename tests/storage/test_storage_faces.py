"""The faces: `jupyter cloudtik storage ...` in a subprocess and %storage in a real kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient


def _cli(*args, env, check=True):
    proc = subprocess.run([sys.executable, "-m", "jupyter_cloudtik", "storage", *args],
                          capture_output=True, text=True, env=env, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {proc.stderr}")
    return proc


@pytest.fixture
def face_env(state_dir, workdir):
    env = dict(os.environ)
    env["CLOUDTIK_STATE_DIR"] = str(state_dir)
    env["CLOUDTIK_WORKDIR"] = str(workdir)
    env["CLOUDTIK_PROGRESS"] = "text"
    return env


def test_cli(face_env, s3_server, tmp_path):
    (s3_server.root / "cli-bucket").mkdir(exist_ok=True)
    (s3_server.root / "cli-bucket" / "in.txt").write_text("from s3")
    env = {**face_env, "MY_AK": s3_server.user, "MY_SK": s3_server.password}
    out = _cli("add", "clis3", "s3://cli-bucket", "-o", "provider=Rclone", "-o",
               f"endpoint={s3_server.url}", "--from-env", "access_key_id=MY_AK",
               "--from-env", "secret_access_key=MY_SK", "--read-write", env=env)
    assert "clis3" in out.stdout and s3_server.password not in out.stdout
    listed = json.loads(_cli("list", "--json", env=env).stdout)
    assert listed[0]["options"]["secret_access_key"] == "<secret>"
    assert "answers" in _cli("test", "clis3", env=env).stdout
    assert "in.txt" in _cli("ls", "clis3:", env=env).stdout
    cp = _cli("cp", "clis3:", str(tmp_path / "got"), env=env)
    assert (tmp_path / "got" / "in.txt").read_text() == "from s3"
    assert "copy clis3:" in cp.stdout and "1 file(s)" in cp.stdout
    assert "transfer" in cp.stderr  # progress lines
    bad = _cli("add", "x", "--backend", "s3", "-o", "nope=1", env=env, check=False)
    assert bad.returncode == 2 and "options.nope" in bad.stderr and "Traceback" not in bad.stderr
    missing = _cli("ls", "ghost:", env=env, check=False)
    assert missing.returncode == 2 and "no storage named 'ghost'" in missing.stderr
    _cli("remove", "clis3", env=env)
    assert json.loads(_cli("list", "--json", env=env).stdout) == []


def test_magics_in_a_kernel(face_env, s3_server, tmp_path, monkeypatch):
    for k, v in face_env.items():
        monkeypatch.setenv(k, v)
    (s3_server.root / "nb-bucket").mkdir(exist_ok=True)
    (s3_server.root / "nb-bucket" / "a.csv").write_text("x,y\n1,2\n")
    secret_file = tmp_path / "sk"
    secret_file.write_text(s3_server.password)
    cells = [
        "%load_ext jupyter_cloudtik",
        f"sk = open({str(secret_file)!r}).read()",
        f"%storage add nb s3://nb-bucket -o provider=Rclone -o endpoint={s3_server.url} "
        f"-o access_key_id={s3_server.user} -o secret_access_key=$sk",
        "%storage test nb",
        "%storage ls nb:             # it's the bucket (a comment, as in the README)",
        f"%storage cp nb: {tmp_path / 'nbcopy'}",
        "%storage list",
        "%storage ls ghost:",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True).execute()
    outs = [c.outputs for c in nb.cells]

    def text(i):
        return "".join(o.get("text", "") + json.dumps(o.get("data", {})) +
                       o.get("evalue", "") for o in outs[i])

    assert "storage 'nb'" in text(2)
    assert "answers" in text(3)
    assert "a.csv" in text(4)
    assert "1 file(s)" in text(5)
    assert (tmp_path / "nbcopy" / "a.csv").read_text() == "x,y\n1,2\n"
    assert "<table>" in text(6) and "nb-bucket" in text(6)
    # IPython shows a UsageError as one line on stderr, without a traceback
    assert "UsageError: no storage named 'ghost'" in text(7) and "Traceback" not in text(7)
    assert s3_server.password not in nbformat.writes(nb)
