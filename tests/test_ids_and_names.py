"""Names and ids belong to their owner (issue 12, item 3), in-process against the real core:
the id lookup of jobs and operations (``core.ids``) and a cluster name passed from one
owner to the next.  The same attacks through the real hub are in
``tests/hub/test_hub_ownership.py``."""

from __future__ import annotations

import asyncio
import time

import pytest

from jupyter_cloudtik.core.errors import ConflictError, NotFoundError
from jupyter_cloudtik.core.identity import acting_as
from jupyter_cloudtik.core.operations import Operations
from jupyter_cloudtik.core.store import Store


def _op(store: Store, op_id: str, user: str, target: str = "cluster:x",
        created: float | None = None) -> None:
    now = created or time.time()
    store.execute("INSERT INTO operations (id, kind, target, state, user, created_at,"
                  " updated_at) VALUES (?, 'cluster.up', ?, 'succeeded', ?, ?, ?)",
                  (op_id, target, user, now, now))


def _job(store: Store, job_id: str, user: str, created: float) -> None:
    store.execute("INSERT INTO hpc_jobs (id, name, backend, backend_type, kind, client_token,"
                  " state, spec, user, created_at, updated_at) VALUES (?, 'j', 'local',"
                  " 'local', 'command', ?, 'succeeded', '{}', ?, ?, ?)",
                  (job_id, f"tok-{job_id}", user, created, created))


def _answer(e: pytest.ExceptionInfo, given: str) -> tuple[type, int, dict]:
    """What a client would get, with the id it sent taken out."""
    err = e.value
    body = {k: (v.replace(given, "<ID>") if isinstance(v, str) else v)
            for k, v in err.to_dict().items()}
    return type(err), err.http_status, body


def _lookups(state_dir):
    """(name, insert, get) for operations and jobs on one store."""
    from jupyter_cloudtik.hpc.jobs import JobManager

    store = Store(state_dir)
    ops = Operations(store)
    jobs = JobManager(store=store, user="alice")
    return store, [("operation", _op, ops.get), ("job", _job, jobs.get)]


@pytest.mark.parametrize("which", ["operation", "job"])
def test_prefixes_resolve_among_the_callers_own_ids_only(state_dir, which):
    store, lookups = _lookups(state_dir)
    _, insert, get = next(x for x in lookups if x[0] == which)
    t = time.time()
    insert(store, "abc111aa0000", "alice", created=t)
    insert(store, "abc222bb0000", "alice", created=t + 1)
    insert(store, "abc333cc0000", "bob", created=t + 2)
    insert(store, "fff000000000", "alice", created=t + 3)

    assert get("abc111aa0000").id == "abc111aa0000"            # whole id, no user: anyone's
    assert get("abc111aa0000", "alice").id == "abc111aa0000"
    assert get("abc3", "bob").id == "abc333cc0000"              # unique among bob's own
    assert get("abc", "bob").id == "abc333cc0000"               # alice's do not count
    assert get("fff", "alice").id == "fff000000000"

    # another user's id or prefix: exactly the answer of an id that does not exist
    with pytest.raises(NotFoundError) as theirs:
        get("fff000000000", "bob")
    with pytest.raises(NotFoundError) as nothing:
        get("999999999999", "bob")
    assert _answer(theirs, "fff000000000") == _answer(nothing, "999999999999")
    with pytest.raises(NotFoundError) as theirs_prefix:
        get("fff", "bob")
    with pytest.raises(NotFoundError) as nothing_prefix:
        get("999", "bob")
    assert _answer(theirs_prefix, "fff") == _answer(nothing_prefix, "999")
    assert "fff000000000" not in str(theirs_prefix.value)       # no "recent ids" hint
    assert "abc" not in str(nothing.value)

    # ambiguous among alice's own: 409 naming her candidates, never bob's
    with pytest.raises(ConflictError) as many:
        get("abc", "alice")
    assert many.value.http_status == 409
    assert "abc111aa0000" in many.value.message and "abc222bb0000" in many.value.message
    assert "abc333cc0000" not in many.value.message

    # SQL wildcards are characters, not patterns: no id has them
    for hostile in ("%", "_", "abc%", "a_c", "%%", "' OR 1=1 --", "\\", "a" * 129, ""):
        for user in (None, "alice", "bob"):
            with pytest.raises(NotFoundError):
                get(hostile, user)


def test_a_cluster_name_passed_to_another_owner_hands_over_no_history(manager, state_dir):
    """alice runs and stops "shared"; bob takes the free name: he sees none of her nodes,
    node logs, operations or events; alice still lists her operations."""
    async def run() -> None:
        with acting_as("alice"):
            await manager.up({"cluster_name": "shared",
                              "setup_commands": ["echo alice-was-here"]})
            # while it runs the name is hers, even for a caller that skips the hub's view
            with acting_as("bob"), pytest.raises(ConflictError, match="is in use"):
                await manager.up({"cluster_name": "shared", "max_workers": 3})
            assert manager.get("shared").owner == "alice"
            assert manager.get("shared").config.get("max_workers") != 3
            await manager.down("shared")
        alice_ops = {o.id for o in manager.ops.list(user="alice")}
        alice_nodes = set(manager.logs("shared"))
        assert any("alice-was-here" in t for t in manager.logs("shared").values())
        assert alice_nodes and alice_ops

        with acting_as("bob"):
            await manager.up({"cluster_name": "shared"})
        info = manager.get("shared")
        assert info.owner == "bob"
        logs = manager.logs("shared")
        assert logs and not (set(logs) & alice_nodes)
        assert not any("alice-was-here" in t for t in logs.values())
        by_target = manager.ops.list(target="cluster:shared")
        assert by_target and all(o.user == "bob" for o in by_target)
        assert info.last_operation["id"] in {o.id for o in by_target}
        # alice keeps her history, filed under an archived target of its own
        kept = {o.id: o for o in manager.ops.list(user="alice")}
        assert set(kept) == alice_ops
        assert all(o.target.startswith("cluster:shared@") for o in kept.values())
        for op_id in alice_ops:
            assert manager.ops.events(op_id)  # events stay with their operation
        with acting_as("bob"):
            await manager.down("shared")

        # the same owner taking their own name again keeps their history
        with acting_as("bob"):
            await manager.up({"cluster_name": "shared"})
        assert set(logs) <= set(manager.logs("shared"))
        assert len(manager.ops.list(target="cluster:shared")) >= 3
        with acting_as("bob"):
            await manager.down("shared")

    asyncio.run(run())
