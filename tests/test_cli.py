"""`jupyter cloudtik` as a user runs it: exit codes, --json, messages on stderr."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from jupyter_cloudtik.providers.local.processes import find_marked_processes


def cli(venv_bin, *args, timeout=180):
    return subprocess.run([str(venv_bin / "jupyter-cloudtik"), *args], capture_output=True,
                          text=True, timeout=timeout)


def test_life_cycle_with_json(venv_bin, state_dir):
    up = cli(venv_bin, "up", "--workers", "1", "--name", "c1", "--json")
    assert up.returncode == 0, up.stderr
    info = json.loads(up.stdout)
    assert info["name"] == "c1" and info["state"] == "running"
    assert info["summary"]["workers"] == 1
    assert "workers: 1/1 workers connected" in up.stderr  # progress goes to stderr

    listed = json.loads(cli(venv_bin, "list", "--json").stdout)
    assert [c["name"] for c in listed] == ["c1"]
    status = json.loads(cli(venv_bin, "status", "c1", "--json").stdout)
    assert status["summary"]["workers"] == 1
    assert {n["kind"] for n in status["nodes"]} == {"head", "worker"}

    scaled = cli(venv_bin, "scale", "c1", "2", "--json")
    assert scaled.returncode == 0, scaled.stderr
    assert json.loads(scaled.stdout)["summary"]["workers"] == 2

    logs = cli(venv_bin, "logs", "c1", "--tail", "5")
    assert logs.returncode == 0 and "==> c1-head-" in logs.stdout

    ops = json.loads(cli(venv_bin, "operations", "--cluster", "c1", "--json").stdout)
    assert [o["kind"] for o in ops][:2] == ["cluster.scale", "cluster.up"]
    # the table says when each started and how long it took (issue 28)
    table = cli(venv_bin, "operations", "--cluster", "c1").stdout.splitlines()
    assert table[0].split()[:3] == ["ID", "STARTED", "TOOK"], table
    up = next(line for line in table if "cluster.up" in line)
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d +\d+\.\ds ", up), up

    down = cli(venv_bin, "down", "c1", "--json")
    assert down.returncode == 0 and json.loads(down.stdout) == {"stopped": ["c1"]}
    assert find_marked_processes(state_dir) == {}
    assert json.loads(cli(venv_bin, "list", "--json").stdout) == []
    assert len(json.loads(cli(venv_bin, "list", "--all", "--json").stdout)) == 1


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["status", "ghost"], 2, "error: no cluster named 'ghost'"),
        (["scale", "ghost", "2"], 2, "error: no cluster named 'ghost'"),
        (["scale", "ghost", "-2"], 2, "-2 is negative"),
        (["up", "--workers", "x"], 2, "'x' is not a whole number"),
        (["launch"], 2, "invalid choice: 'launch'"),
        (["up", "--provider", "nimbus"], 2, "unknown provider 'nimbus'; installed: "),
        (["up", "/nonexistent.yaml"], 2, "config file /nonexistent.yaml does not exist"),
        (["cancel", "000000000000"], 2, "no operation with id"),
        (["up", "--cores", "0"], 2, "0 cores: use 1 or more"),
        (["up", "--cores", "two"], 2, "'two' is not a whole number"),
        (["up", "--memory", "lots"], 2, "memory: 'lots' is not a size; use bytes or a "
                                        "number with a unit such as 512MiB"),
        (["up", "--memory", "1GiB", "--provider", "nimbus"], 2,
         "unknown provider 'nimbus'; installed: "),
    ],
)
def test_bad_input_exit_codes(venv_bin, state_dir, args, code, message):
    r = cli(venv_bin, *args)
    assert r.returncode == code, (r.stdout, r.stderr)
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_config_file_names_the_field(venv_bin, state_dir, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("available_node_types:\n  worker:\n    max_workers: -1\n")
    r = cli(venv_bin, "up", str(cfg), "--json")
    assert r.returncode == 2
    assert json.loads(r.stdout)["error"] == {
        "message": "available_node_types.worker.max_workers: -1 is less than the minimum of 0",
        "reason": "invalid",
        "field": "available_node_types.worker.max_workers",
    }
    cfg.write_text("provider: {type: local\n")
    r = cli(venv_bin, "up", str(cfg))
    assert r.returncode == 2 and "YAML syntax error at line 2" in r.stderr


def test_capacity_refusal_exit_code_and_oversubscription_warning(venv_bin, state_dir,
                                                                  tmp_path):
    from jupyter_cloudtik.providers.local.capacity import machine_cpus

    cfg = tmp_path / "big.yaml"  # one node with more memory than the machine: cannot run
    cfg.write_text("available_node_types:\n  worker:\n    resources: {memory: 100TiB}\n"
                   "    min_workers: 1\n")
    r = cli(venv_bin, "up", str(cfg))
    assert r.returncode == 2 and "not enough capacity" in r.stderr
    assert "a worker node asks 100.0 TiB of memory, more than one node can have" in r.stderr
    assert json.loads(cli(venv_bin, "list", "--all", "--json").stdout) == []

    # many more threads than cores: runs, with a warning on stderr (stdout stays JSON)
    r = cli(venv_bin, "up", "--workers", "1", "--cores", str(3 * machine_cpus()),
            "--name", "big", "--json")
    assert r.returncode == 0, r.stderr
    assert "WARNING: cluster 'big': oversubscribed: with 1 x worker" in r.stderr
    assert json.loads(r.stdout)["state"] == "running"


def test_failed_operation_exit_code_1(venv_bin, state_dir, tmp_path):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("setup_commands: ['exit 9']\n")
    r = cli(venv_bin, "up", str(cfg))
    assert r.returncode == 1
    assert "setup command 1 failed with exit code 9" in r.stderr
    assert cli(venv_bin, "down").returncode == 0


def test_module_entry_point(state_dir):
    r = subprocess.run([sys.executable, "-m", "jupyter_cloudtik", "list", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout) == []


@pytest.mark.parametrize("args", [["operations"], ["list", "--json"]])
def test_closed_output_pipe_is_no_traceback(venv_bin, state_dir, args):
    """`jupyter cloudtik status NAME --json | head`: the reader goes away before the
    command prints (here its end of the pipe is closed at once); the command exits like a
    program killed by SIGPIPE (141), with nothing on stderr (before: a BrokenPipeError
    traceback)."""
    p = subprocess.Popen([str(venv_bin / "jupyter-cloudtik"), *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(60) == 141, err
    assert err == ""


def test_jupyter_subcommand(venv_bin, state_dir):
    r = subprocess.run([str(venv_bin / "jupyter"), "cloudtik", "--version"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    from jupyter_cloudtik import __version__

    assert r.stdout.strip() == __version__


def test_idle_cluster_is_reaped_without_any_kernel(venv_bin, state_dir, tmp_path):
    cfg = tmp_path / "idle.yaml"
    cfg.write_text("cluster_name: sleepy\nidle_timeout_minutes: 0.03\n")
    r = cli(venv_bin, "up", str(cfg), "--workers", "1")
    assert r.returncode == 0, r.stderr
    # the CLI process is gone; only the reaper daemon can stop it
    deadline = time.monotonic() + 60
    state = None
    while time.monotonic() < deadline:
        state = json.loads(cli(venv_bin, "list", "--all", "--json").stdout)[0]
        if state["state"] == "stopped":
            break
        time.sleep(0.5)
    assert state["state"] == "stopped"
    assert state["reason"].startswith("idle for ")
    assert find_marked_processes(state_dir) == {}
    from jupyter_cloudtik.clusters.reaper import reaper_running

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and reaper_running(state_dir):
        time.sleep(0.2)
    assert not reaper_running(state_dir), "the reaper did not exit with nothing to watch"


def test_worker_size_from_the_command_line(venv_bin, state_dir, tmp_path):
    """`up --cores/--memory`: the worker node type's resources, over the provider's default
    node types (as the panel's form sends them); the Dask worker really gets them."""
    from jupyter_cloudtik import Cluster

    up = cli(venv_bin, "up", "--name", "sized", "--workers", "1", "--cores", "1",
             "--memory", "768MiB", "--json")
    assert up.returncode == 0, up.stderr
    cfg = json.loads(up.stdout)["config"]
    worker = [t for t in cfg["available_node_types"] if t != cfg["head_node_type"]]
    assert len(worker) == 1
    res = cfg["available_node_types"][worker[0]]["resources"]  # normalised: bytes
    assert (res["CPU"], res["memory"]) == (1, 768 * 2**20)
    client = Cluster.get("sized").client()
    try:
        (info,) = client.scheduler_info()["workers"].values()
        assert info["memory_limit"] == 768 * 2**20 and info["nthreads"] == 1
    finally:
        client.close()
    assert cli(venv_bin, "down", "sized").returncode == 0
    # a config with two worker types: which one is meant? the message says where to set it
    two = tmp_path / "two.yaml"
    two.write_text("available_node_types:\n"
                   "  head: {resources: {CPU: 0}}\n"
                   "  small: {resources: {CPU: 1}, min_workers: 1}\n"
                   "  big: {resources: {CPU: 2}}\n")
    r = cli(venv_bin, "up", str(two), "--cores", "2")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert ("cores: the config has 2 worker node types (small, big); set the size of each "
            "in available_node_types.<type>.resources instead") in r.stderr
