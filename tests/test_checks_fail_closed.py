"""Checks that guard something fail closed (issue 28, point 1): an error inside the check
is said, never read as "nothing to check" or "allowed"."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time

import pytest

from jupyter_cloudtik.core.errors import ConflictError, PermissionDeniedError
from jupyter_cloudtik.core.store import StoreError

SECRET = "s3cr3t-value-0123"


# --- workspace delete: the clusters that use it ----------------------------------------------

def _workspace_with_cluster(settings):
    from jupyter_cloudtik.clusters import table
    from jupyter_cloudtik.workspaces.manager import WorkspaceManager

    wm = WorkspaceManager(settings=settings)
    table.ensure(wm.store)  # a cluster recorded by hand: its table first
    now = time.time()
    with wm.store.transaction() as conn:
        conn.execute(
            "INSERT INTO workspaces (name, provider, config, config_hash, state, created_at,"
            " updated_at) VALUES ('ws1', 'huaweicloud', ?, 'h', 'ready', ?, ?)",
            (json.dumps({"provider": {"type": "huaweicloud", "region": "r1"}}), now, now))
        conn.execute(
            "INSERT INTO clusters (name, provider, config, config_hash, state, created_at,"
            " updated_at) VALUES ('c1', 'huaweicloud', ?, 'h', 'running', ?, ?)",
            (json.dumps({"provider": {"type": "huaweicloud", "workspace_name": "ws1"}}),
             now, now))
    return wm


def _nothing_started(wm) -> None:
    assert wm.store.query_one("SELECT state FROM workspaces WHERE name = 'ws1'")[0] == "ready"
    assert wm.store.query("SELECT id FROM operations WHERE kind = 'workspace.delete'") == []


def test_workspace_delete_refuses_when_the_clusters_cannot_be_read(settings):
    """The guard that keeps a workspace under running clusters: a recorded cluster
    config that cannot be read, or a clusters table that cannot, refuses the delete
    (before: any error was "no clusters", and the delete went ahead)."""
    wm = _workspace_with_cluster(settings)
    with pytest.raises(ConflictError, match=r"used by cluster\(s\) c1"):
        asyncio.run(wm.start_delete("ws1"))

    with wm.store.transaction() as conn:  # a record damaged by hand (cut short)
        conn.execute("UPDATE clusters SET config = ? WHERE name = 'c1'",
                     ('{"provider": {"type": "huaweicloud", "workspace_na',))
    with pytest.raises(StoreError, match=r"^workspace 'ws1': cannot tell whether cluster 'c1' "
                       r"uses it \(its recorded config cannot be read: JSONDecodeError"):
        asyncio.run(wm.start_delete("ws1"))
    _nothing_started(wm)

    with wm.store.transaction() as conn:  # moved away (put back for the clean-up)
        conn.execute("ALTER TABLE clusters RENAME TO clusters_moved")
    try:
        with pytest.raises(StoreError, match=r"^workspace 'ws1': cannot tell which clusters "
                           r"use it \(the state database's clusters could not be read: no "
                           r"such table: clusters\)"):
            asyncio.run(wm.start_delete("ws1"))
        _nothing_started(wm)
    finally:
        with wm.store.transaction() as conn:
            conn.execute("ALTER TABLE clusters_moved RENAME TO clusters")
            conn.execute("DELETE FROM clusters")


# --- log redaction ------------------------------------------------------------------------------

def test_redaction_holds_for_a_record_that_cannot_be_formatted(capsys):
    """A log call whose arguments do not fit its format: the filter used to pass the
    record on untouched, and logging's error report printed the arguments — the secret —
    on stderr.  Now the record becomes redacted text."""
    from jupyter_cloudtik.core.secrets import RedactingFilter, Redactor

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RedactingFilter(Redactor([SECRET])))
    log = logging.getLogger("cloudtik-test-redaction")
    log.propagate = False
    log.addHandler(handler)
    try:
        log.warning("token %s", SECRET)  # a well-formed one, as before
        log.warning("token %s for %s", SECRET)  # one argument short
        log.warning("token %d", SECRET)  # the wrong type
    finally:
        log.removeHandler(handler)
    text = out.getvalue() + capsys.readouterr().err
    assert SECRET not in text, text
    assert "Logging error" not in text
    assert text.splitlines() == [
        "token <secret>",
        "token %s for %s (log arguments ('<secret>',) do not fit: TypeError)",
        "token %d (log arguments ('<secret>',) do not fit: TypeError)",
    ]


# --- the hub's job gateway: no local execution ---------------------------------------------------

def test_hub_refuses_a_backend_it_cannot_tell_is_not_local(tmp_path, monkeypatch, state_dir):
    """A hub that does not allow local execution asks the backends' configuration what
    type a backend is; a configuration that cannot be read refuses (before: "not local",
    allowed)."""
    from jupyter_cloudtik.hub.job_gateway import JobGateway

    config = tmp_path / "hpc.yaml"
    config.write_text("backends:\n  daint:\n    type: slurm\n    partition: normal\n")
    monkeypatch.setenv("CLOUDTIK_HPC_CONFIG", str(config))
    gw = JobGateway(state_dir=state_dir, user="alice", allow_local=False, root=tmp_path)
    try:
        gw.check_backend("daint")  # remote: allowed
        with pytest.raises(PermissionDeniedError, match="'local' runs jobs on the hub's own"):
            gw.check_backend("local")
        config.write_text("backends:\n  daint:\n    partition: normal\n")  # no type: broken
        for name in ("local", "daint"):
            with pytest.raises(PermissionDeniedError) as e:
                gw.check_backend(name)
            assert e.value.message == (
                f"backend: cannot tell whether '{name}' runs jobs on the hub's own machine, "
                "which this hub does not allow (c.CloudTikHub.allow_local_execution): the "
                "backends' configuration cannot be read (backends.daint.type: missing; one "
                "of arc, dask, firecrest, local, slurm)")
    finally:
        asyncio.run(gw.close())
