"""``runtime: {pip: [...], sync_env: true}``: the client makes the wheels, stages them in
the workspace bucket, the nodes install exactly those (fast mode: the node's Python has
pip, so pip installs them; realistic mode, in test_realistic.py: the stock image has no
pip, so the node unpacks them).  A package that does not install on the node fails
``up`` with the node's own console output naming it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from hwc_helpers import cluster_config, workspace_config

from jupyter_cloudtik.core.errors import ConfigError, NodeLaunchError
from jupyter_cloudtik.providers.huaweicloud.userdata import NODE_TOOL
from jupyter_cloudtik.runtime import environment

WS = "packages"


def _project(root, name: str, version: str = "0.1.0", requires_python: str = ">=3.8"):
    """A local Python project (a folder with pyproject.toml), as a user's own package."""
    src = root / name
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text(f"ANSWER = 42\n__version__ = {version!r}\n")
    (src / "pyproject.toml").write_text(
        "[build-system]\nrequires = [\"setuptools>=61\"]\n"
        "build-backend = \"setuptools.build_meta\"\n"
        f"[project]\nname = \"{name}\"\nversion = \"{version}\"\n"
        f"requires-python = \"{requires_python}\"\n")
    return src


@pytest.fixture
def ws(hwc, core):
    core.run(core.workspaces.create(WS, workspace_config(hwc)))
    yield WS
    for c in core.clusters.list():
        core.run(core.clusters.down(c.name))
    core.run(core.workspaces.delete(WS))


def test_bad_entries_name_the_field(core, tmp_path):
    from jupyter_cloudtik.core import config as cfgmod
    from jupyter_cloudtik.providers.dask_gateway import DaskGatewayNodeProvider
    from jupyter_cloudtik.providers.local import LocalNodeProvider

    with pytest.raises(ConfigError) as e:
        cfgmod.build_config({"runtime": {"pip": "six"}})
    assert e.value.field == "runtime.pip" and "'six' is not of type 'array'" in e.value.message
    with pytest.raises(ConfigError) as e:
        environment.check_pip_entries(["six", "not a requirement!!"])
    assert e.value.field == "runtime.pip.1" and "'not a requirement!!'" in e.value.message
    with pytest.raises(ConfigError) as e:
        environment.check_pip_entries([str(tmp_path)])
    assert "no pyproject.toml or setup.py" in e.value.message
    gw = {"provider": {"type": "dask-gateway"}, "runtime": {"sync_env": True}}
    with pytest.raises(ConfigError) as e:
        environment.check_packages(gw, DaskGatewayNodeProvider)
    assert e.value.field == "runtime.sync_env" and "cannot install packages" in e.value.message
    # local nodes run this Python: a package must be installed here already
    local = {"provider": {"type": "local"}, "runtime": {"pip": ["six", "no-such-pkg-ctk"]}}
    with pytest.raises(ConfigError) as e:
        environment.check_packages(local, LocalNodeProvider)
    assert e.value.field == "runtime.pip.1" and "not installed here" in e.value.message
    environment.check_packages({"provider": {"type": "local"},
                                "runtime": {"pip": ["six"], "sync_env": True}},
                               LocalNodeProvider)


def test_sync_env_finds_index_packages_and_builds_local_ones(tmp_path):
    """What ``sync_env`` replicates of an environment: six from an index at its exact
    version, a package installed from a local folder rebuilt from that folder."""
    target = tmp_path / "site"
    proj = _project(tmp_path, "ctk_local_sync", "1.2.3")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--target", str(target), "six==1.17.0", str(proj)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    pins, local = environment.installed_here([str(target)])
    assert pins == {"six": "1.17.0"}
    assert local == [str(proj)]
    wheels = environment.wheels_for(pins, tmp_path / "cache")
    assert [environment.wheel_name_version(w) for w in wheels] == [("six", "1.17.0")]


