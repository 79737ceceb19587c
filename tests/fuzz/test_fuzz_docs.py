"""The campaign commands of docs/security.md#fuzzing, run as written but seconds long: all
targets through fuzz/run.py, one target by hand with a scratch corpus, and the replay of one
saved input (a committed seed stands in for the ``crash-*`` file)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import doc_examples as docs

ROOT = Path(__file__).resolve().parents[2]


def test_the_documented_campaign_commands_run(tmp_path):
    b = docs.block("docs/security.md", "Fuzzing", 0, lang="bash")
    seed = sorted((ROOT / "fuzz" / "corpus" / "slurm").iterdir())[0]
    shutil.copy(seed, tmp_path / "crash-1234abcd")
    text = (b.text.replace("--seconds 3600", "--seconds 1")
            .replace("-max_total_time=600", "-max_total_time=1")
            .replace("/tmp/fuzz-corpus", str(tmp_path / "corpus"))
            .replace(" crash-1234abcd", f" {tmp_path / 'crash-1234abcd'}"))
    assert text.count(str(tmp_path)) == 3, text  # every stand-in took
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = docs.bash(b, ROOT, env, timeout=300, text=text)
    kept = {p.name for p in (tmp_path / "corpus").iterdir()}
    assert {"slurm", "config", "zones"} <= kept, kept  # --keep: a folder per target
    ok = [line.split()[0] for line in out.splitlines() if line.split()[1:2] == ["ok"]]
    assert len(ok) >= 10, out  # run.py's table: every target, each ok
