"""FUSE mounts with real rclone mount: supervised, re-mounted when killed, read-only honoured,
unmounted without a trace in /proc/mounts, recovered after a shutdown; sync mode without FUSE."""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import pytest
from storage_helpers import wait_for

from jupyter_cloudtik.storage.mounts import (
    FuseUnavailable,
    fuse_problem,
    mount_entry,
    supervisor_pid,
)

pytestmark = pytest.mark.skipif(
    fuse_problem() is not None, reason=f"FUSE is not usable here: {fuse_problem()}")


def _mounted(path) -> bool:
    return mount_entry(path) is not None


def test_mount_shows_server_files_and_read_only_refuses_writes(client, webdav_server):
    folder = webdav_server.root / "mount1"
    folder.mkdir()
    (folder / "first.txt").write_text("one")
    info = client.add("davmount", "webdav", webdav_server.storage_options(), source="mount1")
    assert info.read_only  # the default
    res = client.wait(client.start_mount("davmount"))
    path = info.mount_path
    assert res["mount_path"] == path
    entry = mount_entry(path)
    assert entry and entry["fstype"].startswith("fuse")
    assert sorted(os.listdir(path)) == ["first.txt"]
    assert Path(path, "first.txt").read_text() == "one"

    # a file written on the server appears under the mount (dir cache 1 s)
    (folder / "later.txt").write_text("two")
    wait_for(lambda: "later.txt" in os.listdir(path), what="later.txt under the mount")
    assert Path(path, "later.txt").read_text() == "two"

    # read-only: writes are refused by the file system
    with pytest.raises(OSError) as e, open(os.path.join(path, "new.txt"), "w") as f:
        f.write("x")
    assert e.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    assert not (folder / "new.txt").exists()

    status = client.get("davmount").mount
    assert status["state"] == "mounted" and status["is_mountpoint"]

    client.wait(client.start_unmount("davmount"))
    assert not _mounted(path)
    assert path not in Path("/proc/mounts").read_text()
    assert client.get("davmount").mount is None


def test_killed_mount_is_remounted_and_writes_reach_the_server(client, s3_server):
    (s3_server.root / "mount2").mkdir()
    info = client.add("s3rw", "s3", s3_server.storage_options(), source="mount2",
                      read_only=False)
    client.wait(client.start_mount("s3rw"))
    path = info.mount_path
    with open(os.path.join(path, "written.txt"), "w") as f:
        f.write("via the mount")
    wait_for(lambda: (s3_server.root / "mount2" / "written.txt").exists(),
             what="the file to reach the server")

    first = client.get("s3rw").mount
    os.kill(first["pid"], signal.SIGKILL)
    # the supervisor notices, clears the dead mount and mounts again
    wait_for(lambda: (client.get("s3rw").mount or {}).get("restarts", 0) >= 1
             and client.get("s3rw").mount["state"] == "mounted", timeout=30,
             what="the re-mount")
    again = client.get("s3rw").mount
    assert again["pid"] != first["pid"]
    assert "re-mounted" in (again["reason"] or "")
    assert "written.txt" in os.listdir(path)

    client.wait(client.start_unmount("s3rw"))
    assert not _mounted(path)


def test_shutdown_unmounts_and_recover_mounts_again(make_client, s3_server, state_dir):
    client = make_client()
    (s3_server.root / "mount3").mkdir()
    (s3_server.root / "mount3" / "keep.txt").write_text("k")
    info = client.add("s3keep", "s3", s3_server.storage_options(), source="mount3")
    client.wait(client.start_mount("s3keep"))
    assert _mounted(info.mount_path)

    assert client.manager.shutdown()  # the server stops
    assert not _mounted(info.mount_path)
    assert supervisor_pid(state_dir) is None
    assert client.get("s3keep").mount["desired"] == "mounted"

    # the server starts again: any face opening the state folder recovers the mounts
    again = make_client()
    wait_for(lambda: again.get("s3keep").mount["state"] == "mounted", timeout=30,
             what="the recovered mount")
    assert os.listdir(info.mount_path) == ["keep.txt"]
    again.remove("s3keep")  # remove unmounts first
    assert not _mounted(info.mount_path)
    assert again.mounts() == []


def test_mount_path_must_be_empty_and_inside_the_working_dir(client, s3_server, workdir):
    from jupyter_cloudtik.core.errors import ConflictError, PermissionDeniedError

    # outside the working folder is a refusal (403 over REST) naming the field
    with pytest.raises(PermissionDeniedError) as e:
        client.add("outside", "s3", s3_server.storage_options(), mount_path="/etc/x")
    assert e.value.field == "mount_path" and "outside the folder" in e.value.message
    with pytest.raises(PermissionDeniedError) as e:
        client.add("outside", "s3", s3_server.storage_options(), mount_path="../x")
    assert e.value.field == "mount_path"
    (workdir / "busy").mkdir()
    (workdir / "busy" / "mine.txt").write_text("do not hide me")
    (s3_server.root / "mount4").mkdir()
    client.add("busy", "s3", s3_server.storage_options(), source="mount4", mount_path="busy")
    with pytest.raises(ConflictError) as e:
        client.wait(client.start_mount("busy"))
    assert "not empty" in e.value.message


def test_without_fuse_the_error_offers_sync_mode(make_client, s3_server):
    client = make_client(fuse_device="/nonexistent/fuse")
    (s3_server.root / "mount5").mkdir()
    (s3_server.root / "mount5" / "data.txt").write_text("copied, not mounted")
    info = client.add("nofuse", "s3", s3_server.storage_options(), source="mount5",
                      read_only=False)
    with pytest.raises(FuseUnavailable) as e:
        client.start_mount("nofuse")
    assert "FUSE is not available" in e.value.message and "--mode sync" in e.value.message

    res = client.wait(client.start_mount("nofuse", mode="sync"))
    assert res["mode"] == "sync" and res["files"] == 1
    local = os.path.join(info.mount_path, "data.txt")
    assert Path(local).read_text() == "copied, not mounted"
    assert not _mounted(info.mount_path)
    # a writable storage gets local changes back when the sync "mount" ends
    with open(os.path.join(info.mount_path, "made-here.txt"), "w") as f:
        f.write("new")
    client.wait(client.start_unmount("nofuse"))
    assert (s3_server.root / "mount5" / "made-here.txt").read_text() == "new"
    assert client.mounts() == []
