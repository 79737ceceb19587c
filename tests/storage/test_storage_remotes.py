"""Storages on real servers (rclone serve s3 / webdav / sftp on 127.0.0.1): add, test, list,
copy both ways with the content checked, wrong credentials, cancellation, progress."""

from __future__ import annotations

import hashlib
import os

import pytest

from jupyter_cloudtik.core.errors import (
    OperationCancelled,
    PermissionDeniedError,
)
from jupyter_cloudtik.storage.rclone import StorageAuthError, StorageError


@pytest.fixture(params=["s3", "webdav", "sftp"])
def server(request):
    return request.getfixturevalue(f"{request.param}_server")


def _source(server, name):
    """Each test works in its own folder (bucket for s3) of the shared server."""
    (server.root / name).mkdir(parents=True, exist_ok=True)
    return name


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_add_test_list_copy_both_ways(client, server, workdir, tmp_path):
    name = f"{server.kind}data"
    src_folder = _source(server, f"t1-{server.kind}")
    (server.root / src_folder / "hello.txt").write_text("hello from the server\n")
    (server.root / src_folder / "sub").mkdir()
    (server.root / src_folder / "sub" / "inner.bin").write_bytes(os.urandom(70_000))

    info = client.add(name, server.kind, server.storage_options(), source=src_folder,
                      read_only=False)
    assert info.backend == server.kind and info.read_only is False
    assert info.mount_path == str(workdir / "storage" / name)
    shown = info.to_dict()["options"]
    assert server.password not in str(info.to_dict())
    assert any(v == "<secret>" for v in shown.values())

    result = client.test(name)
    assert result["ok"] and result["entries"] == 2

    listing = client.ls(f"{name}:")
    assert [(e["name"], e["is_dir"]) for e in listing["entries"]] == [
        ("sub", True), ("hello.txt", False)]
    assert listing["entries"][1]["size"] == len("hello from the server\n")
    inner = client.ls(f"{name}:sub")
    assert inner["entries"][0]["path"] == "sub/inner.bin"

    # storage -> local
    op = client.start_copy(f"{name}:", str(tmp_path / "down"))
    res = client.wait(op)
    assert res["files"] == 2 and res["bytes"] == 70_000 + 22
    assert (tmp_path / "down" / "hello.txt").read_text() == "hello from the server\n"
    assert _digest(tmp_path / "down" / "sub" / "inner.bin") == _digest(
        server.root / src_folder / "sub" / "inner.bin")

    # local -> storage
    up = tmp_path / "up"
    (up / "deep").mkdir(parents=True)
    (up / "deep" / "result.csv").write_text("a,b\n1,2\n")
    (up / "big.bin").write_bytes(os.urandom(300_000))
    client.wait(client.start_copy(str(up), f"{name}:results"))
    assert (server.root / src_folder / "results" / "deep" / "result.csv").read_text() == \
        "a,b\n1,2\n"
    assert _digest(server.root / src_folder / "results" / "big.bin") == _digest(up / "big.bin")


def test_wrong_credentials_give_a_clear_error(client, server):
    name = f"bad{server.kind}"
    client.add(name, server.kind, server.storage_options(password="wrong-password-123"),
               source=_source(server, f"t2-{server.kind}"))
    with pytest.raises(StorageAuthError) as e:
        client.test(name)
    assert "authentication failed" in e.value.message
    assert "wrong-password-123" not in e.value.message
    with pytest.raises(StorageError):
        client.ls(f"{name}:")


def test_read_only_storage_refuses_writes(client, s3_server, tmp_path):
    client.add("ro", "s3", s3_server.storage_options(), source=_source(s3_server, "readonly3"))
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(PermissionDeniedError) as e:
        client.start_copy(str(tmp_path), "ro:")
    assert "read-only" in e.value.message


def test_copy_between_storages_with_progress_and_sync(client, s3_server, webdav_server,
                                                      tmp_path):
    src = _source(s3_server, "between4")
    data = os.urandom(3_000_000)
    (s3_server.root / src / "a.bin").write_bytes(data)
    (s3_server.root / src / "b.txt").write_text("b")
    dst = _source(webdav_server, "between4dst")
    (webdav_server.root / dst / "stale.txt").write_text("old")
    client.add("s3src", "s3", s3_server.storage_options(), source=src)
    client.add("davdst", "webdav", webdav_server.storage_options(), source=dst,
               read_only=False)

    op = client.start_copy("s3src:", "davdst:", mode="sync")
    events = list(client.events(op))
    result = client.wait(op)
    assert (webdav_server.root / dst / "a.bin").read_bytes() == data
    assert not (webdav_server.root / dst / "stale.txt").exists()  # sync deletes
    assert result["files"] == 2 and result["bytes"] == len(data) + 1
    done = [e for e in events if e.step == "transfer" and e.data.get("total_bytes")]
    assert done, [e.to_dict() for e in events]
    last = done[-1].data
    assert {"bytes", "total_bytes", "files", "total_files", "speed", "eta"} <= set(last)
    assert events[-1].step == "succeeded"


def test_cancel_a_copy(s3_server, tmp_path, make_client):
    # a bandwidth limit chosen by the admin keeps the copy slow enough to cancel
    client = make_client(transfer_options=["--bwlimit", "2M"])
    src = tmp_path / "many"
    src.mkdir()
    for i in range(4):
        (src / f"f{i}.bin").write_bytes(os.urandom(8_000_000))
    client.add("slow", "s3", {**s3_server.storage_options()}, source=_source(s3_server, "cancel5"),
               read_only=False)
    op = client.start_copy(str(src), "slow:")
    for ev in client.events(op):
        if ev.step == "transfer" and ev.data.get("bytes"):
            client.cancel(op)
    with pytest.raises(OperationCancelled):
        client.wait(op)
    assert client.operation(op).state == "cancelled"
    assert not list((s3_server.root / "cancel5").glob("*.bin")) or len(
        list((s3_server.root / "cancel5").glob("*.bin"))) < 4
