"""The state store and operations, used by several processes at once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

import pytest

from jupyter_cloudtik.core.errors import ConflictError, NotFoundError, OperationCancelled
from jupyter_cloudtik.core.operations import OperationContext, Operations
from jupyter_cloudtik.core.store import Store, StoreError


def test_wal_mode_and_private_file(state_dir):
    store = Store(state_dir)
    assert store.query_one("PRAGMA journal_mode")[0] == "wal"
    assert (store.path.stat().st_mode & 0o777) == 0o600
    assert store.schema_version("core") == 1


def test_a_state_folder_from_before_the_clusters_tables_moved_keeps_its_clusters(state_dir):
    """The clusters' tables were made by the core area's first step; now by the clusters
    feature's own (clusters/table.py).  A folder made before reads back as it was, and a
    new one gets them from the feature, not from core."""
    import sqlite3

    from jupyter_cloudtik.clusters import table
    from jupyter_cloudtik.clusters.manager import ClusterManager
    from jupyter_cloudtik.core.settings import CloudTik

    db = sqlite3.connect(f"{state_dir}/state.db")
    db.executescript(
        "CREATE TABLE schema_versions (area TEXT PRIMARY KEY, version INTEGER NOT NULL);"
        "INSERT INTO schema_versions VALUES ('core', 1);"
        + table.CLUSTER_MIGRATIONS[0].replace("IF NOT EXISTS ", "")
        + "CREATE TABLE operations (id TEXT PRIMARY KEY, kind TEXT NOT NULL, target TEXT "
        "NOT NULL, params TEXT NOT NULL DEFAULT '{}', state TEXT NOT NULL, reason TEXT, "
        "result TEXT, owner_pid INTEGER, owner_host TEXT, owner_started REAL, "
        "cancel_requested INTEGER NOT NULL DEFAULT 0, user TEXT, created_at REAL NOT NULL, "
        "updated_at REAL NOT NULL, finished_at REAL);"
        "CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, op_id TEXT NOT NULL, "
        "ts REAL NOT NULL, step TEXT NOT NULL, message TEXT NOT NULL, fraction REAL, "
        "level TEXT NOT NULL DEFAULT 'info', data TEXT NOT NULL DEFAULT '{}');"
        "INSERT INTO clusters (name, provider, config, config_hash, state, owner, "
        "created_at, updated_at) VALUES ('old', 'local', '{}', 'h', 'stopped', 'ann', 1, 1);")
    db.commit()
    db.close()
    assert table.owners(Store(state_dir)) == {"old": "ann"}
    assert [c.name for c in ClusterManager(settings=CloudTik(state_dir=str(state_dir)))
            .list(include_stopped=True)] == ["old"]
    fresh = Store(state_dir / "new")
    tables = {r[0] for r in fresh.query("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "clusters" not in tables  # not core's any more
    assert table.owners(fresh) == {} and fresh.schema_version("clusters") == 1


def test_migrations_apply_once_and_refuse_newer_databases(state_dir):
    store = Store(state_dir)
    steps = ["CREATE TABLE t1 (x INTEGER)", "ALTER TABLE t1 ADD COLUMN y TEXT"]
    store.ensure_schema("feature", steps)
    store.ensure_schema("feature", steps)  # no-op the second time
    assert store.schema_version("feature") == 2
    other = Store(state_dir)  # another process's view: applies nothing new
    other.ensure_schema("feature", steps)
    other.execute("INSERT INTO t1 (x, y) VALUES (1, 'a')")
    with pytest.raises(StoreError, match="newer than this jupyter_cloudtik knows"):
        Store(state_dir).ensure_schema("feature", steps[:1])


WRITER = textwrap.dedent("""
    import sys, time
    from jupyter_cloudtik.core.store import Store
    from jupyter_cloudtik.core.operations import Operations
    ops = Operations(Store(sys.argv[1]))
    for i in range(int(sys.argv[2])):
        op = ops.start("test.write", f"thing:{sys.argv[3]}-{i}")
        for j in range(5):
            ops.emit(op.id, "step", f"{sys.argv[3]} {i} {j}", j / 5)
        ops.finish(op.id, "succeeded", result={"i": i})
    print("ok")
