"""Interactive kernels on the real Slurm (hpc/kernels/): a kernel started by jupyter_client's
KernelManager through the ``cloudtik-hpc`` provisioner runs as a batch job, is reached
through its connection (SSH tunnels to the node's loopback over SSH), runs cells, is
interrupted, restarted and shut down (the job ends); a job cancelled while queued and a
job whose wall time runs out are reported with the reason; bad profiles are refused in
one line."""

from __future__ import annotations

import asyncio
import importlib.metadata as md
import re
import subprocess
import sys
import time

import pytest
from traitlets.config import Config

from jupyter_cloudtik.core.errors import CloudTikError

from . import test_hpc_environment as _site
from .conftest import wait_for

# a site's own account, its sshd and a Slurm it can reach (test_hpc_environment.py)
ACCOUNT = _site.ACCOUNT
job_account, env_sshd, site_slurm = _site.job_account, _site.env_sshd, _site.site_slurm


@pytest.fixture(autouse=True)
def provisioner_registered():
    """The ``cloudtik-hpc`` entry point, as an installed package has it (pyproject.toml);
    a development checkout installed before it was added has not."""
    from jupyter_client.provisioning import KernelProvisionerFactory

    factory = KernelProvisionerFactory.instance()
    if "cloudtik-hpc" not in factory.provisioners:
        factory.provisioners["cloudtik-hpc"] = md.EntryPoint(
            "cloudtik-hpc", "jupyter_cloudtik.hpc.kernels:HPCKernelProvisioner",
            "jupyter_client.kernel_provisioners")
    yield
    from jupyter_cloudtik.hpc.kernels.provisioner import close_registries

    close_registries()


def _config(backends: dict, profiles: list, **kernels) -> Config:
    return Config({"HPC": {"backends": backends},
                   "HPCKernels": {"profiles": profiles, "poll_interval": 0.5, **kernels}})


def _manager(config: Config, name: str):
    from jupyter_client.manager import AsyncKernelManager

    from jupyter_cloudtik.hpc.kernels import HPCKernelSpecManager

    ksm = HPCKernelSpecManager(config=config)
    return AsyncKernelManager(kernel_name=name, kernel_spec_manager=ksm, config=config)


async def _run(kc, code: str, timeout: float = 120.0) -> tuple[dict, str]:
    """Execute ``code``; its reply's content and everything it printed."""
    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    reply = await kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return reply["content"], "".join(out)


def _squeue(env: dict, job: str) -> str:
    r = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True,
                       env={**__import__("os").environ, **env})
    return r.stdout.strip()


def _state(km) -> dict:
    from jupyter_cloudtik.hpc.kernels import kernel_status

    return kernel_status().get(km.kernel_id, {})


@pytest.fixture
def local_slurm(slurm, tmp_path):
    return {"type": "slurm", "env": slurm.env, "workdir": str(tmp_path / "kjobs")}


