"""The code blocks of README.md and docs/*.md that no specialised test runs, run as written.

Specialised tests run the slow, realistic examples (Spark, Slurm, the Huawei Cloud
emulator walkthrough; see ``grep -rn doc_examples tests``).  This module runs the rest
against the embedded ``local`` provider, in one IPython kernel and one state folder for the
whole module (cheap): magics and Python in a real kernel, cell by cell as a user types them
(a statement whose line ends in ``# -> VALUE`` must show VALUE), shell blocks in ``bash -e``
with this environment's scripts on ``PATH``, config blocks through the command that reads
them.  The kernel and the shell work in a copy of ``examples/`` (the folder the README's HPC
lines are run from), so the repository stays clean.

Stand-ins, each said in the doc too: the backend ``daint`` (a supercomputer in the docs) is
configured as a ``local`` backend here.  What runs where is recorded by
``tests/doc_examples.py``; the end of a full run fails if a runnable block ran nowhere.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import doc_examples as docs
import pytest
import yaml

from jupyter_cloudtik.core import ports

ROOT = docs.ROOT
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.timeout(240)


# --- the blocks themselves ------------------------------------------------------------------


def test_every_block_says_whether_it_runs():
    """Each fence has an info string: a runnable language or ``text``; an opt-out has a
    reason.  (A bare fence would leave it to the reader whether it is true.)"""
    bad = [b.id for b in docs.all_blocks()
           if b.lang not in docs.RUNNABLE | docs.ILLUSTRATIVE
           or (b.not_run is not None and len(b.not_run) < 10)]
    assert not bad, "blocks with no (known) info string or an empty not-run reason:\n" + \
        "\n".join(bad)
    assert sum(b.runnable for b in docs.all_blocks()) >= 30


def test_blocks_are_found_with_their_heading_and_opt_out(tmp_path, monkeypatch):
    md = tmp_path / "docs" / "x.md"
    md.parent.mkdir()
    md.write_text("# T\n\n```bash\necho a\n```\n\n## Sub\n\n<!-- not-run: needs the moon -->\n"
                  "```python\nmoon()\n```\n\n* item:\n\n    ```python\n    x = 1\n    ```\n\n"
                  "```text\nout\n```\n")
    monkeypatch.setattr(docs, "ROOT", tmp_path)
    found = docs.parse(md)
    assert [(b.heading, b.lang, b.text, b.not_run) for b in found] == [
        ("T", "bash", "echo a\n", None), ("Sub", "python", "moon()\n", "needs the moon"),
        ("Sub", "python", "x = 1\n", None), ("Sub", "text", "out\n", None)]
    assert [b.runnable for b in found] == [True, False, True, False]
    monkeypatch.setattr(docs, "doc_paths", lambda: [md])
    monkeypatch.setattr(docs, "_RAN", {})
    assert len(docs.check_coverage()) == 2  # the bash block and the indented python one
    assert docs.block("docs/x.md", "Sub").text == "x = 1\n"
    (left,) = docs.check_coverage()
    assert left == "docs/x.md:3 [0] (bash, under 'T')"
    with pytest.raises(LookupError, match="no runnable block 1"):
        docs.block("docs/x.md", "Sub", 1)


# --- one state folder, one kernel, one work folder for the module ----------------------------

HPC_CONFIG = """
c.HPC.backends = {"daint": {"type": "local"}}   # the docs' supercomputer, here
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory, isolated_jupyter):
    """The work folder (a copy of examples/), state folder, Jupyter config and environment."""

    from cloudtik_emulators.processes import (
        cloudtik_processes,
        describe,
        kill_all,
        stop_launcher,
    )

    base = tmp_path_factory.mktemp("docs")
    work, state, config, home = (base / "work", base / "state", base / "config",
                                 base / "home")
    shutil.copytree(ROOT / "examples", work)
    for d in (state, config, home):
        d.mkdir()
    # the suite's settings (tests/conftest.py wrote them; "import conftest" may be another
    # folder's conftest when several test folders run) and the stand-in backend
    suite = (isolated_jupyter / "jupyter-config" / "jupyter_cloudtik_config.py").read_text()
    (config / "jupyter_cloudtik_config.py").write_text(suite + HPC_CONFIG)
    env = {**os.environ, "CLOUDTIK_STATE_DIR": str(state), "JUPYTER_CONFIG_DIR": str(config),
           "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    saved = {k: os.environ.get(k) for k in ("CLOUDTIK_STATE_DIR", "JUPYTER_CONFIG_DIR")}
    os.environ.update(CLOUDTIK_STATE_DIR=str(state), JUPYTER_CONFIG_DIR=str(config))
    try:
        yield {"work": work, "state": state, "config": config, "home": home, "env": env}
    finally:
        subprocess.run([BIN / "jupyter-cloudtik", "down", "--all"], env=env,
                       capture_output=True, timeout=120)
        stop_launcher(state)
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        left = [p for p in cloudtik_processes(state)
                if "launcher" not in describe([p]) and "reaper" not in describe([p])]
        if left:
            text = describe(left)
            kill_all(left)
            pytest.fail("node processes left behind:\n" + text, pytrace=False)


@pytest.fixture(scope="module")
def kernel(site):
    with docs.Kernel(site["work"], site["env"]) as k:
        k.cell("%load_ext jupyter_cloudtik")  # "Load them with ..." (README, Magics)
        yield k


# --- README.md ------------------------------------------------------------------------------


def test_readme_first_example(site, tmp_path):
    """The README's first lines, as a new user runs them: no settings of ours at all (the
    suite's CPU overcommit would hide what a small machine says).  On 2 cores this needs
    the local provider's defaults of issue 20.3 (`--workers 4` fits); before those, it is
    refused with "not enough capacity", and that is a true failure of the README."""
    (block,) = [b for b in docs.parse(ROOT / "README.md") if b.index == 0]
    docs.mark_run(block)
    plain = tmp_path / "no-settings"
    plain.mkdir()
    with docs.Kernel(site["work"], {**site["env"], "JUPYTER_CONFIG_DIR": str(plain)}) as k:
        k.run(block)
        result, _ = k.cell("%cluster list")
        assert "No clusters" in result, result


def test_readme_python_api(kernel):
    done = kernel.run(docs.block("README.md", "Python API"))
    shown = dict((src.split("#")[0].strip(), res) for src, res, _ in done)
    assert "running" in shown["c.status, c.dashboard_link"], shown
    assert "default" in shown['Cluster.get("default"); Cluster.list()'], shown


def test_readme_command_line(site):
    out = docs.bash(docs.block("README.md", "Command line"), site["work"], site["env"])
    assert "analysis" in out
    listing = subprocess.run([BIN / "jupyter-cloudtik", "list", "--json"], env=site["env"],
                             capture_output=True, text=True, timeout=60)
    assert json.loads(listing.stdout) == [], listing.stdout


def test_readme_hpc_jobs(kernel, site):
    """The notebook job from examples/ (alpha = 0.5 over data.csv's 1+2+3) and the cell job,
    on ``daint`` (a local backend here)."""
    done = kernel.run(docs.block("README.md", "HPC jobs", 0))
    job_id = kernel.cell("job.id")[0].strip("'")
    fetched = site["work"] / "hpc-jobs" / job_id
    assert (fetched / "result.csv").read_text() == "alpha,result\n0.5,3.0\n", done
    assert any(p.suffix == ".ipynb" for p in fetched.iterdir()), list(fetched.iterdir())
    ((_, _, printed),) = kernel.run(docs.block("README.md", "HPC jobs", 1))
    assert str(sum(i * i for i in range(10**6))) in printed, printed


def test_readme_cluster_config_reference(site, tmp_path):
    """The reference config, as a file `up` reads (nodes on this machine)."""
    block = docs.block("README.md", "Cluster config reference")
    cfg = site["work"] / "cluster.yaml"
    cfg.write_text(block.text)
    env = site["env"]

    def cli(*args):
        return subprocess.run([BIN / "jupyter-cloudtik", *args], env=env, cwd=site["work"],
                              capture_output=True, text=True, timeout=120)

    r = cli("up", "cluster.yaml", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["name"] == "analysis" and got["state"] == "running", got
    assert len([n for n in got["nodes"] if n["kind"] == "worker"]) == 2, got
    r = cli("down", "analysis")
    assert r.returncode == 0, r.stderr


def test_readme_placement_line(kernel):
    """The placement section, in a config that `up` reads."""
    block = docs.block("README.md", "Placement: where nodes go")
    section = yaml.safe_load(block.text)
    kernel.cell(f"from jupyter_cloudtik import Cluster\n"
                f"c = Cluster.up({{'cluster_name': 'placed', **{section!r}}}, workers=1, "
                f"progress=False)")
    result, _ = kernel.cell("c.status, c.down()")
    assert "running" in result, result


# --- docs/hpc.md ----------------------------------------------------------------------------


def test_hpc_md_first_example_and_cell_job(kernel, site):
    kernel.run(docs.block("docs/hpc.md", "HPC jobs"))
    job_id = kernel.cell("job.id")[0].strip("'")
    assert (site["work"] / "hpc-jobs" / job_id / "result.csv").exists()
    ((_, _, printed),) = kernel.run(docs.block("docs/hpc.md", "`%%hpc`: one cell as a job"))
    assert re.fullmatch(r"-?\d+\.\d+", printed.strip().splitlines()[-1]), printed


def test_hpc_md_provenance(kernel, site):
    """The crate of a job on ``daint`` (a local backend here) and its rerun: nothing
    differs, the same parameters, the rerun succeeds."""
    kernel.run(docs.block("docs/hpc.md", "Provenance"))
    job_id = kernel.cell("job.id")[0].strip("'")
    crate = site["work"] / "hpc-jobs" / job_id
    meta = json.loads((crate / "ro-crate-metadata.json").read_text())
    action = next(e for e in meta["@graph"] if e["@type"] == "CreateAction")
    assert action["actionStatus"] == "http://schema.org/CompletedActionStatus"
    assert kernel.cell("again.differences")[0] == "[]"
    assert kernel.cell("again.info.state")[0] == "'succeeded'"
    assert kernel.cell("again.info.parameters")[0] == "{'alpha': 0.5}"
    assert kernel.cell("again.id != job.id")[0] == "True"


@pytest.mark.slow
def test_hpc_md_job_environment(kernel, site):
    """The session's environment built on the system (``daint`` is a local backend here:
    the venv is made with this machine's python3 in the backend's work folder)."""
    done = kernel.run(docs.block("docs/hpc.md", "The job's environment"), timeout=300)
    assert done[-1][1] == "'succeeded'", done
    said, _ = kernel.cell("'jupyter_cloudtik: environment ' in str(job.logs())")
    assert said == "True", said
    mode, _ = kernel.cell("job.info.environment['mode']")
    assert mode == "'built'", mode


def test_hpc_md_backends_config_and_secrets(site, tmp_path):
    """The backends config as a Jupyter config file, read by ``jobs backends`` and by
    ``jobs secret`` (its key file made here; the client secrets come on stdin)."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "jupyter_cloudtik_config.py").write_text(
        docs.block("docs/hpc.md", "Configuring backends", lang="python").text)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nx\n")
    env = {**site["env"], "JUPYTER_CONFIG_DIR": str(config), "HOME": str(home)}
    r = subprocess.run([BIN / "jupyter-cloudtik", "jobs", "backends", "--json"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = {b["name"]: b for b in json.loads(r.stdout)}
    assert {"daint", "cluster", "eiger", "nordugrid", "arc6"} <= set(got)
    assert got["daint"]["default"], got["daint"]
    # typed at the prompts, as a user does (asked without echo)
    import pexpect

    block = docs.block("docs/hpc.md", "Configuring backends", lang="bash")
    sh = pexpect.spawn("bash", ["-e", "-c", block.text], cwd=str(tmp_path), env=env,
                       encoding="utf-8", timeout=60)
    for backend, value in [("eiger", "secret-one"), ("nordugrid", "secret-two")]:
        sh.expect(f"client_secret for backend {backend}: ")
        sh.sendline(value)
    sh.expect(pexpect.EOF)
    sh.close()
    assert sh.exitstatus == 0, sh.before
    out = sh.before
    assert "secret-one" not in out and "BEGIN" not in out, out
    assert "stored client_secret for backend 'nordugrid'" in out, out


def test_readme_quick_start_demo(site):
    """``make demo`` is the light install (the package, a kernel, nbclient; no Debian
    package but a venv) and examples/run_demo.py, which writes nothing into the tree."""
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo: \$\(VENV\)/\.demo-installed\n\t\$\(BIN\)/python "
                     r"examples/run_demo.py$", make, re.M)
    assert re.search(r"^\t@scripts/install-system-deps.sh demo$", make, re.M)
    before = sorted(p.name for p in (ROOT / "examples").iterdir())
    r = subprocess.run([sys.executable, ROOT / "examples" / "run_demo.py"], env=site["env"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "result" in r.stdout.lower(), r.stdout
    assert sorted(p.name for p in (ROOT / "examples").iterdir()) == before


# --- docs/panel.md, dashboards.md, placement.md ----------------------------------------------


def test_panel_inserted_client_code(kernel):
    """The code **Insert client code** puts in a notebook, for a cluster named demo."""
    kernel.cell("from jupyter_cloudtik import Cluster\n"
                "demo = Cluster.up(name='demo', workers=1, progress=False)")
    done = kernel.run(docs.block("docs/panel.md", "Sections"))
    assert done[-1][1].startswith("<Client: "), done[-1]
    kernel.cell("client.close(); demo.down()")


def test_dashboards_adaptive_section_of_a_config(kernel):
    """The ``adaptive:`` line of docs/dashboards.md in a config that `up` reads."""
    section = yaml.safe_load(docs.block("docs/dashboards.md",
                                        "Adaptive scaling that outlives the kernel").text)
    kernel.cell("from jupyter_cloudtik import Cluster\n"
                f"a = Cluster.up({{'cluster_name': 'adaptive', **{section!r}}}, workers=1, "
                "progress=False)")
    result, _ = kernel.cell("a.status, a.info.config['adaptive']")
    assert "running" in result and "'maximum': 8" in result, result
    kernel.cell("a.down()")


def test_placement_json_filter_and_plugins(kernel):
    """The JSON filter as a cluster's ``placement.query`` (this machine passes it), and the
    plugin example's classes, defined as written and asked about an offer of this machine."""
    query = json.loads(docs.block("docs/placement.md", "The JSON filter").text)
    cfg = {"cluster_name": "queried", "placement": {"query": query}}
    kernel.cell(f"from jupyter_cloudtik import Cluster\n"
                f"q = Cluster.up({cfg!r}, workers=1, progress=False)")
    result, _ = kernel.cell("q.status, q.down()")
    assert "running" in result, result
    kernel.run(docs.block("docs/placement.md", "Writing a filter or a weigher", lang="python"))
    result, _ = kernel.cell("TrustedHosts.name, PreferEurope.name")
    assert result == "('trusted', 'prefer_europe')", result


# --- docs/hub-sidekicks.md, hub-egress.md ------------------------------------------------------


def test_job_gateway_without_a_hub(tmp_path, site):
    """The job gateway, run directly (its port and folder: free ones of this test's)."""
    import time

    port = ports.free_port()
    # the second shell block: the gateway on its own (the first is a hub session's, run
    # by tests/hub/test_hub_docs_config.py)
    block = docs.block("docs/hub-sidekicks.md", "The job gateway (example side-kick)", 1,
                       lang="bash")
    text = block.text.replace("8765", str(port)).replace("/tmp/gw", str(tmp_path / "gw"))
    log = tmp_path / "out.log"  # a file: the gateway in the background keeps a pipe open
    with open(log, "w") as f:
        proc = subprocess.Popen(["bash", "-e", "-c", text], cwd=tmp_path, env=site["env"],
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        proc.wait(timeout=60)
        out = log.read_text()
        assert proc.returncode == 0, out
        assert '{"ok": true' in out, out  # the answers of curl, between the gateway's log
        assert re.search(r'\{"id": "\w+", "state": "queued", "backend": "local"', out), out
    finally:
        import signal

        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        time.sleep(0.5)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_sidekick_definitions_file(tmp_path):
    from jupyter_cloudtik.hub.sidekicks.specs import SidekickCatalog

    path = tmp_path / "sidekicks.yaml"
    path.write_text(docs.block("docs/hub-sidekicks.md", "Defining side-kicks").text)
    catalog = SidekickCatalog.from_file(path)
    spec = catalog.get("job-gateway", "bob", ["hpc-users"])
    assert spec.name == "job-gateway"
    assert catalog.get("data-finder", "anyone").name == "data-finder"
    with pytest.raises(Exception) as e:
        catalog.get("job-gateway", "eve", ["other"])
    assert "job-gateway" in str(e.value)


# --- plugins declared as the docs say (pyproject.toml fragments) -----------------------------

BACKEND = '''
from jupyter_cloudtik.hpc.base import HPCBackend


class MySchedBackend(HPCBackend):
    """Declared only; `jobs backends` lists it by its type."""
    kind = "mysched"
'''


def test_plugin_entry_points_of_the_docs(site, tmp_path):
    """A filter and a weigher (docs/placement.md: the module and the pyproject.toml
    fragment as written) and an HPC backend type (docs/hpc.md's fragment), installed as a
    dist-info on PYTHONPATH: `up` uses the filter by name, `jobs backends` knows the type."""
    root = tmp_path / "site"
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "placement.py").write_text(
        docs.block("docs/placement.md", "Writing a filter or a weigher", lang="python").text)
    docs.write_dist_info(root, "mypkg", docs.block(
        "docs/placement.md", "Writing a filter or a weigher", lang="toml").text)
    (root / "my_package").mkdir()
    (root / "my_package" / "__init__.py").write_text("")
    (root / "my_package" / "backend.py").write_text(BACKEND)
    docs.write_dist_info(root, "my_package", docs.block("docs/hpc.md", "Writing a backend").text)
    config = tmp_path / "config"
    config.mkdir()
    (config / "jupyter_cloudtik_config.py").write_text(
        (site["config"] / "jupyter_cloudtik_config.py").read_text()
        + 'c.HPC.backends = {"mine": {"type": "mysched"}}\n')
    env = {**site["env"], "PYTHONPATH": str(root), "JUPYTER_CONFIG_DIR": str(config)}
    # "Use them by name": this machine's offer is not attested, so nothing may start
    (tmp_path / "trusted.yaml").write_text(
        "cluster_name: trusted\n"
        "placement: {filters: [trusted, max_price], weighers: {prefer_europe: 2}}\n")
    r = subprocess.run([BIN / "jupyter-cloudtik", "up", str(tmp_path / "trusted.yaml")],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "filter 'trusted' eliminated" in r.stderr, r.stderr
    r = subprocess.run([BIN / "jupyter-cloudtik", "jobs", "backends", "--json"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert {b["name"]: b["type"] for b in json.loads(r.stdout)}["mine"] == "mysched"


def test_hpc_emulators_in_the_foreground(tmp_path, site):
    """docs/hpc.md's emulator commands, each as in its own terminal: it prints its JSON
    line, then Ctrl-C (SIGINT) stops it.  Their folders: this test's, for /tmp/..."""
    import signal

    block = docs.block("docs/hpc.md", "Testing without a supercomputer")
    lines = docs.code(block.text)
    assert len(lines) == 2
    for line in lines:
        line = line.replace("/tmp/", f"{tmp_path}/")
        proc = subprocess.Popen(["bash", "-c", f"exec {line}"], env=site["env"], text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            first = json.loads(proc.stdout.readline())
            assert first["url"].startswith("http://127.0.0.1:") and first["token_uri"], first
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) in (0, -signal.SIGINT, 130), proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
