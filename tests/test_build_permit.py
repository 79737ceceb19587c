"""Building what a caller named runs that project's code in this process: only against the
policy's leave (``core.grants.BuildPermit``), which a shared state folder (the hub's
sidekick) never gives.

Real pip, a real package index folder: the "package" is a source distribution whose build
backend writes a marker file when pip imports it, so "no setup code ran" is checked on
the disk, not inferred from an error message.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

import jupyter_cloudtik
from jupyter_cloudtik.core.errors import ConfigError
from jupyter_cloudtik.core.grants import (
    BuildPermit,
    OwnerPolicy,
    Policy,
    declare_shared,
    policy_for,
)
from jupyter_cloudtik.core.store import Store
from jupyter_cloudtik.runtime import environment

PACKAGE = Path(jupyter_cloudtik.__file__).parent
#: the modules that may start pip in this process: the one that asks for the permit, and
#: the node's boot script (it runs on the node, not here)
PIP_HERE = {"runtime/environment.py", "providers/huaweicloud/userdata.py"}


def _sdist(index: Path, marker: Path, name: str = "ctmarker") -> Path:
    """A source distribution whose in-tree build backend writes ``marker`` on import."""
    files = {
        "pyproject.toml": ('[build-system]\nrequires = []\nbuild-backend = "ctbackend"\n'
                           'backend-path = ["."]\n'),
        "ctbackend.py": (f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
                         "def get_requires_for_build_wheel(config_settings=None):\n"
                         "    return []\n"),
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
    }
    index.mkdir(parents=True, exist_ok=True)
    path = index / f"{name}-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-1.0/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A package index of one source distribution (pip reads it through its environment
    variables, as a site's pip.conf would give it), and the marker its build would write."""
    folder, marker = tmp_path / "index", tmp_path / "setup-code-ran"
    sdist = _sdist(folder, marker)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))
    return sdist, marker


def _permit(tmp_path: Path, shared: bool):
    state = tmp_path / ("shared" if shared else "own")
    state.mkdir()
    if shared:
        declare_shared(state, policy="catalog")
    return policy_for(Store(state)).build_permit()


def test_only_a_single_persons_policy_gives_leave_to_build(tmp_path):
    own = _permit(tmp_path, shared=False)
    assert isinstance(own, BuildPermit) and own.sealed()
    assert _permit(tmp_path, shared=True) is None  # the hub's catalogue policy
    assert Policy(None).build_permit() is None  # a policy that does not say: no
    with pytest.raises(TypeError, match="made by a policy"):
        BuildPermit()
    assert isinstance(OwnerPolicy(None).build_permit(), BuildPermit)


def test_without_leave_no_setup_code_runs(tmp_path, index):
    sdist, marker = index
    cache = tmp_path / "wheels"
    with pytest.raises(RuntimeError, match="binary wheels only"):
        environment.collect(["ctmarker"], False, cache, {}, permit=None)
    for entry in (f"ctmarker @ {sdist.as_uri()}", "ctmarker @ https://127.0.0.1:9/x.tar.gz",
                  "ctmarker @ git+https://127.0.0.1:9/x.git"):
        with pytest.raises(ConfigError, match="direct reference") as e:
            environment.collect([entry], False, cache, {}, permit=None)
        assert e.value.field == "runtime.pip.0"
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "pyproject.toml").write_text("[project]\nname = 'x'\nversion = '1'\n")
    with pytest.raises(ConfigError, match="builds no folder"):
        environment.collect(["six", str(folder)], False, cache, {}, permit=None)
    assert not marker.exists()


def test_with_leave_the_same_source_distribution_is_built(tmp_path, index):
    """The control: the package above does run its code when pip may build it (so the
    test before this one would see it if the refusal were missing)."""
    _, marker = index
    permit = _permit(tmp_path, shared=False)
    with pytest.raises(RuntimeError):  # the backend builds no wheel; it ran, which counts
        environment.collect(["ctmarker"], False, tmp_path / "wheels", {}, permit=permit)
    assert marker.read_text() == "ran"


_SCAN = """
import ast, json, sys
from pathlib import Path
root = Path(sys.argv[1])
found = set()
for path in sorted(root.rglob("*.py")):
    rel = path.relative_to(root).as_posix()
    for node in ast.walk(ast.parse(path.read_text(), rel)):
        if isinstance(node, ast.List) and any(
                isinstance(a, ast.Constant) and a.value == "-m" and
                isinstance(b, ast.Constant) and b.value == "pip"
                for a, b in zip(node.elts, node.elts[1:])):
            found.add(rel)
print(json.dumps(sorted(found)))
"""


def test_pip_runs_in_this_process_only_where_the_permit_is_asked():
    """A module that starts ``pip`` itself would build past the decision point.  The scan
    runs in a fresh interpreter: CPython 3.11.7's ``ast.parse`` can fail with "AST
    constructor recursion depth mismatch" deep inside a test worker's stack (gh-106905,
    fixed in 3.11.8), and a scan that cannot run must not read as "nothing found"."""
    import json
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _SCAN, str(PACKAGE)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    found = set(json.loads(p.stdout))
    assert found <= PIP_HERE, sorted(found - PIP_HERE)
    assert "runtime/environment.py" in found  # the scan sees what it looks for


def test_the_services_own_folder_installs_are_built_only_when_nobody_else_can_change_them(
        tmp_path):
    """``sync_env`` on a shared service replicates what the admin installed, folders
    included, but only a folder no other account can change (its setup code runs beside
    every user's secrets); anything unreadable counts as changeable."""
    import os

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "pyproject.toml").write_text("[project]\nname = 'x'\nversion = '1'\n")
    os.chmod(tmp_path, 0o755)
    os.chmod(proj, 0o755)
    assert environment._writable_by_others(proj) is None
    (proj / "hatch_build.py").write_text("")
    os.chmod(proj / "hatch_build.py", 0o666)
    assert "writable by its group or others" in environment._writable_by_others(proj)
    os.chmod(proj / "hatch_build.py", 0o644)
    os.chmod(proj, 0o775)
    assert "writable" in environment._writable_by_others(proj)
    os.chmod(proj, 0o755)
    if os.geteuid() == 0:
        os.chown(proj / "pyproject.toml", 65534, 65534)
        assert "owned by uid 65534" in environment._writable_by_others(proj)
    assert "cannot be read" in environment._writable_by_others(tmp_path / "gone")