def test_node_tool_checks_wheels_before_installing(tmp_path):
    ns: dict = {"__name__": "node_tool"}
    exec(NODE_TOOL, ns)
    allows = ns["python_allows"]
    assert allows(">=3.8", "3.11.2") and allows(">=3.8,<4", "3.11.2")
    assert allows("~=3.11", "3.11.2") and allows("==3.11.*", "3.11.2")
    assert not allows(">=3.11.3", "3.11.2") and not allows("<3.11", "3.11.2")
    assert not allows("!=3.11.*", "3.11.2") and not allows(">=3.99", "3.11.2")
    problem = ns["wheel_problem"]
    here = "{}{}".format(*sys.version_info[:2])
    assert problem("a-1-py3-none-any.whl", _wheel("a", "1")) is None
    assert problem("a-1-py39-none-any.whl", _wheel("a", "1")) is None
    import platform

    m = platform.machine()
    assert problem(f"a-1-cp38-abi3-manylinux_2_17_{m}.manylinux2014_{m}.whl",
                   _wheel("a", "1")) is None
    assert "is for py399" in problem("a-1-py399-none-any.whl", b"")
    assert "is for cp27" in problem("a-1-cp27-cp27m-manylinux1_x86_64.whl", b"")
    assert "is for win_amd64" in problem(f"a-1-cp{here}-cp{here}-win_amd64.whl", b"")
    msg = problem("a-1-py3-none-any.whl", _wheel("a", "1", ">=3.99"))
    assert msg.startswith("package a 1 does not install on this node: it requires Python "
                          ">=3.99, this node has Python 3."), msg


def _wheel(name, version, requires_python=None) -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        if requires_python:
            meta += f"Requires-Python: {requires_python}\n"
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta + "\nbody\n")
    return buf.getvalue()


def _wheel_puts(hwc, after: int) -> list[str]:
    from urllib.parse import unquote  # the SDK sends a key's slashes as %2F

    return [unquote(r["path"]) for r in hwc.ctl.requests(after)
            if r.get("action") == "obs.put_object" and "/cloudtik/wheels/" in unquote(r["path"])]


def test_a_local_package_reaches_the_nodes(hwc, core, ws, tmp_path):
    """A project folder the client only has as source: built into a wheel on the client,
    staged in OBS, installed by the node's pip into the node's own folder; a task sees it."""
    from jupyter_cloudtik.providers.huaweicloud import HuaweiCloudNodeProvider

    proj = _project(tmp_path, "ctk_local_pkg", "0.3.1")
    config = {**cluster_config("pk", ws, workers=1), "runtime": {"pip": [str(proj)]}}
    first = hwc.ctl.last_request()
    core.run(core.clusters.up(config))
    staged = _wheel_puts(hwc, first)
    assert len(staged) >= 20 and any("ctk_local_pkg" in p for p in staged), staged
    _, connect = core.clusters.connect_info("pk")
    client = HuaweiCloudNodeProvider.make_client(connect, timeout=20)
    try:
        def probe():
            import importlib.metadata

            import ctk_local_pkg

            dist = importlib.metadata.distribution("ctk_local_pkg")
            return dist.version, ctk_local_pkg.ANSWER, ctk_local_pkg.__file__, \
                dist.read_text("INSTALLER")

        got = client.run(probe)
        assert len(got) == 1
        for version, answer, where, installer in got.values():
            assert (version, answer) == ("0.3.1", 42)
            assert "/python/site-packages/ctk_local_pkg/" in where, where
            assert installer == "pip\n"  # the node's Python has pip: pip installed it
        assert client.run_on_scheduler(probe)[:2] == ("0.3.1", 42)
    finally:
        client.close()
    core.run(core.clusters.down("pk"))
    # staged once per workspace: another cluster sends only the rebuilt local wheel
    mark = hwc.ctl.last_request()
    core.run(core.clusters.up({**cluster_config("pk2", ws, workers=0),
                               "runtime": {"pip": [str(proj)]}}))
    sent = _wheel_puts(hwc, mark)
    assert len(sent) <= 1 and all("ctk_local_pkg" in p for p in sent), sent
    core.run(core.clusters.down("pk2"))
    # the client's own Python never got it (nodes install into their own folder)
    assert subprocess.run([sys.executable, "-c", "import ctk_local_pkg"],
                          capture_output=True).returncode != 0