def test_profiles_are_launcher_specs_and_bad_ones_are_refused(local_slurm, firecrest_service):
    from jupyter_cloudtik.hpc.kernels import kernel_specs

    backends = {"here": local_slurm,
                "eiger": {"type": "firecrest", "url": firecrest_service.url,
                          "token_uri": firecrest_service.info["token_uri"],
                          "client_id": "cloudtik", "system": "testsys"}}
    profiles = [{"name": "small", "backend": "here", "cores": 1, "time": "2h",
                 "custom": {"cores": 2, "time": "1h"}},
                {"name": "big", "backend": "here", "cores": 8, "time": "30m"},
                {"name": "long", "backend": "here", "cores": 1, "time": "3h"},
                {"name": "cscs", "backend": "eiger", "cores": 4, "time": "1h"}]
    config = _config(backends, profiles)
    specs, skipped = kernel_specs(type("P", (), {"config": config})())
    assert specs["cloudtik-hpc-here-small"]["display_name"] == "Python 3 on here — 1 core, 2 h"
    assert specs["cloudtik-hpc-here-big"]["display_name"] == "Python 3 on here — 8 cores, 30 min"
    assert specs["cloudtik-hpc-here-small"]["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "cloudtik-hpc", "config": {"backend": "here", "profile": "small"}}
    # FirecREST cannot reach a port on the node: no spec, and a line saying why
    assert "cloudtik-hpc-eiger-cscs" not in specs
    assert len(skipped) == 1 and "'eiger' (firecrest) cannot run interactive kernels" in \
        skipped[0] and "\n" not in skipped[0]
    # the launcher's list (a KernelSpecManager) has them beside the installed kernels
    from jupyter_cloudtik.hpc.kernels import HPCKernelSpecManager

    all_specs = HPCKernelSpecManager(config=config).get_all_specs()
    assert "python3" in all_specs and "cloudtik-hpc-here-small" in all_specs

    async def refused(km) -> str:
        with pytest.raises(CloudTikError) as e:  # ConfigError, CapacityError
            await km.start_kernel()
        assert not km.has_kernel
        return str(e.value)

    async def main():
        # sizes beyond the partition (2 CPUs, at most 60 min): refused before sbatch
        msg = await refused(_manager(config, "cloudtik-hpc-here-big"))
        assert re.fullmatch(r"cpus: 8 per node is more than backend 'here', queue 'debug', "
                            r"has \(at most 2\)", msg), msg
        msg = await refused(_manager(config, "cloudtik-hpc-here-long"))
        assert msg == ("time: 03:00:00 is longer than backend 'here', queue 'debug', "
                       "allows (at most 01:00:00)"), msg
        # a profile that does not exist (a kernel spec written by hand, or an old one)
        from jupyter_client.kernelspec import KernelSpec

        km = _manager(config, "cloudtik-hpc-here-small")
        spec = km.kernel_spec.to_dict()
        spec["metadata"]["kernel_provisioner"]["config"]["profile"] = "huge"
        km._kernel_spec = KernelSpec(resource_dir=km.kernel_spec.resource_dir, **spec)
        msg = await refused(km)
        assert msg == ("profile: unknown profile 'huge' for backend 'here'; configured: big, "
                       "long, small"), msg
        # a custom size written into a spec by hand: checked against the admin's bounds
        # at the start like the form's, and a malformed one is one line too
        for custom, line in (({"cores": 64, "time": "1h"},
                              "cores: 64 is more than profile 'small' allows (at most 2)"),
                             ({"cores": 1, "time": "1h", "nodes": 9},
                              "custom.nodes: not a size; allowed: cores, memory, time, gpus"),
                             ("everything", "custom: expected a mapping of cores, memory, "
                                            "time, gpus, got 'everything'")):
            spec["metadata"]["kernel_provisioner"]["config"] = {
                "backend": "here", "profile": "small", "custom": custom}
            km = _manager(config, "cloudtik-hpc-here-small")
            km._kernel_spec = KernelSpec(resource_dir=km.kernel_spec.resource_dir, **spec)
            assert await refused(km) == line
        # ... and so is a custom size's spec name (a notebook's metadata, edited)
        with pytest.raises(CloudTikError) as e:
            _manager(config, "cloudtik-hpc-here-small--c64-t60m").kernel_spec  # noqa: B018
        assert str(e.value) == "cores: 64 is more than profile 'small' allows (at most 2)"
        # a backend without interactive support, asked for all the same
        spec["metadata"]["kernel_provisioner"]["config"] = {"backend": "eiger",
                                                             "profile": "cscs"}
        km = _manager(config, "cloudtik-hpc-here-small")
        km._kernel_spec = KernelSpec(resource_dir=km.kernel_spec.resource_dir, **spec)
        msg = await refused(km)
        assert msg.startswith("backend: 'eiger' (firecrest) cannot run interactive kernels: "
                              "FirecREST"), msg

    asyncio.run(main())
    out = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True,
                         env={**__import__("os").environ, **local_slurm["env"]}).stdout
    assert "kernel-" not in out  # nothing was submitted


