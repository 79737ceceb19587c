"""The %cluster magics in a real kernel, driven through nbclient."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import nbformat
import pytest
from jupyter_core.utils import run_sync
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_cloudtik.clusters.magics import CloudTikMagics
from jupyter_cloudtik.providers.local.capacity import machine_cpus, machine_memory
from jupyter_cloudtik.providers.local.processes import find_marked_processes, is_alive

ROOT = Path(__file__).resolve().parents[1]


class Kernel:
    """Run cells one at a time in a real kernel, restartable, like a user would."""

    def __init__(self, client: NotebookClient) -> None:
        self.client = client
        self.index = 0

    def run(self, source: str, allow_error: bool = False):
        cell = new_code_cell(source)
        self.client.nb.cells.append(cell)
        try:
            self.client.execute_cell(cell, self.index)
        except CellExecutionError:
            if not allow_error:
                raise
        self.index += 1
        return cell.outputs

    def restart(self) -> None:
        run_sync(self.client.km.restart_kernel)(now=True)
        run_sync(self.client.kc.wait_for_ready)(timeout=60)

    def pid(self) -> int:
        return int(text_of(self.run("import os; print(os.getpid())")).strip())


def text_of(outputs) -> str:
    parts = []
    for o in outputs:
        if o.get("output_type") == "stream":
            parts.append(o["text"])
        elif o.get("output_type") in ("execute_result", "display_data"):
            parts.append(o["data"].get("text/html") or o["data"].get("text/plain", ""))
        elif o.get("output_type") == "error":
            parts.append(f"{o['ename']}: {o['evalue']}")
    return "\n".join(parts)


@pytest.fixture
def kernel(state_dir):
    nb = new_notebook()
    client = NotebookClient(nb, kernel_name="python3", timeout=180, allow_errors=False)
    with client.setup_kernel():
        yield Kernel(client)


def test_magics_end_to_end_with_kernel_restart(kernel, state_dir):
    kernel.run("%load_ext jupyter_cloudtik")
    kernel.run("%env CLOUDTIK_PROGRESS=auto")  # widgets, as in JupyterLab
    out = kernel.run("c = %cluster up --workers 2 --name nb\nc")
    widget_views = [o for o in out if "application/vnd.jupyter.widget-view+json" in
                    o.get("data", {})]
    assert widget_views, "no progress widget was shown"
    html = text_of(out)
    assert "nb" in html and "running" in html and "2/2" in html

    out = kernel.run("client = %cluster client nb\n"
                     "print('RESULT', client.submit(sum, range(101)).result())")
    assert "RESULT 5050" in text_of(out)

    # the progress bar ended full and green (widget state saved by nbclient)
    kernel.client.set_widgets_metadata()
    state = kernel.client.nb.metadata.get("widgets", {}).get(
        "application/vnd.jupyter.widget-state+json", {}).get("state", {})
    bars = [m["state"] for m in state.values() if m.get("model_name") == "FloatProgressModel"]
    assert bars and bars[-1]["value"] == 1.0 and bars[-1]["bar_style"] == "success"

    # bad input: one-line UsageError, nothing changed
    out = kernel.run("%cluster explode", allow_error=True)
    assert "UsageError" in text_of(out) and "invalid choice: 'explode'" in text_of(out)
    out = kernel.run("%cluster scale nb many", allow_error=True)
    assert "UsageError" in text_of(out) and "'many' is not a whole number" in text_of(out)
    out = kernel.run("%cluster status nope", allow_error=True)
    assert "UsageError: no cluster named 'nope'; clusters: nb" in text_of(out)
    out = kernel.run("%cluster up --workers 3 --name nb", allow_error=True)
    assert "cluster 'nb' exists with another config: pass another name" in text_of(out)
    out = kernel.run("%cluster up --name nb --memory 'a lot'  # it's a size", allow_error=True)
    assert "UsageError: memory: 'a lot' is not a size" in text_of(out)
    out = kernel.run(f"%cluster up --name nb --workers 2 --cores {machine_cpus() + 1}",
                     allow_error=True)
    # --cores reached the config
    assert "cluster 'nb' exists with another config: pass another name" in text_of(out)

    pids = find_marked_processes(state_dir, cluster="nb")
    assert len(pids) == 3

    old_pid = kernel.pid()
    kernel.restart()
    assert kernel.pid() != old_pid, "the kernel did not restart"
    kernel.run("%load_ext jupyter_cloudtik")
    out = kernel.run("%cluster status nb")
    assert "running" in text_of(out) and "2/2" in text_of(out)
    assert find_marked_processes(state_dir, cluster="nb") == pids  # untouched by the restart
    out = kernel.run("%cluster list")
    assert "nb" in text_of(out)
    out = kernel.run("%cluster down nb")
    assert "cluster 'nb' is stopped" in text_of(out)
    for pid in pids:
        assert not is_alive(pid)
    out = kernel.run("%cluster list")
    assert "No clusters" in text_of(out)


def test_readme_first_snippet_verbatim(kernel, state_dir):
    """The README's first snippet as written, on this machine (2 cores in CI): 4 workers
    that share the machine as LocalCluster(n_workers=4)'s would, not a capacity refusal;
    then a cluster oversubscribing the cores is started with a loud warning."""
    block = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)[1]
    lines = block.splitlines()
    assert lines[1].startswith("c = %cluster up --workers 4 "), lines
    out = kernel.run("\n".join(lines[:-1]))  # all but the last line: `%cluster down`
    assert "Error" not in text_of(out) and "WARNING" not in text_of(out), text_of(out)
    out = kernel.run("import json\nprint('WORKERS', json.dumps([[w['nthreads'], "
                     "w['memory_limit']] for w in client.scheduler_info()['workers']"
                     ".values()]))")
    workers = json.loads(text_of(out).split("WORKERS", 1)[1])
    threads = max(1, math.ceil(machine_cpus() / 4))
    share = int(machine_memory() * threads / max(machine_cpus(), 4 * threads))
    assert workers == [[threads, share]] * 4, workers
    assert sum(m for _t, m in workers) <= machine_memory()

    out = kernel.run(f"%cluster up --name big --workers 1 --cores {3 * machine_cpus()}")
    err = "".join(o.get("text", "") for o in out if o.get("name") == "stderr")
    assert "WARNING: cluster 'big': oversubscribed: with 1 x worker" in err, text_of(out)
    assert "running" in text_of(out)
    kernel.run("%cluster down big")
    out = kernel.run(lines[-1])
    assert lines[-1] == "%cluster down" and "cluster 'default' is stopped" in text_of(out)


def test_interrupting_up_cancels_it(kernel, state_dir, tmp_path):
    cfg = tmp_path / "slow.yaml"
    cfg.write_text("cluster_name: slow\nsetup_commands: ['sleep 60']\n")
    kernel.run("%load_ext jupyter_cloudtik")
    kc, km = kernel.client.kc, kernel.client.km
    msg_id = kc.execute(f"%cluster up {cfg}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not find_marked_processes(state_dir, cluster="slow"):
        time.sleep(0.1)
    time.sleep(0.5)
    run_sync(km.interrupt_kernel)()
    texts = []
    while True:
        msg = run_sync(kc.get_iopub_msg)(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            texts.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    assert "cancelled" in "".join(texts)
    from jupyter_cloudtik.clusters.manager import ClusterManager
    from jupyter_cloudtik.core.settings import CloudTik, load_user_config

    m = ClusterManager(CloudTik(config=load_user_config(), state_dir=str(state_dir)))
    assert m.ops.list(target="cluster:slow")[0].state == "cancelled"
    kernel.run("%cluster down slow")
    assert find_marked_processes(state_dir, cluster="slow") == {}


def test_help_documents_every_subcommand():
    doc = CloudTikMagics.cluster.__doc__
    for sub in ("up", "down", "status", "list", "scale", "client", "logs"):
        assert f"%cluster {sub}" in doc


def test_notebook_output_is_plain_json(kernel, state_dir):
    # what nbformat writes must survive a round trip (papermill/nbclient users save it)
    kernel.run("%load_ext jupyter_cloudtik")
    kernel.run("%cluster list")
    text = nbformat.writes(kernel.client.nb)
    assert json.loads(text)["cells"]


def test_a_mistyped_magic_of_ours_gets_a_suggestion(kernel):
    """IPython says only "not found"; ours add the magic meant, in one UsageError line,
    and leave every other unknown magic to IPython (issue 28.4)."""
    kernel.run("%load_ext jupyter_cloudtik")
    out = text_of(kernel.run("%clsuter status", allow_error=True))
    assert "UsageError: Line magic function `%clsuter` not found. Did you mean `%cluster`?" \
        in out, out
    out = text_of(kernel.run("%%hpcc\nprint('never run')", allow_error=True))
    assert "Did you mean `%%hpc`?" in out and "never run" not in out, out
    out = text_of(kernel.run("x = 1\n%storag list", allow_error=True))
    assert "Did you mean `%storage`?" in out, out
    out = text_of(kernel.run("%unheardof", allow_error=True))
    assert "not found" in out and "Did you mean" not in out, out
    # a second %load_ext adds no second transformer; a right magic is untouched
    kernel.run("%load_ext jupyter_cloudtik")
    out = text_of(kernel.run("%cluster --help"))
    assert "usage: %cluster" in out and "Did you mean" not in out, out



def test_a_failed_up_and_a_warning_are_each_said_once(kernel, state_dir):
    """Text progress (CLOUDTIK_PROGRESS=text, as in a terminal or a front end without
    widgets): the failure is the error's one line (no progress "failed:" line before it, no
    traceback of our internals: %tb has it); a warning is its one WARNING line (issue 28.4)."""
    kernel.run("%load_ext jupyter_cloudtik\nimport os\nos.environ['CLOUDTIK_PROGRESS'] = 'text'"
               "\nfrom jupyter_cloudtik import Cluster")
    out = text_of(kernel.run("Cluster.up(name='bad', workers=1, config={'setup_commands': "
                             "['echo boom; exit 3']})", allow_error=True))
    assert out.count("exited with code 3") == 1, out
    assert "NodeLaunchError: the head node" in out and "Traceback" not in out, out
    assert "%tb" in out, out
    kernel.run("%cluster down bad")
    out = text_of(kernel.run(f"c = Cluster.up(name='many', workers=1, cores={machine_cpus() * 3})"))
    assert out.count("oversubscribed") == 1 and "WARNING: cluster 'many'" in out, out
    kernel.run("c.down()")
