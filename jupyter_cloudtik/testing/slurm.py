"""A real single-node Slurm cluster in a folder: munged, slurmctld and slurmd from Debian.

For tests and demos of the ``slurm`` backend without a supercomputer::

    python -m jupyter_cloudtik.testing.slurm /tmp/slurm     # prints SLURM_CONF, Ctrl-C stops

The daemons run in the foreground as children of this process (so they are reaped, and a
crash of the owner leaves nothing behind but its folder), on free loopback ports, with a
private munge socket and key.  ``batch_sched_delay=0`` lets a job start as soon as it can
(Slurm's default waits up to 3 s).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

REQUIRED = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol")


def missing_programs() -> list[str]:
    paths = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [p for p in REQUIRED if shutil.which(p, path=paths) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _which(name: str) -> str:
    paths = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    found = shutil.which(name, path=paths)
    if not found:
        raise RuntimeError(f"{name} is not installed (Debian: slurm-wlm, munge)")
    return found


class SlurmCluster:
    """munged + slurmctld + slurmd for one node called ``localhost``."""

    def __init__(self, folder: str | os.PathLike[str], cpus: int = 2, memory_mb: int = 2000,
                 max_time_minutes: int = 60, partition: str = "debug") -> None:
        self.folder = Path(folder).resolve()
        self.cpus, self.memory_mb = cpus, memory_mb
        self.max_time_minutes, self.partition = max_time_minutes, partition
        self.conf = self.folder / "slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        f = self.folder
        for sub in ("munge", "state", "spool", "log"):
            (f / sub).mkdir(parents=True, exist_ok=True)
        (f / "munge").chmod(0o700)
        ctld, slurmd = _free_port(), _free_port()
        self.conf.write_text(f"""\
ClusterName=cloudtik-test
SlurmctldHost=localhost
SlurmctldPort={ctld}
SlurmdPort={slurmd}
AuthType=auth/munge
AuthInfo=socket={f}/munge/munge.sock
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SlurmUser={os.environ.get("USER", "root") if os.getuid() else "root"}
StateSaveLocation={f}/state
SlurmdSpoolDir={f}/spool
SlurmctldPidFile={f}/slurmctld.pid
SlurmdPidFile={f}/slurmd.pid
SlurmctldLogFile={f}/log/slurmctld.log
SlurmdLogFile={f}/log/slurmd.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
MinJobAge=300
KillWait=2
InactiveLimit=0
SlurmdTimeout=10
MessageTimeout=4
NodeName=localhost CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN
PartitionName={self.partition} Nodes=localhost Default=YES MaxTime={self.max_time_minutes} State=UP
""")

    def start(self, timeout: float = 30.0) -> SlurmCluster:
        self._write_config()
        f = self.folder
        key = f / "munge" / "munge.key"
        if not key.exists():
            subprocess.run([_which("mungekey"), "--create", f"--keyfile={key}"], check=True,
                           capture_output=True)
        key.chmod(0o600)
        env = {**os.environ, **self.env}
        log = open(f / "log" / "daemons.log", "ab")  # noqa: SIM115 - kept for the daemons
        try:
            self.procs["munged"] = subprocess.Popen(
                [_which("munged"), "--foreground", "--force", f"--socket={f}/munge/munge.sock",
                 f"--key-file={key}", f"--pid-file={f}/munge/munged.pid",
                 f"--log-file={f}/munge/munged.log", f"--seed-file={f}/munge/seed"],
                stdout=log, stderr=log, env=env, start_new_session=True)
            self._wait_for(lambda: (f / "munge" / "munge.sock").exists(), 10, "munged")
            self.procs["slurmctld"] = subprocess.Popen(
                [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)], stdout=log,
                stderr=log, env=env, start_new_session=True)
            self.procs["slurmd"] = subprocess.Popen(
                [_which("slurmd"), "-D", "-f", str(self.conf), "-N", "localhost"], stdout=log,
                stderr=log, env=env, start_new_session=True)
        finally:
            log.close()
        self._wait_for(self._idle, timeout, "the node to become idle")
        return self

    def _idle(self) -> bool:
        r = subprocess.run([_which("sinfo"), "-h", "-o", "%t"], capture_output=True,
                           env={**os.environ, **self.env}, timeout=10)
        return r.returncode == 0 and r.stdout.decode().strip() in ("idle", "mix", "alloc")

    def _wait_for(self, check, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode}; see "
                                       f"{self.folder}/log")
            try:
                if check():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"timed out waiting for {what}; see {self.folder}/log")

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), capture_output=True, text=True, check=check,
                              env={**os.environ, **self.env}, timeout=60)

    def stop_controller(self) -> None:
        """Stop slurmctld only (the backend is "down"; running jobs go on)."""
        p = self.procs.pop("slurmctld", None)
        if p is not None:
            p.terminate()
            p.wait(10)

    def start_controller(self, timeout: float = 30.0) -> None:
        f = self.folder
        with open(f / "log" / "daemons.log", "ab") as log:
            self.procs["slurmctld"] = subprocess.Popen(
                [_which("slurmctld"), "-D", "-f", str(self.conf)], stdout=log, stderr=log,
                env={**os.environ, **self.env}, start_new_session=True)
        self._wait_for(self._idle_or_busy, timeout, "slurmctld to know its node again")

    def _idle_or_busy(self) -> bool:
        r = subprocess.run([_which("sinfo"), "-h", "-o", "%t"], capture_output=True,
                           env={**os.environ, **self.env}, timeout=10)
        state = r.stdout.decode().strip().rstrip("*~#")
        return r.returncode == 0 and state in ("idle", "mix", "alloc", "comp")

    def stop(self) -> None:
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            subprocess.run([_which("scancel"), "--me"], capture_output=True,
                           env={**os.environ, **self.env}, timeout=30)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                r = subprocess.run([_which("squeue"), "-h", "--me"], capture_output=True,
                                   env={**os.environ, **self.env}, timeout=10)
                if r.returncode != 0 or not r.stdout.strip():
                    break
                time.sleep(0.1)
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.pop(name, None)
            if p is None:
                continue
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        self._kill_steps()

    def _kill_steps(self) -> None:
        """slurmstepd outlives slurmd by design; end the ones of this cluster."""
        spool = str(self.folder / "spool")
        for proc in psutil.process_iter(["name", "cmdline"]):
            try:
                if proc.info["name"] != "slurmstepd":
                    continue
                if any(spool in (a or "") for a in proc.info["cmdline"] or []) or \
                        proc.environ().get("SLURM_CONF") == str(self.conf):
                    proc.kill()
            except (psutil.Error, OSError):
                continue

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--memory-mb", type=int, default=2000)
    args = parser.parse_args(argv)
    cluster = SlurmCluster(args.folder, args.cpus, args.memory_mb).start()
    print(f"SLURM_CONF={cluster.conf}", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
