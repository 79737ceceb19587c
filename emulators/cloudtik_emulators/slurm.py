"""A real single-node Slurm cluster in a folder: munged, slurmctld and slurmd from Debian.

For tests and demos of the ``slurm`` backend without a supercomputer::

    python -m cloudtik_emulators.slurm /tmp/slurm     # prints SLURM_CONF, Ctrl-C stops

The daemons run in the foreground as children of this process (so they are reaped, and a
crash of the owner leaves nothing behind but its folder), on free loopback ports, with a
private munge socket and key.  ``batch_sched_delay=0`` lets a job start as soon as it can
(Slurm's default waits up to 3 s).

With ``accounting=True`` (the default when Debian's ``slurmdbd`` and ``mariadb-server`` are
installed) it runs as real sites do: a private MariaDB (its own data folder, socket and
loopback port) behind ``slurmdbd``, and ``AccountingStorageType=accounting_storage/slurmdbd``,
so ``sacct`` answers for finished jobs long after ``squeue`` has forgotten them (FirecREST
asks ``sacct`` for every job listing).  With a private munge socket slurmctld must be told
the socket in ``AccountingStoragePass`` too, or it cannot talk to slurmdbd and dies with
"we have no TRES from it".  The MariaDB data folder is made once per machine
(``mariadb-install-db`` takes ~3 s) and copied for each cluster.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from jupyter_cloudtik.core import ports

REQUIRED = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol")
ACCOUNTING = ("slurmdbd", "sacct", "sacctmgr", "mariadbd", "mariadb-install-db", "mariadb")


def missing_programs(accounting: bool = False) -> list[str]:
    paths = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    wanted = REQUIRED + (ACCOUNTING if accounting else ())
    return [p for p in wanted if shutil.which(p, path=paths) is None]


def accounting_available() -> bool:
    return not missing_programs(accounting=True)


def _free_port() -> int:
    return ports.free_port()


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _mariadb_template() -> Path:
    """An empty MariaDB data folder, made once per machine and user (copying it takes
    ~0.1 s; making it ~3 s)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    template = base / "cloudtik-test" / "mariadb-10-data"
    if (template / ".complete").exists():
        return template
    template.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="mariadb-", dir=template.parent))
    try:
        subprocess.run([_which("mariadb-install-db"), "--no-defaults", f"--datadir={tmp}",
                        "--auth-root-authentication-method=socket", "--skip-test-db",
                        "--innodb-log-file-size=8M",
                        *(["--user=root"] if os.getuid() == 0 else [])],
                       check=True, capture_output=True, timeout=120)
        (tmp / ".complete").write_text("1\n")
        try:
            tmp.rename(template)
        except OSError:  # made by another session meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return template


def _which(name: str) -> str:
    paths = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    found = shutil.which(name, path=paths)
    if not found:
        raise RuntimeError(f"{name} is not installed (Debian: slurm-wlm, munge, slurmdbd, "
                           "mariadb-server)")
    return found


