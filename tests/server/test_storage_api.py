"""Storage routes against a real JupyterLab and a real `rclone serve s3`: shapes validated
against openapi.yaml, secrets never in answers, transfers with progress events, mounts."""

from __future__ import annotations

import json
import os

import pytest

from jupyter_cloudtik.storage.mounts import fuse_problem, mount_entry
from jupyter_cloudtik.storage.servers import start_server

from .conftest import checked, unique


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    base = tmp_path_factory.mktemp("api-s3")
    srv = start_server("s3", base / "root", workdir=base / "work")
    yield srv
    srv.stop()


def test_storage_life_cycle(lab, spec_checker, s3):
    name = unique("api-s3").replace("-", "_")
    (s3.root / "api-bucket").mkdir()
    (s3.root / "api-bucket" / "hello.txt").write_text("hello over REST")
    answers = []

    resp = checked(spec_checker, lab.request("POST", "storages", json={
        "name": name, "backend": "s3", "options": s3.storage_options(),
        "source": "api-bucket", "read_only": False}))
    assert resp.status_code == 201, resp.text
    answers.append(resp.text)
    body = resp.json()
    assert body["options"]["secret_access_key"] == "<secret>" and body["read_only"] is False

    listing = checked(spec_checker, lab.get("storages"))
    answers.append(listing.text)
    assert name in [s["name"] for s in listing.json()["storages"]]

    test = checked(spec_checker, lab.request("POST", f"storages/{name}/test"))
    assert test.json()["ok"] is True and test.json()["entries"] == 1

    ls = checked(spec_checker, lab.get(f"storages/{name}/ls", params={"path": ""}))
    assert [e["name"] for e in ls.json()["entries"]] == ["hello.txt"]

    # a transfer into the server's root folder, with progress events
    resp = checked(spec_checker, lab.request("POST", "storage-transfers", json={
        "src": f"{name}:", "dst": "from-s3"}))
    assert resp.status_code == 202, resp.text
    op = lab.wait_operation(resp.json()["operation"]["id"])
    assert op["state"] == "succeeded", op
    assert (lab.root / "from-s3" / "hello.txt").read_text() == "hello over REST"
    events = lab.get(f"operations/{op['id']}/events").json()["events"]
    answers.append(json.dumps(events))
    assert any(e["step"] == "transfer" and "bytes" in e["data"] for e in events)

    # local paths outside the root folder are refused
    resp = lab.request("POST", "storage-transfers", json={"src": f"{name}:", "dst": "/etc/x"})
    assert resp.status_code == 403 and resp.json()["field"] == "dst"

    # the add form's description: secret options are password fields
    schema = checked(spec_checker, lab.get("storage-backends/s3",
                                           params={"provider": "Rclone"})).json()
    secret = {o["name"] for o in schema["options"] if o["secret"]}
    assert {"access_key_id", "secret_access_key"} <= secret
    backends = checked(spec_checker, lab.get("storage-backends")).json()["backends"]
    assert "s3" in [b["name"] for b in backends]
    assert "local" not in [b["name"] for b in backends]

    if fuse_problem() is None:
        resp = checked(spec_checker, lab.request("POST", f"storages/{name}/mount", json={}))
        op = lab.wait_operation(resp.json()["operation"]["id"])
        assert op["state"] == "succeeded", op
        path = lab.get(f"storages/{name}").json()["mount_path"]
        assert path.startswith(str(lab.root)) and mount_entry(path) is not None
        assert os.listdir(path) == ["hello.txt"]
        resp = checked(spec_checker, lab.request("DELETE", f"storages/{name}/mount"))
        assert lab.wait_operation(resp.json()["operation"]["id"])["state"] == "succeeded"
        assert mount_entry(path) is None

    resp = checked(spec_checker, lab.request("DELETE", f"storages/{name}"))
    assert resp.json() == {"removed": name}
    assert lab.get(f"storages/{name}").status_code == 404
    for text in [*answers, lab.log_text()]:
        assert s3.password not in text


