"""The wheel carries the prebuilt side panel and the server config: after `pip install`,
Jupyter finds both, with no node at run time."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out),
                    str(ROOT)], check=True, timeout=600)
    (path,) = out.glob("jupyter_cloudtik-*.whl")
    return path


def test_wheel_contents(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    data = next(n.split("/")[0] for n in names if ".data/" in n)
    lab = f"{data}/data/share/jupyter/labextensions/jupyter-cloudtik"
    assert f"{lab}/package.json" in names
    assert f"{lab}/install.json" in names
    assert f"{lab}/schemas/jupyter-cloudtik/plugin.json" in names
    assert any(n.startswith(f"{lab}/static/remoteEntry.") for n in names)
    assert (f"{data}/data/etc/jupyter/jupyter_server_config.d/jupyter_cloudtik.json"
            in names)
    assert "jupyter_cloudtik/server/openapi.yaml" in names
    # the emulators are their own distribution (emulators/): the product ships none of them,
    # and registers no feature that would need them
    assert not [n for n in names if n.startswith(("jupyter_cloudtik/testing/",
                                                   "cloudtik_emulators/"))]
    assert not [n for n in names if "emulator" in n.lower()], sorted(names)
    (points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "emulator" not in zipfile.ZipFile(wheel).read(points).decode()


def test_emulators_are_their_own_wheel(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path), str(ROOT / "emulators")], check=True, timeout=600)
    (path,) = tmp_path.glob("cloudtik_emulators-*.whl")
    wheel = zipfile.ZipFile(path)
    names = set(wheel.namelist())
    assert "cloudtik_emulators/huaweicloud/cloud.py" in names
    assert "cloudtik_emulators/firecrest.py" in names
    assert not [n for n in names if n.startswith("jupyter_cloudtik/")]
    (points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(points).decode()
    assert "[jupyter_cloudtik.features]" in text
    assert "cloudtik_emulators.feature:FEATURE" in text


def test_installed_wheel_is_enabled_and_ok(wheel, tmp_path):
    """`pip install` of the wheel into a fresh environment (its dependencies borrowed from
    this one by a .pth line), then Jupyter's own listings, with no node on PATH."""
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True,
                   timeout=120)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True).stdout.strip())
    # the dependencies, as a plain path: this environment's .pth files (the editable
    # install of jupyter_cloudtik) are not processed, so only the wheel's copy is importable
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--ignore-installed",
                    "-q", "--prefix", str(env_dir), str(wheel)], check=True, timeout=300)
    env = {**os.environ, "PATH": str(env_dir / "bin"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data")}
    env.pop("JUPYTER_PATH", None)
    env.pop("JUPYTER_CONFIG_PATH", None)

    imported = subprocess.run([str(python), "-c", "import jupyter_cloudtik; "
                               "print(jupyter_cloudtik.__file__)"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
    assert imported.stdout.startswith(str(site)), imported.stdout + imported.stderr

    server = subprocess.run([str(python), "-m", "jupyter_server", "extension", "list"],
                            env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    text = _plain(server.stdout + server.stderr)
    section = text.split(f"Config dir: {env_dir / 'etc' / 'jupyter'}", 1)[1].split(
        "Config dir:", 1)[0]
    assert "jupyter_cloudtik enabled" in section, text
    assert re.search(r"jupyter_cloudtik \S+ OK", section), text

    lab = subprocess.run([str(python), "-m", "jupyterlab.labextensions", "list"], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    text = _plain(lab.stdout + lab.stderr)
    section = text.split(str(env_dir / "share" / "jupyter" / "labextensions"), 1)[1]
    assert re.search(r"jupyter-cloudtik v\S+ enabled OK \(python, jupyter_cloudtik\)",
                     section), text


def _plain(text: str) -> str:
    """Without terminal colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)