class SlurmCluster:
    """munged + slurmctld + slurmd for one node called ``localhost``."""

    def __init__(self, folder: str | os.PathLike[str], cpus: int = 2, memory_mb: int = 2000,
                 max_time_minutes: int = 60, partition: str = "debug",
                 accounting: bool | None = None, min_job_age: int = 300,
                 compute: Any = None) -> None:
        """``compute``: a ``netns.VethPeer`` — the node (``nid001``, its slurmd and so its
        jobs) runs in that network namespace, another machine on the LAN reached at its
        ``peer_ip``, with its own loopback; the controller listens on this machine and the
        node reaches it at ``host_ip``."""
        self.folder = Path(folder).resolve()
        self.compute = compute
        self.node = "nid001" if compute is not None else "localhost"
        self.cpus, self.memory_mb = cpus, memory_mb
        self.max_time_minutes, self.partition = max_time_minutes, partition
        self.accounting = accounting_available() if accounting is None else accounting
        self.min_job_age = min_job_age
        self.conf = self.folder / "slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}
        self.db_port = self.dbd_port = 0
        self.timings: dict[str, float] = {}

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        f = self.folder
        for sub in ("munge", "state", "spool", "log"):
            (f / sub).mkdir(parents=True, exist_ok=True)
        (f / "munge").chmod(0o700)
        ctld, slurmd = _free_port(), _free_port()
        if self.accounting:
            accounting = (f"AccountingStorageType=accounting_storage/slurmdbd\n"
                          f"AccountingStorageHost=localhost\n"
                          f"AccountingStoragePort={self.dbd_port}\n"
                          f"AccountingStoragePass={f}/munge/munge.sock\n"
                          "AccountingStoreFlags=job_comment\n"
                          "JobAcctGatherType=jobacct_gather/none\n")
        else:
            accounting = "AccountingStorageType=accounting_storage/none\n"
        ctld_host = (f"localhost({self.compute.host_ip})" if self.compute is not None
                     else "localhost")
        node_addr = f" NodeAddr={self.compute.peer_ip}" if self.compute is not None else ""
        self.conf.write_text(f"""\
ClusterName=cloudtik-test
SlurmctldHost={ctld_host}
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
{accounting}MpiDefault=none
MailProg=/bin/true
ReturnToService=2
MinJobAge={self.min_job_age}
KillWait=2
InactiveLimit=0
SlurmdTimeout=10
MessageTimeout=4
NodeName={self.node}{node_addr} CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN
PartitionName={self.partition} Nodes={self.node} Default=YES \
MaxTime={self.max_time_minutes} State=UP
""")

    def start(self, timeout: float = 30.0) -> SlurmCluster:
        t0 = time.monotonic()
        if self.accounting:
            self.db_port, self.dbd_port = _free_port(), _free_port()
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
            if self.accounting:
                self._start_accounting(log, env, timeout)
            self.procs["slurmctld"] = subprocess.Popen(
                [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)], stdout=log,
                stderr=log, env=env, start_new_session=True)
            # nsenter, not `ip netns exec`: that remounts /sys for the namespace, and slurmd
            # then finds no cgroup filesystem (the network namespace alone is the point)
            inside = ([_which("nsenter"), f"--net=/var/run/netns/{self.compute.namespace}"]
                      if self.compute is not None else [])
            self.procs["slurmd"] = subprocess.Popen(
                [*inside, _which("slurmd"), "-D", "-f", str(self.conf), "-N", self.node],
                stdout=log, stderr=log, env=env, start_new_session=True)
        finally:
            log.close()
        self._wait_for(self._idle, timeout, "the node to become idle")
        self.timings["total"] = time.monotonic() - t0
        return self

    # accounting: MariaDB + slurmdbd -------------------------------------------------------
    def _start_accounting(self, log, env: dict[str, str], timeout: float) -> None:
        f = self.folder
        t0 = time.monotonic()
        data = f / "mysql" / "data"
        if not data.exists():
            data.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(_mariadb_template(), data, symlinks=True)
        sock = f / "mysql" / "mysqld.sock"
        self.procs["mariadbd"] = subprocess.Popen(
            [_which("mariadbd"), "--no-defaults", f"--datadir={data}", f"--socket={sock}",
             f"--port={self.db_port}", "--bind-address=127.0.0.1", "--skip-name-resolve",
             f"--pid-file={f}/mysql/mysqld.pid", f"--log-error={f}/log/mariadb.log",
             "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=8M",
             "--skip-log-bin", *(["--user=root"] if os.getuid() == 0 else [])],
            stdout=log, stderr=log, env=env, start_new_session=True)
        self._wait_for(lambda: sock.exists(), min(timeout, 20), "MariaDB to listen")
        password = secrets.token_hex(12)
        sql = (f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';"
               f"ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';"
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")
        subprocess.run([_which("mariadb"), "--no-defaults", f"--socket={sock}", "-uroot",
                        "-e", sql], check=True, capture_output=True, timeout=30)
        self.timings["mariadb"] = time.monotonic() - t0
        user = os.environ.get("USER", "root") if os.getuid() else "root"
        dbd_conf = f / "slurmdbd.conf"
        dbd_conf.write_text(f"""\
AuthType=auth/munge
AuthInfo=socket={f}/munge/munge.sock
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={self.dbd_port}
SlurmUser={user}
PidFile={f}/slurmdbd.pid
LogFile={f}/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.db_port}
StorageUser=slurm
StoragePass={password}
StorageLoc=slurm_acct_db
""")
        dbd_conf.chmod(0o600)
        self.procs["slurmdbd"] = subprocess.Popen(
            [_which("slurmdbd"), "-D"], stdout=log, stderr=log, env=env,
            start_new_session=True)
        self._wait_for(lambda: _listening(self.dbd_port), min(timeout, 30), "slurmdbd")
        self.timings["slurmdbd"] = time.monotonic() - t0

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
        for name in ("slurmd", "slurmctld", "slurmdbd", "mariadbd", "munged"):
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
    parser.add_argument("--no-accounting", action="store_true",
                        help="no slurmdbd/MariaDB (sacct will not work)")
    args = parser.parse_args(argv)
    # sigwait needs the signals blocked, or SIGTERM kills this process before it can stop
    # the daemons (they would outlive it)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    cluster = SlurmCluster(args.folder, args.cpus, args.memory_mb,
                           accounting=False if args.no_accounting else None).start()
    print(f"SLURM_CONF={cluster.conf}", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
