"""The ``container`` path of a job's environment, run for real with Podman (issue 32).

No registry is reachable here, so the image is built locally from Debian's stock root
(``cloudtik_emulators.container_image``): the distribution's Python and nothing else but
papermill and ipykernel.  The job runs on the local backend with the backend's
``environment: {container_runtime: podman}``; the notebook runs inside the image (its
interpreter, its ``/run/.containerenv``), reads its input and writes its result in the
job folder (mounted at the same path), and the run's provenance names the image and the
runtime.  Apptainer/Singularity use the same code path with ``exec --bind`` (see
``hpc/script.container_run``); Debian 12 ships neither, so only their script is checked.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import doc_examples
import pytest

from jupyter_cloudtik.core.errors import ConfigError
from jupyter_cloudtik.hpc.api import Job
from jupyter_cloudtik.hpc.base import Environment
from jupyter_cloudtik.hpc.commands import build_spec
from jupyter_cloudtik.hpc.script import container_run

from .conftest import _nb

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def podman(tmp_path_factory):
    """(image, containers.conf) — the runner image, built once per machine."""
    from cloudtik_emulators.container_image import (
        ensure_runner_image,
        podman_missing,
        site_containers_conf,
    )
    from jupyter_cloudtik.hpc.environment import RUNNER
    from jupyter_cloudtik.runtime import environment as rtenv

    why = podman_missing()
    if why:
        pytest.skip(why)
    conf = site_containers_conf(tmp_path_factory.mktemp("podman") / "containers.conf")
    cache = Path("/var/cache/jupyter_cloudtik/runner-wheels")
    cache.mkdir(parents=True, exist_ok=True)
    wheels, _ = rtenv.collect(list(RUNNER), False, cache, {}, permit=None)
    wheels += rtenv.wheels_for({"pip": rtenv.md.version("pip")}, cache)
    return ensure_runner_image(conf, sorted({w.name: w for w in wheels}.values())), conf


def test_a_notebook_runs_inside_a_podman_image(podman, make_client, notebooks, tmp_path):
    image, conf = podman
    client = make_client({"box": {"type": "local", "environment": {
        "container_runtime": "podman", "variables": {"CONTAINERS_CONF": str(conf)}}}})
    where = tmp_path / "where.ipynb"
    where.write_text(json.dumps(_nb(
        ("factor = 1", ["parameters"]),
        ("import json, os, sys\n"
         "json.dump({'python': sys.executable, 'version': sys.version.split()[0],\n"
         "           'container': os.path.exists('/run/.containerenv'),\n"
         "           'factor': factor, 'data': open('data.txt').read().strip()},\n"
         "          open('where.json', 'w'))", []))))
    spec = build_spec(str(where), parameters={"factor": 5}, container=image,
                      inputs=[str(notebooks["data"])], outputs=["where.json"])
    info = client.wait(client.submit(spec, "box").id, timeout=300)
    assert info.state == "succeeded", (info.reason, client.logs(info.id).text[-2000:])
    job = Job(info.id, client)
    fetched = {p.name: p for p in job.fetch(tmp_path / "out")}
    seen = json.loads(fetched["where.json"].read_text())
    # the image's own Python (Debian's), not the session's interpreter
    assert seen == {"python": "/usr/bin/python3", "version": seen["version"],
                    "container": True, "factor": 5, "data": "6"}, seen
    assert seen["version"].startswith("3.11.")
    # the provenance names the image, its registry (a local build) and the runtime
    graph = {e["@id"]: e for e in json.loads(
        (Path(job.crate) / "ro-crate-metadata.json").read_text())["@graph"]}
    images = [e for e in graph.values() if e.get("@type") == "ContainerImage"]
    assert [(i["name"], i["registry"], i["tag"], i["description"]) for i in images] == [
        ("localhost/cloudtik-runner", "localhost", "bookworm", "run with podman")]
    # nothing is left running or kept: the job's container was removed (--rm)
    left = subprocess.run(["podman", "ps", "-a", "--format", "{{.Image}}"],
                          capture_output=True, text=True,
                          env={"CONTAINERS_CONF": str(conf), "PATH": "/usr/bin:/bin"}).stdout
    assert image not in left, left


def test_each_runtime_has_its_own_line_and_others_are_refused(make_client, notebooks):
    podman = "\n".join(container_run(Environment(container="localhost/i:1",
                                                 container_runtime="podman",
                                                 variables={"A_B": "1"})))
    assert 'podman run --rm --network=host "${CT_USERNS[@]}" --volume ' \
           '"$CT_JOB_DIR:$CT_JOB_DIR" --workdir "$CT_JOB_DIR" --env A_B localhost/i:1' in podman
    assert "--userns=keep-id" in podman  # a job that is not root keeps its own uid
    for runtime in ("apptainer", "singularity", None):
        line = container_run(Environment(container="/img.sif", container_runtime=runtime))
        assert line == [f'CT_RUN=({runtime or "apptainer"} exec --bind "$CT_JOB_DIR" '
                        '--pwd "$CT_JOB_DIR" /img.sif)']
    client = make_client({"box": {"type": "local",
                                  "environment": {"container_runtime": "docker"}}})
    with pytest.raises(ConfigError) as e:
        client.submit(build_spec(str(notebooks["param"]), container="img:1"), "box")
    assert e.value.field == "environment.container_runtime"
    assert "'docker' is not allowed; use apptainer, singularity, podman" in e.value.message
    assert client.list() == []


@pytest.mark.timeout(600)
def test_the_containers_section_as_documented(podman, hpc_state, tmp_path, monkeypatch, ip):
    """docs/hpc.md "Containers": the backend's config and the submit, run as written but
    for two stand-ins, each asserted to be in the block: the image is the one built here
    (no registry), and the backend passes this machine's containers.conf to Podman."""
    image, conf = podman
    shutil.copytree(doc_examples.ROOT / "examples", tmp_path / "work")
    monkeypatch.chdir(tmp_path / "work")
    config, api = doc_examples.blocks("docs/hpc.md", "Containers")
    assert (config.lang, api.lang) == ("yaml", "python")
    assert config.text.endswith("      container_runtime: podman\n"), config.text
    (tmp_path / "hpc.yaml").write_text(
        config.text + f"      variables: {{CONTAINERS_CONF: {conf}}}\n")
    monkeypatch.setenv("CLOUDTIK_HPC_CONFIG", str(tmp_path / "hpc.yaml"))
    assert 'container="localhost/analysis:1.2"' in api.text
    ip.init_user_ns()
    for source in doc_examples.cells(api):
        source = source.replace("localhost/analysis:1.2", image)
        result = ip.run_cell(source, store_history=True)
        assert result.error_before_exec is None and result.error_in_exec is None, (
            source, result)
        expected = re.search(r"#\s*->\s*(.+?)\s*$", source.splitlines()[-1])
        if expected:
            job = ip.user_ns["job"]
            assert repr(result.result) == expected.group(1), (result.result,
                                                              job.logs()[-2000:])
    job = ip.user_ns["job"]
    assert "alpha=0.5 result=" in job.logs()
    assert job.info.environment["mode"] == "container"
    assert job.info.environment["container_runtime"] == "podman"