@pytest.mark.slow
def test_kernel_on_local_slurm_runs_interrupts_restarts_and_ends(local_slurm, slurm):
    config = _config({"here": local_slurm},
                     [{"name": "small", "backend": "here", "cores": 1, "time": "10m"}])

    async def main():
        km = _manager(config, "cloudtik-hpc-here-small")
        await km.start_kernel()
        first = _state(km)
        assert first["state"] == "running" and first["job"], first
        assert _squeue(slurm.env, first["job"]) == "RUNNING"
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=60)
        reply, out = await _run(kc, "import os, sys\nprint(os.environ['SLURM_JOB_ID'], "
                                    "os.environ['SLURM_CPUS_PER_TASK'], sys.executable)")
        assert reply["status"] == "ok"
        job, cpus, python = out.split()
        assert job == first["job"] and cpus == "1" and python == sys.executable

        # interrupt a long sleep: the cell ends with KeyboardInterrupt, the kernel lives
        t0 = time.monotonic()
        run = asyncio.ensure_future(_run(kc, "import time\ntime.sleep(300)"))
        await asyncio.sleep(2)
        await km.interrupt_kernel()
        reply, out = await asyncio.wait_for(run, 60)
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
        assert time.monotonic() - t0 < 60
        reply, out = await _run(kc, "print(6 * 7)")
        assert out.strip() == "42"

        # restart: a new job, the old one ended; state is fresh
        await _run(kc, "x = 1")
        await km.restart_kernel()
        second = _state(km)
        assert second["job"] != first["job"] and second["state"] == "running"
        wait_for(lambda: _squeue(slurm.env, first["job"]) in ("", "COMPLETED", "CANCELLED"),
                 60, what="the first job to end")
        kc.stop_channels()
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=60)
        reply, out = await _run(kc, "print('x' in dir())")
        assert out.strip() == "False"

        # shutdown: the job ends, the connection file (it holds the key) is gone
        folder = f"{local_slurm['workdir']}/{km.provisioner.job.job_id}"
        kc.stop_channels()
        await km.shutdown_kernel()
        wait_for(lambda: _squeue(slurm.env, second["job"]) in ("", "COMPLETED", "CANCELLED"),
                 60, what="the kernel's job to end")
        assert not __import__("os").path.exists(f"{folder}/kernel.json")

    asyncio.run(main())


async def interrupt_and_shut_down(km, kc, env: dict, job: str, workdir: str) -> None:
    """A sleeping cell interrupted through the tunnel (the kernel lives), then shutdown:
    the job ends and the connection file (it holds the key) is gone."""
    import os

    run = asyncio.ensure_future(_run(kc, "import time\ntime.sleep(300)"))
    await asyncio.sleep(2)
    await km.interrupt_kernel()
    reply, _ = await asyncio.wait_for(run, 60)
    assert reply["ename"] == "KeyboardInterrupt"
    kc.stop_channels()
    await km.shutdown_kernel()
    wait_for(lambda: _squeue(env, job) in ("", "COMPLETED", "CANCELLED"), 60,
             what="the kernel's job to end")
    assert not os.path.exists(f"{workdir}/{km.provisioner.job.job_id}/kernel.json")


def _sbatch(env: dict, *argv: str) -> str:
    r = subprocess.run(["sbatch", "--parsable", *argv], capture_output=True, text=True,
                       env={**__import__("os").environ, **env}, check=True)
    return r.stdout.strip().split(";")[0]


def _scancel(env: dict, job: str) -> None:
    subprocess.run(["scancel", job], env={**__import__("os").environ, **env}, check=False)