def test_a_package_that_does_not_install_fails_up_with_the_boot_log(hwc, core, ws, tmp_path):
    proj = _project(tmp_path, "ctk_future_pkg", "2.0.0", requires_python=">=3.99")
    config = {**cluster_config("badpkg", ws, workers=1), "runtime": {"pip": [str(proj)]}}
    t0 = time.monotonic()
    with pytest.raises(NodeLaunchError) as e:
        core.run(core.clusters.up(config))
    took = time.monotonic() - t0
    msg = e.value.message
    assert "console output ends with" in msg, msg
    assert "ctk_future_pkg" in msg and ">=3.99" in msg, msg
    assert "Traceback" not in msg
    assert took < 60, took
    core.run(core.clusters.down("badpkg"))
    print(f"up failed after {took:.1f}s: {msg}")


def test_a_requirement_the_client_cannot_get_fails_before_any_server(hwc, core, ws):
    mark = hwc.ctl.last_request()
    config = {**cluster_config("nopkg", ws, workers=1),
              "runtime": {"pip": ["six==0.0.1"]}}
    with pytest.raises(ConfigError) as e:
        core.run(core.clusters.up(config))
    assert e.value.field == "runtime.pip"
    assert "six==0.0.1" in e.value.message, e.value.message
    creates = [r for r in hwc.ctl.requests(mark)
               if r["action"] == "ecs.create_post_paid_servers"]
    assert creates == []
    core.run(core.clusters.down("nopkg"))


def test_sync_env_option_of_the_magic_and_the_cli():
    """``--sync-env`` of ``%cluster up`` and ``jupyter cloudtik up`` (one parser) sets
    ``runtime.sync_env``, keeping the rest of the config's runtime section."""
    from jupyter_cloudtik.clusters.commands import add_cluster_commands
    from jupyter_cloudtik.core.arguments import Parser
    from jupyter_cloudtik.runtime.base import with_runtime

    for cli in (True, False):
        p = Parser(prog="x")
        add_cluster_commands(p.add_subparsers(dest="command"), cli=cli)
        assert p.parse_args(["up", "--sync-env"]).sync_env is True
        assert p.parse_args(["up"]).sync_env is False
    cfg = {"runtime": {"pip": ["six"], "types": ["dask"]}}
    assert with_runtime(cfg, None, sync_env=True) == {
        "runtime": {"pip": ["six"], "types": ["dask"], "sync_env": True}}
    assert with_runtime(cfg, None) is cfg
    assert with_runtime(None, "spark", sync_env=True) == {
        "runtime": {"types": ["spark"], "sync_env": True}}


def test_the_runtime_section_of_docs_huaweicloud_md(hwc, core, ws, tmp_path, monkeypatch):
    """The doc's `runtime:` block as written, from a folder that has ./mypkg: six and toolz
    pinned to the client's versions, mypkg built here; the head has all three."""
    import importlib.metadata

    import doc_examples
    import yaml

    from jupyter_cloudtik.providers.huaweicloud import HuaweiCloudNodeProvider

    block = doc_examples.block("docs/huaweicloud.md",
                               "Packages the nodes need: `runtime.pip` and `--sync-env`",
                               lang="yaml")
    _project(tmp_path, "mypkg", "1.0.0")
    monkeypatch.chdir(tmp_path)
    config = {**cluster_config("docpk", ws, workers=0), **yaml.safe_load(block.text)}
    core.run(core.clusters.up(config))
    try:
        _, connect = core.clusters.connect_info("docpk")
        client = HuaweiCloudNodeProvider.make_client(connect, timeout=20)
        try:
            def versions():
                import importlib.metadata as md

                import mypkg

                return (md.version("six"), md.version("toolz"), md.version("mypkg"),
                        mypkg.ANSWER)

            got = client.run_on_scheduler(versions)
        finally:
            client.close()
        assert got == (importlib.metadata.version("six"), importlib.metadata.version("toolz"),
                       "1.0.0", 42)
    finally:
        core.run(core.clusters.down("docpk"))
