"""docs/hpc.md's "Choosing a job's environment" blocks, run from a copy of ``examples/``:
the HPC config file, the Python API (every choice: the session default, a declared
subset, a requirements file, the site's Python after a ``module load`` line) and the
magic.

Stand-ins, each asserted to be in the block: the two ``slurm`` backends over SSH
(``host``, ``user``) are ``local`` backends here (jobs on this machine as this user, so
the session's default is this session's interpreter itself, ``session-interpreter``,
where over SSH it is ``built``: asserted as such); ``module load cray-python/3.11`` (no
module system here) is a line that puts a folder first on PATH whose ``python3`` says it
was loaded and runs the session's interpreter (which has papermill), so the job proves
the setup line ran before the system's ``python3`` was chosen.  The built environments
are real: venvs made by this machine's Python in the backend's work folder.
"""

from __future__ import annotations

import re
import shutil
import sys

import doc_examples
import pytest

ROOT = doc_examples.ROOT
HEADING = "Choosing a job's environment"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_choosing_a_jobs_environment_as_documented(hpc_state, tmp_path, monkeypatch, ip):
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples", work)
    monkeypatch.chdir(work)
    site_bin = tmp_path / "site-python" / "bin"
    site_bin.mkdir(parents=True)
    (site_bin / "python3").write_text(
        f"#!/bin/sh\necho 'site python3 loaded' >&2\nexec {sys.executable} \"$@\"\n")
    (site_bin / "python3").chmod(0o755)

    config, api, magic = doc_examples.blocks("docs/hpc.md", HEADING)
    assert (config.lang, api.lang, magic.lang) == ("yaml", "python", "python")
    text = config.text
    for old, new in [
        ("    type: slurm\n    host: daint.example.org\n    user: me\n",
         f"    type: local\n    workdir: {tmp_path / 'daint-jobs'}\n"),
        ('setup: ["module load cray-python/3.11"]',
         f'setup: ["export PATH={site_bin}:$PATH"]'),
    ]:
        assert old in text, f"the doc's config block no longer has {old!r}"
        text = text.replace(old, new)
    (tmp_path / "hpc.yaml").write_text(text)
    monkeypatch.setenv("CLOUDTIK_HPC_CONFIG", str(tmp_path / "hpc.yaml"))

    # the Python block as a user types it, cell by cell, each "# -> VALUE" checked
    ip.init_user_ns()
    for source in doc_examples.cells(api):
        result = ip.run_cell(source, store_history=True)
        assert result.error_before_exec is None and result.error_in_exec is None, (
            source, result)
        expected = re.search(r"#\s*->\s*(.+?)\s*$", source.splitlines()[-1])
        if expected:
            assert repr(result.result) == expected.group(1), (source, result.result)
    ns = ip.user_ns
    default, subset, locked, site = (ns[k] for k in ("default", "subset", "locked", "site"))
    for job in (default, subset, locked, site):
        assert job.state == "succeeded", (job.id, job.logs()[-2000:])
        assert "alpha=0.5 result=" in job.logs(), job.logs()[-1000:]
    assert default.info.environment["mode"] == "session-interpreter"  # over SSH: 'built'
    assert default.info.environment["python"] == sys.executable
    built = subset.info.environment
    envs = tmp_path / "daint-jobs" / ".cloudtik-envs"
    assert (envs / built["hash"] / ".cloudtik-complete").is_file()
    assert "building environment" in subset.logs()
    assert "building environment" not in locked.logs()  # the same environment, reused
    assert locked.info.environment["mode"] == "built"
    assert "site python3 loaded" in site.logs()  # the setup line ran before python3
    assert site.info.environment["python"] == "python3"

    result = ip.run_cell(magic.text)
    assert result.error_before_exec is None and result.error_in_exec is None, result
    job = result.result
    assert job.state == "succeeded", job.logs()[-2000:]
    assert job.info.environment["hash"] == built["hash"]