@pytest.mark.slow
def test_cancelled_while_queued_and_wall_time_are_reported(local_slurm, slurm, tmp_path):
    config = _config({"here": local_slurm},
                     [{"name": "minute", "backend": "here", "cores": 1, "time": "1m"}],
                     warn_before=45)

    async def main():
        # the node is full: the kernel's job waits in the queue, which the status says
        blocker = _sbatch(slurm.env, "-c", "2", "-t", "10", "-o", "/dev/null",
                          "--chdir", str(tmp_path), "--wrap", "sleep 600")
        try:
            km = _manager(config, "cloudtik-hpc-here-minute")
            start = asyncio.ensure_future(km.start_kernel())
            for _ in range(600):
                st = _state(km)
                if st.get("state") == "queued" and st.get("native_state") == "PENDING" \
                        and st.get("reason"):
                    break
                await asyncio.sleep(0.1)
            assert st["state"] == "queued" and st["reason"] in ("Resources", "Priority"), st
            _scancel(slurm.env, st["job"])  # the user (or an admin) cancels it
            with pytest.raises(RuntimeError) as e:
                await asyncio.wait_for(start, 60)
            assert (f"job {st['job']} on here ended before the kernel started: "
                    "cancelled (scancel)") in str(e.value)
            assert _state(km)["state"] == "dead"
        finally:
            _scancel(slurm.env, blocker)

        # a one-minute kernel: warned in the notebook, then dead with the reason
        km = _manager(config, "cloudtik-hpc-here-minute")
        await km.start_kernel()
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=60)
        _, out = await _run(kc, "import time\ntime.sleep(25)\nprint('slept')")
        assert "reaches its wall time in about 1 min" in out and "slept" in out, out
        job = _state(km)["job"]
        t0 = time.monotonic()
        while await km.is_alive():
            assert time.monotonic() - t0 < 150, _state(km)
            await asyncio.sleep(1)
        st = _state(km)
        assert st["state"] == "dead" and st["reason"] == "the time limit was reached", st
        assert st["native_state"] == "TIMEOUT" and st["job"] == job
        kc.stop_channels()
        await km.shutdown_kernel(now=True)

    asyncio.run(main())


@pytest.mark.slow
def test_kernel_over_ssh_as_another_account_through_a_tunnel(
        site_slurm, env_sshd, job_account, make_client):
    """A site as it is: the login node over SSH, the job as the user's own account with
    the session's packages built on the system, the kernel on the node's loopback and
    reached through SSH to the node (here the same sshd, named by address)."""
    import uuid

    workdir = f"{job_account.pw_dir}/k-{uuid.uuid4().hex[:8]}"
    backend = {"type": "slurm", "host": "127.0.0.1", "port": env_sshd.port, "user": ACCOUNT,
               "known_hosts": str(env_sshd.folder / "known_hosts"), "env": site_slurm.env,
               "workdir": workdir, "environment": {"packages": ["ipykernel"]},
               "kernel_node_address": "127.0.0.1", "kernel_node_port": env_sshd.port}
    # the key goes in the secret store as for jobs (`jupyter cloudtik jobs secret`)
    make_client({"site": backend}, {("site", "ssh_key"): env_sshd.private_key})
    config = _config({"site": backend},
                     [{"name": "small", "backend": "site", "cores": 1, "time": "10m"}])

    async def main():
        km = _manager(config, "cloudtik-hpc-site-small")
        await km.start_kernel()
        st = _state(km)
        assert st["state"] == "running", st
        # the server talks to local ports only: the tunnels' ends, not the kernel's
        info = km.get_connection_info()
        kernel_ports = km.provisioner.job.ports()
        assert info["ip"] == "127.0.0.1"
        assert {info[p] for p in kernel_ports} & set(kernel_ports.values()) == set()
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=120)
        _, out = await _run(kc, "import getpass, sys, os\n"
                                    "print(getpass.getuser(), sys.prefix, "
                                    "os.environ['SLURM_JOB_ID'])")
        user, prefix, job = out.split()
        assert user == ACCOUNT and prefix.startswith(f"{workdir}/.cloudtik-envs/")
        assert job == st["job"]
        await interrupt_and_shut_down(km, kc, site_slurm.env, job, workdir)

    try:
        asyncio.run(main())
    finally:
        subprocess.run(["rm", "-rf", "--", workdir], check=False)
