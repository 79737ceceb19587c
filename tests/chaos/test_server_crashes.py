"""Crashes lose nothing: the Jupyter server is SIGKILLed at a random moment while clusters
go up and down, storages copy, notebook jobs are submitted and a storage mounts; after each
restart on the same state folder the next `up`/`down`/copy/mount or job poll finishes the
work.  At the end, over all rounds: orphaned processes, leaked mounts, lost or duplicated
jobs (and job runs), clusters with more or fewer nodes than asked, state that does not read
back and operations left active must all be 0.

Seeded: the seed is printed and named in every failure; ``CLOUDTIK_CHAOS_SEED=N`` replays
it, ``CLOUDTIK_CHAOS_ROUNDS=N`` runs more rounds (docs/security.md, "Crash chaos").
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cloudtik_emulators.huaweicloud.process import start_emulator
from cloudtik_emulators.processes import cloudtik_processes, kill_all
from jupyter_cloudtik.providers.local.processes import find_marked_processes
from jupyter_cloudtik.storage.mounts import fuse_problem, mount_entry
from jupyter_cloudtik.storage.servers import start_server
from tests.huaweicloud.hwc_helpers import cluster_config, workspace_config

from .conftest import (
    ChaosServer,
    call,
    cli_list,
    describe,
    fuse_mounts_under,
    rounds,
    seeded,
    state_corruption,
    wait_no_processes,
    wait_operation,
)

ROUNDS = rounds(2)  # make test: 2 (each ~30 s); a campaign sets CLOUDTIK_CHAOS_ROUNDS
pytestmark = [pytest.mark.chaos, pytest.mark.slow,
              pytest.mark.timeout(120 + 40 * ROUNDS)]  # more rounds, more time

STORAGE = "chaos_s3"
FILES = 300  # small ones: per-file work makes a copy last (about a second) to be killed in
WORKSPACE = "chaos"
MAX_CLUSTERS = 2  # alive at once: two Dask clusters are what 2 cores carry beside a job
ATTEMPTS = 4  # repeats of one intent before it counts as stuck


def _nb(*cells) -> dict:
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                        "language": "python"}},
            "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {"tags": tags},
                       "execution_count": None, "outputs": [], "source": src}
                      for i, (src, tags) in enumerate(cells)]}


# every run of the job appends a line to runs/<tag>: two lines are a job that ran twice
JOB = _nb(("tag = ''\nfactor = 1\nruns = ''", ["parameters"]),
          ("import os, time\n"
           "with open(os.path.join(runs, tag), 'a') as f:\n"
           "    f.write(f'{os.getpid()}\\n')\n"
           "time.sleep(0.5)\n"
           "open('result.txt', 'w').write(str(factor * 7))", []))


@dataclass
class World:
    """What the test asked for; the end state must match it."""

    clusters: dict[str, str] = field(default_factory=dict)  # name -> running | stopped
    jobs: dict[str, int] = field(default_factory=dict)  # tag -> factor
    job_ids: dict[str, set[str]] = field(default_factory=dict)  # tag -> ids answered to us
    copies: list[str] = field(default_factory=list)  # destination folders (root-relative)
    copy_ops: dict[str, str | None] = field(default_factory=dict)
    mount_wanted: bool = False
    stuck: list[str] = field(default_factory=list)  # intents that never completed
    errors: list[str] = field(default_factory=list)  # 5xx and other wrong answers
    kills: list[str] = field(default_factory=list)
    mismatch: list[str] = field(default_factory=list)  # clusters unlike what was asked
    hwc_clusters: set[str] = field(default_factory=set)


class Chaos:
    def __init__(self, base: Path, s3, hwc, seed: int, rng) -> None:
        self.base, self.s3, self.hwc, self.seed, self.rng = base, s3, hwc, seed, rng
        self.srv = ChaosServer(base / "srv", extra_env={
            "HUAWEICLOUD_CREDENTIALS_FILE": str(hwc.dir / "credentials")})
        self.world = World()
        self.round = 0
        self.touched: set[str] = set()  # clusters asked about in this round
        self.last_op: str | None = None  # the operation that finished the last intent

    @property
    def api(self):
        return self.srv.server

    # intents: one request each, its answer may never come ---------------------------------
    def up_body(self, name: str) -> dict:
        if name in self.world.hwc_clusters:  # on the emulated Huawei Cloud
            return {"name": name, "provider": "huaweicloud",
                    "config": cluster_config(name, WORKSPACE, workers=1)}
        return {"name": name, "workers": 1}

    def up(self, name: str) -> None:
        self.world.clusters[name] = "running"
        self.touched.add(name)
        self._expect(call(self.api, "POST", "clusters", json=self.up_body(name)),
                     f"up {name}", (202,))

    def down(self, name: str) -> None:
        self.world.clusters[name] = "stopped"
        self.touched.add(name)
        self._expect(call(self.api, "DELETE", f"clusters/{name}"), f"down {name}",
                     (202, 404))

    def copy(self) -> None:
        dst = f"copies/r{self.round}-{len(self.world.copies)}"
        self.world.copies.append(dst)
        r = call(self.api, "POST", "storage-transfers", json={"src": f"{STORAGE}:",
                                                              "dst": dst})
        self._expect(r, f"copy to {dst}", (202,))
        self.world.copy_ops[dst] = r.json()["operation"]["id"] \
            if r is not None and r.status_code == 202 else None

    def job(self) -> None:
        tag = f"r{self.round}j{len(self.world.jobs)}"
        factor = self.rng.randint(2, 99)
        self.world.jobs[tag] = factor
        self.world.job_ids[tag] = set()
        self._submit(tag, factor)

    def _submit(self, tag: str, factor: int) -> None:
        r = call(self.api, "POST", "jobs", json={
            "notebook": "chaos/job.ipynb", "time": "5m",
            "parameters": {"tag": tag, "factor": factor,
                           "runs": str(self.srv.root / "runs")}})
        self._expect(r, f"job {tag}", (202,))
        if r is not None and r.status_code == 202:
            self.world.job_ids[tag].add(r.json()["job"]["id"])

    def toggle_mount(self) -> None:
        self.world.mount_wanted = not self.world.mount_wanted
        if self.world.mount_wanted:
            r = call(self.api, "POST", f"storages/{STORAGE}/mount", json={})
        else:
            r = call(self.api, "DELETE", f"storages/{STORAGE}/mount")
        self._expect(r, "mount" if self.world.mount_wanted else "unmount", (202, 200))

    def _expect(self, r, what: str, ok: tuple[int, ...]) -> None:
        if r is not None and r.status_code not in ok and r.status_code != 409:
            self.world.errors.append(f"round {self.round} {what}: {r.status_code} {r.text}")

    # one round ------------------------------------------------------------------------------
    def play_round(self) -> None:
        self.round += 1
        rng = self.rng
        hwc = self.world.hwc_clusters
        live = [n for n, s in self.world.clusters.items() if s == "running" and n not in hwc]
        choices = ["copy", "job", "cloud"]
        if len(live) < MAX_CLUSTERS:
            choices.append("up")
        if live:
            choices.append("down")
        if fuse_problem() is None:
            choices.append("mount")
        picked = rng.sample(choices, rng.randint(1, len(choices)))
        delay = rng.uniform(0.0, 3.0)
        group = rng.random() < 0.5
        self.world.kills.append(f"round {self.round}: {picked}, SIGKILL of the server "
                                f"{'group' if group else 'process'} after {delay:.2f}s")
        killer = threading.Timer(delay, self.srv.kill, (group,))
        killer.start()
        for op in picked:
            if op == "up":
                self.up(f"c{self.round}")
            elif op == "down":
                self.down(rng.choice(live))
            elif op == "copy":
                self.copy()
            elif op == "job":
                self.job()
            elif op == "cloud":  # one emulated Huawei Cloud cluster: up if none, else down
                cloud_live = [n for n in hwc if self.world.clusters[n] == "running"]
                if cloud_live:
                    self.down(cloud_live[0])
                else:
                    hwc.add(f"hw{self.round}")
                    self.up(f"hw{self.round}")
            else:
                self.toggle_mount()
        killer.join()
        t0 = time.monotonic()
        self.srv.restart()
        t1 = time.monotonic()
        self.finish()
        self.world.kills[-1] += (f"; restart {t1 - t0:.1f}s, finishing the work "
                                 f"{time.monotonic() - t1:.1f}s")

    # after the restart: the next request finishes the work --------------------------------
    def finish(self) -> None:
        for name, wanted in self.world.clusters.items():
            if name in self.touched:
                self.converge_cluster(name, wanted)
            else:  # the crash must not have changed a cluster nobody asked about
                r = call(self.api, "GET", f"clusters/{name}")
                state = None if r is None else "stopped" if r.status_code == 404 \
                    else r.json().get("state")
                if state != wanted:
                    self.world.mismatch.append(f"round {self.round} {name} (untouched): "
                                               f"{state}, want {wanted}")
        self.touched.clear()
        for dst in self.world.copies:
            self.converge_copy(dst)
        for tag in self.world.jobs:
            self.converge_job(tag)
        if fuse_problem() is None:
            self.converge_mount()

    def _repeat(self, what: str, send) -> bool:
        """Send the intent again until its operation succeeds (at most ATTEMPTS times)."""
        last = ""
        attempts = 0
        busy_until = time.monotonic() + 60
        while attempts < ATTEMPTS:
            r = send()
            if r is None:
                raise AssertionError(f"the server died outside the chaos: {what}")
            if r.status_code == 409 and "busy with operation" in r.text \
                    and time.monotonic() < busy_until:
                last = r.text  # an operation of the same target (of a live owner) goes on
                time.sleep(0.3)
                continue
            attempts += 1
            if r.status_code == 404 and what.startswith("down"):
                return True  # the up it undoes never recorded the cluster
            if r.status_code not in (200, 202):
                self.world.errors.append(f"round {self.round} {what}: {r.status_code} "
                                         f"{r.text}")
                return False
            body = r.json()
            op = wait_operation(self.api, body["operation"]["id"]) if "operation" in body \
                else {"state": "succeeded"}
            if op["state"] == "succeeded":
                self.last_op = op.get("id")
                return True
            last = f"{op['state']}: {op.get('reason')}"
        self.world.stuck.append(f"round {self.round} {what}: {last}")
        return False

    def converge_cluster(self, name: str, wanted: str) -> None:
        if wanted == "running":
            ok = self._repeat(f"up {name}", lambda: call(
                self.api, "POST", "clusters", json=self.up_body(name)))
        else:
            ok = self._repeat(f"down {name}", lambda: call(self.api, "DELETE",
                                                           f"clusters/{name}"))
        if not ok:
            return
        # a head and one worker, each once: no node lost, none started twice
        if name in self.world.hwc_clusters:  # the emulator's servers, by their tags
            servers = [s for s in self.hwc.ctl.state()["servers"]
                       if s["tags"].get("cloudtik-cluster-name") == name]
            nodes = sorted(s["name"] for s in servers)
            kinds = sorted(s["tags"].get("cloudtik-node-kind", "?") for s in servers)
        else:
            nodes = sorted(set(find_marked_processes(self.srv.state_dir, name).values()))
            kinds = sorted(n.split("-")[-2] for n in nodes)
        r = call(self.api, "GET", f"clusters/{name}", params={"refresh": "true"})
        state = r.json().get("state") if r is not None and r.status_code == 200 else None
        if wanted == "running" and (kinds != ["head", "worker"] or state != "running"):
            self.world.mismatch.append(f"round {self.round} {name}: {state}, nodes {nodes}")
        if wanted == "stopped" and nodes:
            self.world.mismatch.append(f"round {self.round} {name}: stopped, nodes {nodes}")

    def converge_copy(self, dst: str) -> None:
        op_id = self.world.copy_ops.get(dst)
        if op_id is not None:
            op = wait_operation(self.api, op_id)
            if op["state"] == "succeeded":
                return
        if self._repeat(f"copy to {dst}", lambda: call(
                self.api, "POST", "storage-transfers",
                json={"src": f"{STORAGE}:", "dst": dst})):
            self.world.copy_ops[dst] = self.last_op  # done: later rounds only look at it

    def jobs_by_tag(self) -> dict[str, list[dict]]:
        r = call(self.api, "GET", "jobs", params={"limit": 1000})
        assert r is not None and r.status_code == 200, r and r.text
        out: dict[str, list[dict]] = {}
        for j in r.json()["jobs"]:
            out.setdefault(j["parameters"].get("tag"), []).append(j)
        return out

    def converge_job(self, tag: str) -> None:
        found = self.jobs_by_tag().get(tag, [])
        if not found and not self.world.job_ids[tag]:
            self._submit(tag, self.world.jobs[tag])  # its POST had no answer: a client retries
            found = self.jobs_by_tag().get(tag, [])
        for job in found:
            deadline = time.monotonic() + 90
            while job["state"] not in ("succeeded", "failed", "cancelled"):
                if time.monotonic() > deadline:
                    self.world.stuck.append(f"round {self.round} job {tag}: {job['state']}")
                    break
                time.sleep(0.3)
                r = call(self.api, "GET", f"jobs/{job['id']}", params={"refresh": "true"})
                assert r is not None and r.status_code == 200, (r and r.text)
                job = r.json()

    def storage(self) -> dict:
        r = call(self.api, "GET", f"storages/{STORAGE}")
        assert r is not None and r.status_code == 200, r and r.text
        return r.json()

    def mount_state(self) -> str | None:
        return (self.storage().get("mount") or {}).get("state")

    def converge_mount(self) -> None:
        deadline = time.monotonic() + 30  # a mount or unmount the server started goes on
        while self.mount_state() not in (None, "mounted", "failed", "stopped") \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        state = self.mount_state()
        if (state == "mounted") == self.world.mount_wanted:
            pass
        elif self.world.mount_wanted:
            self._repeat("mount", lambda: call(self.api, "POST",
                                               f"storages/{STORAGE}/mount", json={}))
        else:
            self._repeat("unmount", lambda: call(self.api, "DELETE",
                                                 f"storages/{STORAGE}/mount"))
        path = self.storage()["mount_path"]
        if self.world.mount_wanted:
            if mount_entry(path) is None or len(os.listdir(path)) != FILES:
                self.world.stuck.append(f"round {self.round} mount: {path} is not mounted "
                                        f"({self.mount_state()})")
        elif mount_entry(path) is not None:
            self.world.stuck.append(f"round {self.round} unmount: {path} is still mounted")

    # the end ----------------------------------------------------------------------------------
    def check(self) -> dict[str, list[str]]:
        """Everything down through the API, then count what a crash may have left."""
        w = self.world
        for name in w.clusters:
            w.clusters[name] = "stopped"
            self.converge_cluster(name, "stopped")
        if fuse_problem() is None and w.mount_wanted:
            w.mount_wanted = False
            self.converge_mount()
        counts: dict[str, list[str]] = {k: [] for k in (
            "orphaned processes", "leaked mounts", "lost jobs", "duplicated jobs",
            "jobs run more than once", "wrong job results", "wrong copies",
            "clusters not matching the ask", "leaked cloud resources", "leaked secret files",
            "corrupted state",
            "stuck operations", "server errors")}
        runs = self.srv.root / "runs"
        by_tag = self.jobs_by_tag()
        for tag, factor in w.jobs.items():
            jobs = by_tag.get(tag, [])
            ids = {j["id"] for j in jobs}
            if not jobs or not w.job_ids[tag] <= ids:
                counts["lost jobs"].append(f"{tag}: answered {sorted(w.job_ids[tag])}, "
                                           f"recorded {sorted(ids)}")
            if len(jobs) > 1:
                counts["duplicated jobs"].append(f"{tag}: {sorted(ids)}")
            lines = (runs / tag).read_text().split() if (runs / tag).exists() else []
            if len(lines) > 1:
                counts["jobs run more than once"].append(f"{tag}: pids {lines}")
            for j in jobs:
                r = call(self.api, "GET", f"jobs/{j['id']}/files/result.txt")
                got = r.text if r is not None and r.status_code == 200 else None
                if j["state"] != "succeeded" or got != str(factor * 7):
                    counts["wrong job results"].append(
                        f"{tag} ({j['id']}): {j['state']} {j.get('reason')!r}, result "
                        f"{got!r} (want {factor * 7})")
        want = {p.name: p.read_bytes() for p in (self.s3.root / "chaos-bucket").iterdir()}
        for dst in w.copies:
            d = self.srv.root / dst
            got = {p.name: p.read_bytes() for p in d.iterdir()} if d.is_dir() else {}
            if got != want:
                counts["wrong copies"].append(f"{dst}: {sorted(got)} of {sorted(want)}")
        counts["clusters not matching the ask"] += w.mismatch
        # the emulated cloud: the workspace deleted through the API leaves nothing
        if not self._repeat("delete workspace", lambda: call(
                self.api, "DELETE", f"workspaces/{WORKSPACE}")):
            counts["stuck operations"].append("workspace delete did not finish")
        # the emulator is this test's own: whatever it still holds is leaked
        for kind, names in self.hwc.ctl.leftovers().items():
            counts["leaked cloud resources"].append(f"{kind}: {names}")
        r = call(self.api, "GET", "clusters", params={"all": "true"})
        recorded = {c["name"]: c["state"] for c in r.json()["clusters"]}
        for name in w.clusters:
            nodes = set(find_marked_processes(self.srv.state_dir, name).values())
            if recorded.get(name, "stopped") != "stopped" or nodes:
                counts["clusters not matching the ask"].append(
                    f"{name}: {recorded.get(name)} with node processes {sorted(nodes)}")
        r = call(self.api, "GET", "operations", params={"active": "true", "limit": 1000})
        for op in r.json()["operations"]:
            counts["stuck operations"].append(f"{op['kind']} {op['target']}: {op['state']}")
        counts["stuck operations"] += w.stuck
        counts["server errors"] += w.errors
        for line in self.srv.logs().splitlines():  # every start's log, not only the tails
            if re.search(r"\] 5\d\d (GET|POST|PUT|PATCH|DELETE) ", line):
                counts["server errors"].append(line.strip()[:300])
        # an orderly stop of the server; daemons (launcher, supervisor, reaper) idle out
        self.srv.server.proc.terminate()
        self.srv.server.proc.wait(120)  # ci7: over 30 s once beside two JVM tests
        counts["corrupted state"] += state_corruption(self.srv.state_dir)
        code, listed, err = cli_list(self.srv.state_dir)
        if code != 0 or not isinstance(listed, list):
            counts["corrupted state"].append(f"`jupyter cloudtik list --all`: {code} {err}")
        else:
            for c in listed:
                if c.get("state") != "stopped":
                    counts["corrupted state"].append(f"CLI lists {c['name']} {c['state']}")
        left = wait_no_processes(self.srv.base, {self.s3.proc.pid}, timeout=20)
        if left:
            counts["orphaned processes"].append(describe(left))
        counts["leaked mounts"] += fuse_mounts_under(self.srv.base)
        # rclone configs hold a storage's credentials in plain text while rclone runs
        counts["leaked secret files"] += [
            str(p.relative_to(self.srv.state_dir))
            for p in self.srv.state_dir.rglob("rclone-*.conf")]
        return counts


@pytest.fixture
def s3(tmp_path):
    srv = start_server("s3", tmp_path / "s3" / "root", workdir=tmp_path / "s3" / "work")
    bucket = srv.root / "chaos-bucket"
    bucket.mkdir()
    for i in range(FILES):
        (bucket / f"part-{i:03d}.bin").write_bytes(bytes([i % 256]) * (8 << 10))
    yield srv
    srv.stop()


@pytest.fixture
def hwc(tmp_path):
    """The Huawei Cloud emulator, its own process (as the cloud is apart from us)."""
    (tmp_path / "hwc").mkdir()
    h = start_emulator(tmp_path / "hwc", bucket_release_seconds=0)
    yield h
    left = h.stop()
    assert not left, f"emulated server processes left behind: {left}"


def test_server_sigkilled_at_random_moments_loses_nothing(tmp_path, s3, hwc):
    seed, rng = seeded("server chaos")
    n = ROUNDS
    chaos = Chaos(tmp_path, s3, hwc, seed, rng)
    root = chaos.srv.root
    (root / "chaos").mkdir()
    (root / "chaos" / "job.ipynb").write_text(json.dumps(JOB))
    (root / "runs").mkdir()
    counts: dict[str, list[str]] = {}
    try:
        r = call(chaos.api, "POST", "storages", json={
            "name": STORAGE, "backend": "s3", "options": s3.storage_options(),
            "source": "chaos-bucket", "read_only": False})
        assert r is not None and r.status_code == 201, r and r.text
        r = call(chaos.api, "POST", "workspaces", json={
            "name": WORKSPACE, "config": workspace_config(hwc)})
        assert r is not None and r.status_code == 202, r and r.text
        op = wait_operation(chaos.api, r.json()["operation"]["id"])
        assert op["state"] == "succeeded", op
        for _ in range(n):
            chaos.play_round()
        counts = chaos.check()
    finally:
        if chaos.srv.server.proc.poll() is None:
            chaos.srv.stop()
        from tests.server.conftest import stop_state_processes

        stop_state_processes(chaos.srv.state_dir)
        left = cloudtik_processes(chaos.srv.base)
        kill_all(left)
        for path in fuse_mounts_under(chaos.srv.base):
            import subprocess

            subprocess.run(["fusermount", "-uz", path], check=False)
    bad = {k: v for k, v in counts.items() if v}
    summary = ", ".join(f"{k} = {len(v)}" for k, v in counts.items())
    print(f"server chaos, seed {seed}, {n} rounds: {summary}\n  "
          + "\n  ".join(chaos.world.kills))
    assert not bad, (
        f"seed {seed} (replay: CLOUDTIK_CHAOS_SEED={seed} CLOUDTIK_CHAOS_ROUNDS={n}); "
        f"{summary}\n" + "\n".join(f"{k}:\n  " + "\n  ".join(v) for k, v in bad.items())
        + "\nrounds:\n  " + "\n  ".join(chaos.world.kills)
        + "\nserver logs (tails):\n" + chaos.srv.logs(tail=3000)[-12000:])
