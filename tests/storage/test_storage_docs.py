"""The storage examples of README.md and docs/storage.md, run in a real kernel as written.

Stand-ins: the S3 server of the docs (AWS for ``s3://my-bucket``, ``https://s3.example.org``)
is the tests' ``rclone serve s3``: its URL is given as the endpoint; ``--ask`` prompts are
answered with its keys, as a user types them.  The Vault of docs/storage.md is the tests'
OpenBao.  One kernel runs every block, in the storage tests' working folder.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import doc_examples as docs
import pytest
import yaml

pytestmark = pytest.mark.timeout(300)


def test_storage_examples_in_a_kernel(state_dir, workdir, s3_server, tmp_path):
    bucket = s3_server.root / "my-bucket"
    for run in ("run1", "run2"):
        (bucket / "project" / "inputs" / run).mkdir(parents=True, exist_ok=True)
        (bucket / "project" / "inputs" / run / "x.csv").write_text(f"{run}\n")
    (s3_server.root / "results").mkdir(exist_ok=True)
    env = {**os.environ, "CLOUDTIK_STATE_DIR": str(state_dir),
           "CLOUDTIK_WORKDIR": str(workdir), "CLOUDTIK_PROGRESS": "text",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    answers = {"access_key_id": s3_server.user, "secret_access_key": s3_server.password}
    readme = docs.block("README.md", "Storage")
    guide = docs.block("docs/storage.md", "Storage")
    api = docs.block("docs/storage.md", "Python API")
    nodes_cfg = docs.block("docs/storage.md", "Cluster nodes", lang="yaml")
    stage = docs.block("docs/storage.md", "Cluster nodes", lang="python")
    assert "s3://my-bucket/project " in readme.text and "https://s3.example.org" in guide.text
    with docs.Kernel(workdir, env) as k:
        k.cell("%load_ext jupyter_cloudtik")
        done = k.run(readme, answers=answers, text=readme.text.replace(
            "s3://my-bucket/project ", f"s3://my-bucket/project -o endpoint={s3_server.url} "))
        assert "inputs" in done[1][1] + done[1][2], done[1]
        assert (workdir / "inputs" / "run2" / "x.csv").read_text() == "run2\n"
        assert (workdir / "storage" / "data" / "inputs" / "run1" / "x.csv").exists()
        k.cell("%storage remove data")  # the guide adds it again
        assert not (workdir / "storage" / "data" / "inputs").exists()
        k.run(guide, answers=answers,
              text=guide.text.replace("https://s3.example.org", s3_server.url))
        k.cell("%storage remove data")
        # the Python API, with "your keys" in ak and sk
        k.cell(f"ak, sk = {s3_server.user!r}, {s3_server.password!r}")
        k.run(api, text=api.text.replace("https://s3.example.org", s3_server.url)
              .replace("s3://bucket/x", "s3://my-bucket/project"))
        # a cluster with the storages on its nodes
        k.cell(f"%storage add results s3://results -o endpoint={s3_server.url} --read-write "
               f"-o access_key_id={s3_server.user} -o secret_access_key={s3_server.password}")
        k.cell("from jupyter_cloudtik import Cluster\n"
               f"c = Cluster.up({yaml.safe_load(nodes_cfg.text)!r}, workers=1, progress=False)\n"
               "client = c.client()")
        staged = Path("/tmp/in")  # where the doc's function copies to
        try:
            k.run(stage)
            assert (staged / "x.csv").read_text() == "run1\n"
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        k.cell("client.close(); c.down()")
