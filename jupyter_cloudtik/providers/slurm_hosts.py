"""Which hosts a Slurm job's own files may send us to.

A cluster's head job writes its scheduler file (``scheduler-<job>.json``: the scheduler's
address, its dashboard port, the TLS relay's address) from inside the job — code that
runs as the user, who can write any address there.  The Jupyter server, its dashboard
proxy, the usage sampler and the SSH tunnels from the login node all connect where that
file says, so an address taken on trust would let a user point the service at anything
it can reach and not they (the hub's internal API, a metadata service, another user's
node): a server-side request forgery.

So the host part of every address read from a job's file is accepted only when Slurm
itself says the job runs there: a node of the job's allocation (``squeue %N``, expanded
by ``scontrol show hostnames``), by its name, its ``NodeAddr``/``NodeHostName``, or an
address that name resolves to where the connection starts (this machine, or the login
node over SSH).  A job that runs nowhere now (pending, ended) has no address to give;
a node list Slurm cannot expand refuses, as an unknown host does.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from ..core.errors import ProviderError


class UntrustedAddress(ProviderError):
    """A job's file named a host that is not one of the job's nodes."""


def _kv(line: str) -> dict[str, str]:
    return dict(t.split("=", 1) for t in line.split() if "=" in t)


def _resolve_here(name: str) -> set[str]:
    try:
        return {a[4][0] for a in socket.getaddrinfo(name, None)}
    except (OSError, UnicodeError):
        return set()


def _resolve_there(shell: Any, names: list[str]) -> set[str]:
    """Addresses the login node resolves ``names`` to (``getent ahosts``: the resolver its
    SSH forwarding uses)."""
    r = shell.run(["getent", "ahosts", *names], timeout=20)
    return {line.split()[0] for line in (r.stdout or "").splitlines() if line.split()}


def job_hosts(login: Any, job_id: str, *, remote: bool) -> set[str]:
    """Every name and address of the nodes Slurm says ``job_id`` runs on; empty when the
    job runs nowhere now (so there is nothing to connect to).  Raises UntrustedAddress
    when Slurm lists nodes it then cannot expand (fail closed)."""
    r = login.slurm(["squeue", "-h", "-j", str(job_id), "-o", "%N"], "squeue")
    nodelist = (r.stdout or "").strip() if r.rc == 0 else ""
    if not nodelist or nodelist in ("(null)", "n/a"):
        return set()  # not running (pending, ended, unknown): nothing of it to reach
    h = login.slurm(["scontrol", "show", "hostnames", nodelist], "scontrol")
    nodes = [n for n in (h.stdout or "").split() if n] if h.rc == 0 else []
    if not nodes:
        raise UntrustedAddress(f"scontrol cannot expand job {job_id}'s node list "
                               f"{nodelist!r}, so its scheduler address cannot be checked")
    names = set(nodes)
    for node in nodes:
        n = login.slurm(["scontrol", "show", "node", "-o", node], "scontrol")
        if n.rc == 0:
            kv = _kv(n.stdout)
            names |= {v for v in (kv.get("NodeAddr"), kv.get("NodeHostName")) if v}
    hosts = set(names)
    if remote:
        hosts |= _resolve_there(login.shell, sorted(names))
    else:
        for name in names:
            hosts |= _resolve_here(name)
    return {_norm(h) for h in hosts}


def _norm(host: str) -> str:
    host = host.strip().strip("[]").lower()
    try:
        return str(ipaddress.ip_address(host.split("%", 1)[0]))
    except ValueError:
        return host.rstrip(".")


def split_host(address: str) -> tuple[str, str]:
    """(host, port) of ``tcp://host:port`` / ``host:port`` / ``[v6]:port``."""
    rest = address.split("://", 1)[-1].rstrip("/")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UntrustedAddress(f"{address!r} is not host:port")
    return host.strip("[]"), port


def check_address(address: str, allowed: set[str], job_id: str, what: str) -> None:
    """Refuse ``address`` (from job ``job_id``'s file) unless its host is one of the job's
    nodes."""
    host, _ = split_host(address)
    if _norm(host) not in allowed:
        raise UntrustedAddress(
            f"the {what} {address!r} written by Slurm job {job_id} is not on a node of "
            f"that job ({', '.join(sorted(allowed)) or 'none'}): not connecting")