""")


def test_two_processes_write_at_the_same_time(state_dir):
    Store(state_dir)  # create the schema first, as any first user would
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(state_dir), "40", name],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in ("a", "b")
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert out.strip() == "ok"
    ops = Operations(Store(state_dir))
    done = ops.list(limit=1000)
    assert len(done) == 80 and all(o.state == "succeeded" for o in done)
    events = ops.events(limit=10000)
    assert len(events) == 80 * 7  # start + 5 steps + succeeded
    ids = [e.id for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_events_resume_after_an_id(state_dir):
    ops = Operations(Store(state_dir))
    op = ops.start("test", "thing:x")
    for i in range(10):
        ops.emit(op.id, "step", f"m{i}", i / 10)
    first = ops.events(op.id)
    middle = first[4].id
    rest = ops.events(op.id, after=middle)
    assert [e.message for e in rest] == [e.message for e in first[5:]]


def test_exclusive_operations_and_cancellation(state_dir):
    ops = Operations(Store(state_dir))
    op = ops.start("cluster.up", "cluster:a")
    with pytest.raises(ConflictError, match="busy with operation"):
        ops.start("cluster.scale", "cluster:a")
    ctx = OperationContext(ops, op.id)
    ctx.checkpoint()
    ops.request_cancel(op.id)
    time.sleep(0.06)
    with pytest.raises(OperationCancelled):
        ctx.checkpoint()
    with pytest.raises(NotFoundError):
        ops.get("nope")


def test_an_operation_whose_process_died_is_marked_interrupted(state_dir):
    Store(state_dir)
    code = ("import sys, os; from jupyter_cloudtik.core.store import Store;"
            "from jupyter_cloudtik.core.operations import Operations;"
            "op = Operations(Store(sys.argv[1])).start('cluster.up', 'cluster:z');"
            "print(op.id, flush=True); os._exit(0)")
    out = subprocess.run([sys.executable, "-c", code, str(state_dir)], capture_output=True,
                         text=True, check=True).stdout.strip()
    store = Store(state_dir)
    ops = Operations(store)
    raw = store.query_one("SELECT state FROM operations WHERE id = ?", (out,))
    assert raw["state"] == "running"  # as the dead process left it
    assert ops.active_for("cluster:z") == []  # looking at it finds the owner gone
    op = ops.get(out)
    assert op.state == "failed" and "interrupted" in op.reason
    ops.start("cluster.up", "cluster:z")  # and the target is free again


def _left_running_by_a_dead_process(state_dir, kind: str, target: str) -> str:
    code = ("import sys, os; from jupyter_cloudtik.core.store import Store;"
            "from jupyter_cloudtik.core.operations import Operations;"
            f"op = Operations(Store(sys.argv[1])).start({kind!r}, {target!r});"
            "print(op.id, flush=True); os.kill(os.getpid(), 9)")
    out = subprocess.run([sys.executable, "-c", code, str(state_dir)], capture_output=True,
                         text=True)
    assert out.returncode == -9, out.stderr
    return out.stdout.strip()


def test_reading_an_operation_of_a_killed_process_ends_it(state_dir):
    """A copy left "running" by a SIGKILLed server (tests/chaos found it: a client polling
    `GET operations/{id}` waited forever, as nothing else ever touched its target): any
    read — one operation, or the list of active ones — marks it interrupted."""
    store = Store(state_dir)
    ops = Operations(store)
    one = _left_running_by_a_dead_process(state_dir, "storage.copy", "storage:s")
    other = _left_running_by_a_dead_process(state_dir, "storage.copy", "storage:t")
    mine = ops.start("cluster.up", "cluster:alive")  # a live owner: left alone
    op = ops.get(one[:6])  # by a beginning of its id, as the REST route allows
    assert (op.state, op.finished_at is not None) == ("failed", True)
    assert op.reason.startswith("interrupted: the process that ran it")
    assert [o.id for o in ops.list(active_only=True)] == [mine.id]
    assert ops.get(other).state == "failed"
    assert ops.get(mine.id).state == "running"
    assert [e.step for e in ops.events(one)][-1] == "failed"


def test_watch_streams_events_until_the_end(state_dir):
    ops = Operations(Store(state_dir))

    async def scenario():
        op = ops.start("test", "thing:w")

        async def work():
            for i in range(3):
                await asyncio.sleep(0.01)
                ops.emit(op.id, "step", f"s{i}", (i + 1) / 4)
            ops.finish(op.id, "succeeded")

        task = asyncio.create_task(work())
        seen = [e.message async for e in ops.watch(op.id)]
        await task
        return seen

    seen = asyncio.run(scenario())
    assert seen[0] == "test thing:w" and seen[1:4] == ["s0", "s1", "s2"]
    assert seen[-1] == "done"


def test_every_features_events_and_reasons_are_redacted_with_the_folders_secrets(tmp_path):
    """Whatever feature emits it, an event or a finish reason quoting a value of the state
    folder's secret store is kept with the value replaced — a secret stored after the
    first event too — and a store whose values cannot be read (no key here) withholds the
    message instead of keeping it unchecked."""
    import shutil

    from jupyter_cloudtik.core.secrets import SecretStore

    store = Store(tmp_path / "state")
    secrets = SecretStore(store)
    secrets.put("provider:huaweicloud", "secret_key", "AKSK-first-0123456789")
    ops = Operations(store)  # no redactor passed: the folder's own is the default
    op = ops.start("cluster.up", "cluster:c1")
    ops.emit(op.id, "nodes", "the cloud said: bad signature for AKSK-first-0123456789")
    secrets.put("storage:s3", "secret_access_key", "S3-later-abcdefghij")
    ops.finish(op.id, "failed", "stage-out: 403 for S3-later-abcdefghij")
    kept = [e.message for e in ops.events(op.id)] + [ops.get(op.id).reason]
    assert not any("AKSK-first" in t or "S3-later" in t for t in kept), kept
    assert sum("<secret>" in t for t in kept) >= 3, kept

    # the key is gone from this process: nothing can be checked, nothing unchecked is kept
    shutil.move(secrets.key_path, tmp_path / "key-elsewhere")
    other = Operations(Store(tmp_path / "state"))
    op2 = other.start("cluster.up", "cluster:c2")
    other.emit(op2.id, "nodes", "AKSK-first-0123456789 was refused")
    shown = [e.message for e in other.events(op2.id)]
    assert not any("AKSK-first" in t for t in shown), shown
    assert any("withheld" in t for t in shown), shown
