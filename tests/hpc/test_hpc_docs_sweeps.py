"""docs/hpc.md's "Sweeps" blocks, run as written on the project's test Slurm (configured
as the doc's ``daint`` backend) from a copy of ``examples/``: the Python API, the magics
and the command line.  Nothing in the blocks is replaced."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import doc_examples
import pytest
import yaml

ROOT = doc_examples.ROOT


@pytest.mark.slow
def test_sweeps_section_on_a_real_slurm(slurm, tmp_path, monkeypatch, ip):
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples", work)
    monkeypatch.chdir(work)
    config = tmp_path / "hpc.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "backends": {
                    "daint": {
                        "type": "slurm",
                        "env": slurm.env,
                        "workdir": str(tmp_path / "daint-jobs"),
                    }
                }
            }
        )
    )
    monkeypatch.setenv("CLOUDTIK_HPC_CONFIG", str(config))

    api, magics, cli = (doc_examples.block("docs/hpc.md", "Sweeps", i) for i in range(3))
    assert api.lang == "python" and magics.lang == "python" and cli.lang == "bash"
    scope: dict = {}
    exec(compile(api.text, api.id, "exec"), scope)
    sweep, table = scope["sweep"], scope["table"]
    info = sweep.info
    assert info.mode == "array" and info.state == "succeeded", str(sweep)
    arrays = {e["native_id"].split("_")[0] for e in info.elements}
    assert len(arrays) == 1  # one sbatch --array for the 4 elements
    assert list(table["result"]) == [6.0, 60.0, 30.0, 300.0]  # alpha * n * (1+2+3)
    assert all(o == ["result.csv"] for o in table["outputs"])

    ip.init_user_ns()  # an earlier test's teardown cleared it (the displayhook needs _oh)
    result = ip.run_cell(magics.text)
    assert result.error_in_exec is None and result.error_before_exec is None, result
    magic_sweep = ip.user_ns["sweep"]
    assert magic_sweep.state == "succeeded", str(magic_sweep)
    assert [r["result"] for r in magic_sweep.client.sweep_results(magic_sweep.id)] == [6.0, 30.0]

    r = subprocess.run(
        ["bash", "-e", "-c", cli.text],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )
    assert r.returncode == 0, r.stderr
    assert "succeeded" in r.stdout and "result" in r.stdout, r.stdout
    done = json.loads((work / "sweep.json").read_text())
    assert done["state"] == "succeeded" and done["counts"]["succeeded"] == 2, done
