"""What the huaweicloud nodes fetch from the workspace bucket: the cluster's TLS
material and the client's wheels with their manifest (a mixin of ``HuaweiCloudNodeProvider``,
nodes.py); a stock image installs its runtime from there (userdata.py)."""

from __future__ import annotations

import io
import logging
import sys

from ...core.errors import ConfigError
from ...core.grants import policy_for
from ...runtime import environment
from ...runtime.tls import ensure_cluster_tls, remove_cluster_tls
from .clients import EMULATED_OBS_DOMAIN, REAL_OBS
from .userdata import WHEELS_PREFIX, list_keys, manifest_key, tls_object_key, wheel_key

log = logging.getLogger("jupyter_cloudtik.huaweicloud")


class _MemoryFile(io.BytesIO):
    """Bytes the SDK's put_object takes as a file (it wants ``mode == "rb"``): the TLS
    bundle never touches this machine's disk on its way to the bucket."""

    mode = "rb"


class RuntimeStaging:
    """Staging in the workspace bucket, and removing it after the last node; needs
    ``context``, ``clients``, ``workspace()``, ``cluster_name`` and ``_journal`` of the node
    provider."""

    # TLS ------------------------------------------------------------------------------------
    def _obs_endpoint(self) -> str:
        c = self.clients
        if c.config.get("obs_endpoint"):
            return c.config["obs_endpoint"]
        if c.endpoint:  # the emulator
            return f"http://obs.{c.region}.{EMULATED_OBS_DOMAIN}"
        return REAL_OBS.format(region=c.region)

    def _publish_node_tls(self, bucket: str) -> None:
        """Put the nodes' certificate and key where only the cluster's agencies read them:
        an object of the workspace's private bucket (never user data, tags or metadata)."""
        import json

        from huaweicloudsdkobs.v1 import PutObjectRequest

        tls = ensure_cluster_tls(self.context.state_dir, self.cluster_name)
        self.clients.call("obs", "put_object", PutObjectRequest(
            bucket_name=bucket, object_key=tls_object_key(self.cluster_name),
            stream=_MemoryFile(json.dumps(tls.node_credentials()).encode())),
            what="store the nodes' TLS certificate in the workspace bucket")

    def _stage_runtime(self, bucket: str, extra: list[str] | None = None, *,
                       pip: list[str] | None = None, sync_env: bool = False,
                       machines: list[str] | None = None) -> None:
        """The client's wheels (exact versions of dask, distributed, cloudpickle, msgpack
        and what they need; downloaded once into the state folder's cache), plus those of
        ``runtime.pip`` / ``runtime.sync_env`` (runtime/environment.py ``collect``), in the
        workspace bucket, and the cluster's manifest of them: a stock image installs its
        runtime from there (userdata.py).  The packages asked for must be had: if one
        cannot, ``up`` fails here, naming it, before any server is made."""
        import json
        import time as _time

        from huaweicloudsdkobs.v1 import PutObjectRequest

        t0 = _time.monotonic()
        cache = self.context.state_dir / "wheels"
        base = environment.closure([*environment.CHECKED, *(extra or [])])
        try:
            wheels = environment.wheels_for(base, cache)  # pyspark: built once, cached
        except (RuntimeError, OSError) as e:
            if pip or sync_env:
                raise ConfigError(f"runtime: the client's own wheels cannot be had: {e}",
                                  field="runtime") from None
            # nodes whose image already matches still come up; others say what is missing
            log.warning("huaweicloud: could not collect the client's wheels (%s); nodes "
                        "must already have the client's versions", e)
            return
        packages: dict[str, str] = {}
        if pip or sync_env:
            field = "runtime.pip" if pip else "runtime.sync_env"
            try:
                more, packages = environment.collect(
                    pip, sync_env, cache, base,
                    permit=policy_for(self.context.store).build_permit())
            except (RuntimeError, OSError) as e:
                raise ConfigError(f"{field}: {e}", field=field) from None
            wheels = sorted({w.name: w for w in [*wheels, *more]}.values())
        # every node must install them: a wheel made for this client's platform (macOS,
        # Windows, another architecture) is refused here, before any server is made
        for machine in machines or ["x86_64"]:
            for w in wheels:
                problem = environment.wheel_platform_problem(w.name, machine)
                if problem:
                    import platform as _platform

                    raise ConfigError(
                        f"runtime: {problem}; pip here ({sys.platform} "
                        f"{_platform.machine()}) makes wheels for this machine only: run "
                        f"the client on Linux {machine} (e.g. a JupyterLab on a cloud "
                        "server), or use an image that has the client's packages",
                        field="runtime", value=w.name)
        # staged once per workspace: content-addressed keys the clusters share (workspace
        # delete removes them); only the files not there yet are sent
        there = set(list_keys(self.clients, bucket, WHEELS_PREFIX))
        entries = []
        sent = 0
        for w in wheels:
            digest = environment.sha256(w)
            key = wheel_key(digest, w.name)
            entries.append({"key": key, "sha256": digest})
            if key in there:
                continue
            with open(w, "rb") as f:  # pyspark's is 450 MB: not read into memory
                self.clients.call("obs", "put_object", PutObjectRequest(
                    bucket_name=bucket, object_key=key, stream=f),
                    what=f"stage {w.name} in the workspace bucket")
            sent += 1
        self.clients.call("obs", "put_object", PutObjectRequest(
            bucket_name=bucket, object_key=manifest_key(self.cluster_name),
            stream=_MemoryFile(json.dumps({"wheels": entries,
                                           "packages": packages}).encode())),
            what="store the cluster's runtime manifest")
        log.info("huaweicloud: %d wheels for the nodes (%d sent, the rest staged before) in "
                 "%.1fs", len(entries), sent, _time.monotonic() - t0)

    def cleanup(self) -> None:
        """After the last node: the TLS object and the local TLS material go."""
        from huaweicloudsdkobs.v1 import DeleteObjectRequest

        bucket = self.workspace()["resources"].get("bucket")
        if bucket:
            # (the wheels stay: the workspace's clusters share them; workspace delete)
            keys = [tls_object_key(self.cluster_name), manifest_key(self.cluster_name)]
            for key in keys:
                self.clients.call("obs", "delete_object", DeleteObjectRequest(
                    bucket_name=bucket, object_key=key),
                    missing_ok=True, what="delete the cluster's objects")
        remove_cluster_tls(self.context.state_dir, self.cluster_name)
        with self._journal().transaction() as conn:  # nothing of the cluster is left
            conn.execute("DELETE FROM huaweicloud_creates WHERE workspace = ? AND "
                         "cluster = ?", (self.workspace()["name"], self.cluster_name))
