"""The sweep of ``hpc_sweep.py`` through the FirecREST and real-ARC test set-ups.

* FirecREST: the project's FirecREST v2 emulator (``cloudtik_emulators.firecrest``, as
  ``tests/hpc/conftest.py`` starts it: its own process, OIDC client-credentials tokens,
  jobs run as processes on this machine), one ``--array`` with the same limit.
* ARC: a real A-REX 6.17 from Debian's packages (``cloudtik_emulators.arex``, as
  ``tests/hpc/test_hpc_arex.py`` starts it: fork LRMS, a test CA, X.509), a bounded set of
  jobs (ARC has no arrays).  It needs root and the packages
  ``scripts/install-system-deps.sh`` installs; where it cannot run the line says why,
  never a number.

Each prints one line (the format is in docs/hpc.md, "Sweeps"); T is submit to every
element finished, S the submit call alone::

    firecrest sweep N: T s (submit S s, A array(s)), K poll ticks, R job-API requests per tick
    arc sweep N: T s (submit S s, J jobs), K poll ticks, R CE calls per tick
    arc sweep N: n/a (<why>)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

SECRET = "bench-sweep-f7t-secret"
F7T_USER = "service-account-cloudtik"  # the user name in the emulator's tokens


def _client(state: Path, backends: dict, limit: int, secrets: dict | None = None):
    from jupyter_cloudtik.core.settings import CloudTik
    from jupyter_cloudtik.hpc.client import JobsClient
    from jupyter_cloudtik.hpc.settings import HPC

    client = JobsClient(
        settings=CloudTik(state_dir=str(state)),
        hpc=HPC(backends=backends, sweep_max_concurrent=max(1, limit)),
    )
    for (backend, key), value in (secrets or {}).items():
        client.manager.secrets.put(f"hpc:{backend}", key, value)
    return client


def _count_ticks(be: Any, calls: str | None = None) -> tuple[list[int], list[int]]:
    """Wrap the backend's ``poll`` (a tick) and, if named, its method that makes one call
    to the service; returns (ticks' call counts, all calls) filled as the sweep runs."""
    ticks: list[int] = []
    total = [0]
    local = threading.local()
    poll = be.poll

    def counted_poll(jobs):
        local.n = 0
        try:
            return poll(jobs)
        finally:
            ticks.append(local.n)
            local.n = None

    be.poll = counted_poll
    if calls:
        call = getattr(be, calls)

        def counted(*a, **kw):
            total[0] += 1
            if getattr(local, "n", None) is not None:
                local.n += 1
            return call(*a, **kw)

        setattr(be, calls, counted)
    return ticks, total


def _run_sweep(client, backend: str, nb: Path, grid: dict, elements: list[dict],
               limit: int) -> tuple[float, float, Any]:
    from jupyter_cloudtik.hpc.api import Job

    how = {"grid": grid} if grid else {"elements": elements}
    t0 = time.perf_counter()
    sweep = Job.sweep(str(nb), backend=backend, client=client, max_concurrent=limit,
                      time="10m", **how)
    submitted = time.perf_counter() - t0
    info = sweep.wait(1800)
    took = time.perf_counter() - t0
    if info.state != "succeeded":
        bad = next((e for e in info.elements if e["state"] != "succeeded"), {})
        raise RuntimeError(f"the sweep ended {info.state} {info.counts}; element "
                           f"{bad.get('index')}: {bad.get('reason')}")
    return took, submitted, info


def firecrest_line(base: Path, nb: Path, grid: dict, elements: list[dict],
                   limit: int, cpus: int) -> str:
    """The sweep through the FirecREST emulator; its line."""
    n = len(elements)
    env = {**os.environ, "EMULATOR_CLIENT_SECRET": SECRET,
           "EMULATOR_ADMIN_TOKEN": "bench-admin-token"}
    parts = {"normal": {"max_time": 3600, "cpus": cpus, "nodes": 1, "memory_mb": 4000,
                        "default": True}}
    (base / "f7t").mkdir(parents=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cloudtik_emulators.firecrest", "--root", str(base / "f7t"),
         "--port", "0", "--system", "testsys", "--partitions", json.dumps(parts)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    client = None
    try:
        line = proc.stdout.readline()
        if not line:
            return f"firecrest sweep {n}: n/a (the emulator did not start)"
        info = json.loads(line)
        client = _client(base / "state-f7t", {"firecrest": {
            "type": "firecrest", "url": info["url"], "token_uri": info["token_uri"],
            "client_id": "cloudtik", "system": "testsys",
            "workdir": f"{info['root']}/{F7T_USER}/jobs",
            # the emulator runs jobs here: its admin names this Python (without it the
            # backend builds the session's environment, its default)
            "environment": {"python": sys.executable}}}, limit,
            {("firecrest", "client_secret"): SECRET})
        ticks, _ = _count_ticks(client.manager.registry.get("firecrest"))
        t_start = time.time()
        took, submitted, sweep = _run_sweep(client, "firecrest", nb, grid, elements, limit)
        t_end = time.time()
        arrays = {e["native_id"].split("_")[0] for e in sweep.elements}
        requests = _admin(info["url"], "requests")["requests"]
        polls = [r for r in requests if t_start <= r["t"] <= t_end
                 and r["method"] == "GET" and r["path"].startswith("/compute/testsys/jobs")]
        per_tick = len(polls) / len(ticks) if ticks else 0.0
        return (f"firecrest sweep {n}: {took:.1f} s (submit {submitted:.2f} s, "
                f"{len(arrays)} array(s)), {len(ticks)} poll ticks, "
                f"{per_tick:.2f} job-API requests per tick")
    except Exception as e:  # no figure: say why
        return f"firecrest sweep {n}: n/a ({type(e).__name__}: {e})"
    finally:
        if client is not None:
            client.close()
        proc.terminate()
        proc.wait(20)


def _admin(url: str, path: str) -> dict:
    import urllib.request

    req = urllib.request.Request(f"{url}/_emulator/{path}",
                                 headers={"X-Emulator-Admin": "bench-admin-token"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def arc_line(base: Path, nb: Path, grid: dict, elements: list[dict], limit: int) -> str:
    """The sweep through a real A-REX 6.17 (X.509, fork LRMS); its line, or why not."""
    n = len(elements)
    try:
        from cloudtik_emulators.arex import ArexSite, host_job_python, missing_arc6
    except ImportError as e:
        return f"arc sweep {n}: n/a (cloudtik_emulators.arex cannot be imported: {e})"
    why = missing_arc6()
    if why:
        return f"arc sweep {n}: n/a ({why})"

    def log(msg: str) -> None:
        print(f"  [arex] {msg}", flush=True)

    site = client = None
    try:
        python = host_job_python(log)
        site = ArexSite(f"cloudtik-bench-arex-{uuid.uuid4().hex[:8]}", log=log)
        site.start()
        config = {"type": "arc", "url": site.url, "ca_certificates": str(site.ca_dir),
                  "certificate": str(site.user_cert), "key": str(site.user_key),
                  "environment": {"python": str(python), "venv": str(python.parent.parent)}}
        client = _client(base / "state-arc", {"arc": config}, limit)
        ticks, _ = _count_ticks(client.manager.registry.get("arc"), "_call")
        took, submitted, sweep = _run_sweep(client, "arc", nb, grid, elements, limit)
        per_tick = sum(ticks) / len(ticks) if ticks else 0.0
        return (f"arc sweep {n}: {took:.1f} s (submit {submitted:.2f} s, "
                f"{len(sweep.elements)} jobs), {len(ticks)} poll ticks, "
                f"{per_tick:.2f} CE calls per tick")
    except Exception as e:  # no figure: say why
        return f"arc sweep {n}: n/a ({type(e).__name__}: {e})"
    finally:
        if client is not None:
            client.close()
        if site is not None:
            site.stop()
            import shutil

            shutil.rmtree(site.root, ignore_errors=True)