@pytest.mark.parametrize(("body", "status", "field"), [
    ({"name": "x; touch pwned", "backend": "s3"}, 400, "name"),
    ({"name": "ok", "backend": "s3", "options": {"provider": "AWS", "nope": "1"}}, 400,
     "options.nope"),
    ({"name": "ok", "backend": "local"}, 403, "backend"),
    ({"name": "ok", "backend": "sftp", "options": {"host": "h", "key_file": "/root/.ssh/x"}},
     403, "options.key_file"),
    ({"name": "ok", "url": "gopher://x"}, 400, "url"),
])
def test_bad_storages_are_a_4xx_naming_the_field(lab, spec_checker, body, status, field):
    resp = checked(spec_checker, lab.request("POST", "storages", json=body))
    assert resp.status_code == status, resp.text
    assert resp.json()["field"] == field


@pytest.mark.parametrize("where", ["~0", "~no-such-account/data", "~0/x"])
def test_home_of_an_unknown_account_is_a_400(lab, spec_checker, where):
    """``~name`` paths of accounts that do not exist (schemathesis found ``~0``)."""
    resp = checked(spec_checker, lab.request("POST", "storage-transfers",
                                             json={"src": where, "dst": "0"}))
    assert resp.status_code == 400, resp.text
    assert resp.json()["field"] == "src"


def test_wrong_credentials_test_result(lab, spec_checker, s3):
    name = unique("bad").replace("-", "_")
    lab.request("POST", "storages", json={
        "name": name, "backend": "s3", "source": "api-bucket",
        "options": s3.storage_options(password="definitely-wrong-secret")})
    result = checked(spec_checker, lab.request("POST", f"storages/{name}/test")).json()
    assert result["ok"] is False and "authentication failed" in result["error"]["message"]
    assert "definitely-wrong-secret" not in json.dumps(result)
    lab.request("DELETE", f"storages/{name}")


def test_kernel_storage_magics_use_the_server(lab, s3):
    """In a kernel started by the server, %storage goes through the REST API: the server
    runs the copy, and relative local paths are the notebook's."""
    from .kernels import KernelError, running_kernel

    name = unique("kern").replace("-", "_")
    (s3.root / "kernel-bucket").mkdir()
    (s3.root / "kernel-bucket" / "k.txt").write_text("via the server")
    (lab.root / "sub").mkdir(exist_ok=True)
    with running_kernel(lab, "sub/storage.ipynb") as k:
        out = k.run("from jupyter_cloudtik.storage.client import get_storage_client\n"
                    "print(type(get_storage_client()).__name__)")
        assert out.strip() == "RestStorageClient"
        k.run("%load_ext jupyter_cloudtik")
        k.run(f"sk = {s3.password!r}")
        # adding a storage (credentials) stays with the user: the kernel does not carry
        # secret values (the server's check of the add refuses them: they are asked for in
        # the cell's form, test_storage_notebook*.py), and its token may not add
        with pytest.raises(KernelError) as refused:
            k.run(f"%storage add {name} s3://kernel-bucket -o provider=Rclone "
                  f"-o endpoint={s3.url} -o access_key_id={s3.user} "
                  f"-o secret_access_key=$sk")
        assert "options.access_key_id: a secret option" in str(refused.value)
        assert "--ask access_key_id" in str(refused.value)
        assert s3.password not in str(refused.value)
        r = lab.request("POST", "storages", json={
            "name": name, "url": "s3://kernel-bucket", "options": {
                "provider": "Rclone", "endpoint": s3.url, "access_key_id": s3.user,
                "secret_access_key": s3.password}})
        assert r.status_code == 201, r.text
        assert "answers" in k.run(f"%storage test {name}")
        assert "k.txt" in k.run(f"%storage ls {name}:")
        out = k.run(f"%storage cp {name}: copied")
        assert "1 file(s)" in out
        try:
            k.run("%storage ls ghost:")
            raise AssertionError("expected an error")
        except KernelError as e:
            assert "no storage named 'ghost'" in str(e)
    # relative to the notebook's folder, run by the server
    assert (lab.root / "sub" / "copied" / "k.txt").read_text() == "via the server"
    ops = lab.get("operations").json()["operations"]
    copy = next(o for o in ops if o["kind"] == "storage.copy" and name in o["params"]["src"])
    assert copy["owner_pid"] == lab.proc.pid
    lab.request("DELETE", f"storages/{name}")
