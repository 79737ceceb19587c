"""The Slurm cluster's mutual TLS: whether it is on (off only when everything is this
machine's loopback), the cluster's certificates staged as 0600 files next to the job
logs (never in a job script, a command line or the jobs' environment), and the
dashboard relay's code a scheduler job runs beside a TLS scheduler.
"""

from __future__ import annotations

from ..core.errors import ProviderError
from ..runtime.dashboard_relay import relay_source

#: appended to the shared relay's source on the login node: a scheduler job runs it with
#: its TLS folder, Dask's scheduler file, the file to publish and the scheduler's pid.  It
#: binds the scheduler's own address (a free port), and only then publishes Dask's
#: scheduler file with the relay's address added, so whoever reads it finds both at once
RELAY_MAIN = r'''
if __name__ == "__main__":
    import json, sys, time
    tls_dir, dask_file, out_file, pid = sys.argv[1:5]
    while True:
        if not _alive(int(pid)):
            sys.exit(0)
        try:
            with open(dask_file) as f:
                data = json.load(f)
            break
        except (OSError, ValueError):
            time.sleep(0.05)
    host = data["address"].split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    where = f"[{host}]" if ":" in host else host  # as Dask writes an IPv6 address
    done = []

    def publish(extra):
        tmp = out_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({**data, "cloudtik": extra}, f)
        os.replace(tmp, out_file)
        done.append(True)

    dash = (data.get("services") or {}).get("dashboard")
    if not dash:
        publish({"dashboard_relay_error": "the scheduler serves no dashboard"})
        sys.exit(0)
    try:
        dashboard_relay(host, 0, dash, tls_dir, pid, cert="node.pem", key="node-key.pem",
                        ready=lambda port: publish({"dashboard_relay": f"{where}:{port}"}))
    except Exception as e:
        if not done:  # the cluster works without its dashboard; the reason is recorded
            publish({"dashboard_relay_error": f"{type(e).__name__}: {e}"})
        raise
'''


class SlurmTls:
    """The cluster's certificates where the jobs read them (a part of
    ``SlurmNodeProvider``)."""

    @property
    def tls(self) -> bool:
        """Do client, scheduler and workers speak mutual TLS (runtime/tls.py)?

        Off only when all of them are on this machine's loopback: Slurm here or on a
        loopback login node, every node of the partition ``localhost``, and the scheduler
        bound to loopback.  ``provider.tls`` decides otherwise."""
        if self._tls is None:
            want = self.provider_config.get("tls")
            if want is not None:
                self._tls = bool(want)
            else:
                # deferred: start-up (runtime.tls ~23 ms, loads ssl, socket)
                from ..runtime.tls import is_loopback

                login = getattr(self.login.shell, "host", None)
                self._tls = not (
                    (login is None or is_loopback(login)) and self._all_localhost()
                    and (is_loopback(self._scheduler_host()) if self.mode == "login"
                         else self._interface() == "lo"))
        return self._tls

    def _tls_dir(self) -> str:
        return f"{self.workdir}/tls"

    def _tls_files(self) -> dict[str, str]:
        d = self._tls_dir()
        return {"ca": f"{d}/ca.pem", "cert": f"{d}/node.pem", "key": f"{d}/node-key.pem"}

    def _tls_args(self) -> list[str]:
        if not self.tls:
            return []
        f = self._tls_files()
        return ["--protocol", "tls", "--tls-ca-file", f["ca"], "--tls-cert", f["cert"],
                "--tls-key", f["key"]]

    def _stage_tls(self) -> None:
        """Put the node certificate and key where the jobs read them: 0600 files in a
        0700 folder under the job folder (the user's home, which the compute nodes
        share), written over the transport (SFTP when remote) before sbatch.  They are
        never in a job script, a command line or the jobs' environment; ``down`` removes
        them."""
        if not self.tls or self._staged:
            return
        # deferred: start-up (runtime.tls ~22 ms, loads ssl, socket)
        from ..runtime.tls import ensure_cluster_tls

        tls = ensure_cluster_tls(self.context.state_dir, self.cluster_name)
        shell = self.login.shell
        d = self._tls_dir()
        r = shell.run(["sh", "-c", 'umask 077 && mkdir -p -- "$1" && chmod 700 -- "$1"',
                       "sh", d])
        if r.rc != 0:
            raise ProviderError(f"cannot make {d} on {self.where}: {r.message}")
        files = self._tls_files()
        for key, text in (("ca", tls.ca), ("cert", tls.node_cert), ("key", tls.node_key)):
            shell.write_bytes(files[key], text.encode(), mode=0o600)
        if self.mode == "job":  # the dashboard relay's code (no secret), beside the logs

            shell.write_bytes(self._relay_file(), (relay_source() + RELAY_MAIN).encode(),
                              mode=0o600)
        self._staged = True

    def _relay_file(self) -> str:
        return f"{self.workdir}/dashboard_relay.py"
