"""A third-party feature registered only by its entry point appears in the CLI and in
the magics, with no edit to our code (the REST side: tests/server/inprocess)."""

from __future__ import annotations

import os
import subprocess
import sys

from .thirdparty import write_distribution


def _env(root) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    return env


def test_its_command_is_in_the_cli(tmp_path):
    root = write_distribution(tmp_path / "site")
    cli = [sys.executable, "-m", "jupyter_cloudtik"]
    helptext = subprocess.run([*cli, "--help"], env=_env(root), capture_output=True,
                              text=True, timeout=120, check=True).stdout
    assert "quota-demo" in helptext and "a third-party feature's command" in helptext
    ran = subprocess.run([*cli, "quota-demo", "alice"], env=_env(root), capture_output=True,
                         text=True, timeout=120)
    assert (ran.returncode, ran.stdout) == (0, "quota for alice: 3\n"), ran.stderr
    # without the distribution the command does not exist: it came from the entry point
    plain = subprocess.run([*cli, "quota-demo", "alice"], capture_output=True, text=True,
                           timeout=120)
    assert plain.returncode == 2 and "quota-demo" in plain.stderr


def test_its_magic_is_registered_by_load_ext(tmp_path):
    root = write_distribution(tmp_path / "site")
    code = ("from IPython.testing.globalipapp import start_ipython\n"
            "ip = start_ipython()\n"
            "ip.run_line_magic('load_ext', 'jupyter_cloudtik')\n"
            "print(ip.run_line_magic('quota_demo', 'bob'))\n"
            "print('cluster' in ip.magics_manager.magics['line'])\n")
    env = _env(root)
    env["CLOUDTIK_API_URL"] = "http://127.0.0.1:9/cloudtik/api/"  # no launcher prewarm
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-2:] == ["quota for bob: 3", "True"]
