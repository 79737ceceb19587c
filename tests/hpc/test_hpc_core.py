"""Core pieces the HPC feature added: ``Operations.adopt`` and the job model's parsing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jupyter_cloudtik.core.errors import ConfigError
from jupyter_cloudtik.core.operations import Operations
from jupyter_cloudtik.core.store import Store
from jupyter_cloudtik.core.units import format_duration, parse_duration
from jupyter_cloudtik.hpc.notebook import find_error


def _op_of_dead_process(state_dir) -> str:
    code = ("import sys; from jupyter_cloudtik.core.store import Store; "
            "from jupyter_cloudtik.core.operations import Operations; "
            "op = Operations(Store(sys.argv[1])).start('hpc.job', 'job:x', exclusive=False); "
            "print(op.id)")
    out = subprocess.run([sys.executable, "-c", code, str(state_dir)], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def test_adopt_takes_over_only_what_nobody_else_owns(state_dir):
    ops = Operations(Store(state_dir))
    mine = ops.start("hpc.job", "job:a", exclusive=False)
    assert ops.adopt(mine.id).owner_pid == mine.owner_pid  # already ours: unchanged
    orphan = _op_of_dead_process(state_dir)
    adopted = ops.adopt(orphan, "watched here now")
    assert adopted.state == "running" and adopted.owner_pid == os.getpid()
    assert [e.step for e in ops.events(orphan)][-1] == "adopt"
    # an operation a reader marked interrupted is re-opened by the adopter
    orphan2 = _op_of_dead_process(state_dir)
    ops.request_cancel(orphan2)  # a reader notices the dead owner: "interrupted"
    assert ops.get(orphan2).state == "failed"
    assert ops.adopt(orphan2).state == "running"
    # finished operations stay finished
    ops.finish(mine.id, "succeeded")
    assert ops.adopt(mine.id) is None


@pytest.mark.parametrize("text,seconds", [(90, 5400), ("30m", 1800), ("2h", 7200),
                                          ("1:30:00", 5400), ("2-00:00:00", 172800),
                                          ("45s", 45), ("10:00", 600)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds
    assert parse_duration(format_duration(seconds)) == seconds


def test_bad_durations():
    for bad in ("soon", "-5", 0, "0m"):
        with pytest.raises(ConfigError):
            parse_duration(bad)


def test_find_error_skips_papermill_banner():
    nb = {"cells": [
        {"cell_type": "markdown", "metadata": {"tags": ["papermill-error-cell-tag"]},
         "source": "An Exception was encountered"},
        {"cell_type": "code", "metadata": {}, "execution_count": 1, "source": "x = 1",
         "outputs": []},
        {"cell_type": "code", "metadata": {}, "execution_count": 2, "source": "1/0",
         "outputs": [{"output_type": "error", "ename": "ZeroDivisionError",
                      "evalue": "division by zero", "traceback": ["\x1b[31mTraceback"]}]}]}
    err = find_error(nb)
    assert err["cell"] == 1 and err["execution_count"] == 2
    assert err["traceback"] == "Traceback"
    assert find_error({"cells": []}) is None


def test_script_environment_activation():
    import sys

    from jupyter_cloudtik.hpc import papermill_runner, script
    from jupyter_cloudtik.hpc.base import Environment, JobSpec, StageIn, Submission
    from jupyter_cloudtik.hpc.provenance_snapshot import notebook_run_line

    spec = JobSpec(notebook="/x/a.ipynb", parameters={"n": 1}, outputs=["*.csv"])
    session = Environment.session()
    sub = Submission("j1", "tok", spec, session, files={"a.ipynb": "/x/a.ipynb"},
                     inputs=[StageIn("in.csv", "https://example.org/in.csv", "direct")],
                     output_notebook="a.out.ipynb", stage_out="/results")
    text = script.render(sub, directives=["#SBATCH --nodes=1"], job_dir="/jobs/j1")
    assert text.startswith("#!/bin/bash\n#SBATCH --nodes=1\n")
    assert f"CT_PYTHON={sys.executable}" in text
    assert "curl -fsSL -o in.csv https://example.org/in.csv" in text
    # papermill_runner's text run with the job's interpreter (papermill only on the system),
    # between the provenance snapshots, in one interpreter
    args = 'a.ipynb a.out.ipynb parameters.json python3 "$CT_JOB_DIR"'
    line = notebook_run_line("", papermill_runner.source(), args)
    assert line.split('"$CT_PYTHON"', 1)[1] in text
    assert f".cloudtik/prov-before.json .cloudtik/prov-after.json {args}\n" in text
    assert text.count('prov-before.json') == 1  # one interpreter for the snapshots and the run
    assert "mkdir -p /results" in text and "for f in a.out.ipynb *.csv; do" in text
    assert "a.ipynb|in.csv" in text  # inputs are not copied out as results
    # an Apptainer image instead of the session's interpreter
    env = session.merged({"container": "docker://ghcr.io/me/img:1", "setup": ["module load x"]})
    assert env.python is None and env.venv is None
    text = script.render(Submission("j2", "t", spec, env, output_notebook="a.out.ipynb"))
    assert ('CT_RUN=(apptainer exec --bind "$CT_JOB_DIR" --pwd "$CT_JOB_DIR" '
            "docker://ghcr.io/me/img:1)") in text
    assert "CT_PYTHON=python3" in text and "module load x" in text
    env = Environment(conda_env="/opt/conda/envs/a", container_runtime="singularity")
    text = script.render(Submission("j3", "t", JobSpec(command=["echo", "a b"]), env))
    assert 'export PATH="$CONDA_PREFIX/bin:$PATH"' in text and "echo 'a b'" in text


def test_remote_names_stay_inside_the_job_folder():
    """The Slurm and FirecREST backends' own check of a file name on the remote system
    (behind the job manager's): inside the job's folder, or refused naming the field."""
    from jupyter_cloudtik.core.errors import ConfigError
    from jupyter_cloudtik.hpc.base import remote_inside

    folder = "/scratch/alice/cloudtik/j1"
    assert remote_inside(folder, "out/result.txt") == f"{folder}/out/result.txt"
    assert remote_inside(folder, "a/../b.txt") == f"{folder}/b.txt"
    for bad in ("../j2/secret", "..", "a/../../x", ""):
        with pytest.raises(ConfigError, match="outside the job's folder") as e:
            remote_inside(folder, bad)
        assert e.value.field == "name"


def test_notebook_parameters_are_read_the_way_papermill_reads_them():
    """Typed and commented assignments count (papermill's Python translator); no cell
    tagged ``parameters`` is None, not an empty list."""
    from jupyter_cloudtik.core.errors import ConfigError
    from jupyter_cloudtik.hpc.notebook import check_parameters, notebook_parameters

    def nb(src, tags):
        return {"nbformat": 4, "nbformat_minor": 5,
                "metadata": {"kernelspec": {"name": "python3", "language": "python",
                                            "display_name": "Python 3"}},
                "cells": [{"cell_type": "code", "metadata": {"tags": tags}, "source": src,
                           "outputs": [], "execution_count": None}]}

    tagged = nb("n = 3  # how many\nlabel: str = 'x'\nxs = [1,\n      2]\n", ["parameters"])
    assert notebook_parameters(tagged) == ["n", "label", "xs"]
    assert notebook_parameters(nb("n = 3", [])) is None
    assert check_parameters(tagged, {"n": 1, "xs": []}, notebook="a.ipynb") == []
    assert check_parameters(nb("n = 3", []), {}, notebook="a.ipynb") == []
    with pytest.raises(ConfigError) as e:
        check_parameters(tagged, {"n": 1, "m": 2, "k": 3}, notebook="a.ipynb")
    assert e.value.field == "parameters.m" and "m=2, k=3 are not parameters of" in e.value.message
    with pytest.raises(ConfigError, match="assigns: none"):
        check_parameters(nb("# nothing yet", ["parameters"]), {"m": 2}, notebook="a.ipynb")
    bare = nb("n = 3", ["parameters"])
    bare["metadata"] = {}  # no kernelspec, no language: the job's kernel (python3) says
    assert notebook_parameters(bare, "python3") == ["n"]
    # papermill inspects only Python: an R notebook's names are not known here, so only
    # the missing cell is refused (papermill fills a cell that exists), and the job says
    # that its names were not checked
    r_nb = nb("alpha <- 1", ["parameters"])
    r_nb["metadata"] = {"kernelspec": {"name": "ir", "language": "R", "display_name": "R"}}
    assert check_parameters(r_nb, {"beta": 2}, notebook="r.ipynb", kernel="ir") == [
        "parameters: the parameter names of an R notebook are not checked (papermill "
        "cannot inspect R code; it inspects Python): beta is injected into 'r.ipynb' after "
        "its cell tagged `parameters`, whether that cell assigns it or not"]
    r_nb["cells"][0]["metadata"]["tags"] = []
    with pytest.raises(ConfigError, match="no cell tagged 'parameters'"):
        check_parameters(r_nb, {"beta": 2}, notebook="r.ipynb", kernel="ir")
