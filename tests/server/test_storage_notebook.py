"""``%storage add`` in a kernel of a real JupyterLab (issue 28, point 2).

The kernel token may not add storages (credentials go browser → server), so the magic has
the server check the request first (``POST storage-checks``: the add's own checks,
nothing saved, names of asked keys only) and answers input errors with the messages of
plain IPython; then it shows a form (a MIME bundle the JupyterLab extension renders) and
waits for the storage.  Here: the messages, the check route against hostile bodies, the
kernel's side of the form over real kernel messages; the browser's side is
test_storage_notebook_browser.py.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from jupyter_cloudtik.core.errors import CloudTikError
from jupyter_cloudtik.storage.client import StorageClient
from jupyter_cloudtik.storage.commands import run_command, storage_parser
from jupyter_cloudtik.storage.notebook_add import MIME_TYPE
from jupyter_cloudtik.storage.servers import start_server

from .conftest import checked, unique
from .kernels import running_kernel

NOTEBOOK = "storage-check/notebook.ipynb"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    base = tmp_path_factory.mktemp("nb-s3")
    srv = start_server("s3", base / "root", workdir=base / "work")
    (srv.root / "nb-bucket").mkdir()
    (srv.root / "nb-bucket" / "in.txt").write_text("from the form")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def kernel(lab):
    (lab.root / "storage-check").mkdir(exist_ok=True)
    with running_kernel(lab, NOTEBOOK) as k:
        k.run("%load_ext jupyter_cloudtik")
        yield k


@pytest.fixture(scope="module")
def kernel_token(kernel):
    """The token the kernel has (read in the kernel, as code in it would)."""
    return kernel.run("import os; print(os.environ['CLOUDTIK_API_TOKEN'], end='')")


def kernel_error(k, code: str) -> str:
    """``ename: evalue`` of the error ``code`` ends with in the kernel (a UsageError is
    shown on stderr; the reply carries it)."""
    reply = k.client.execute_interactive(code, timeout=60, output_hook=lambda msg: None)
    content = reply["content"]
    assert content["status"] == "error", content
    return f"{content['ename']}: {content['evalue']}"


def storage_names(lab) -> list[str]:
    return sorted(s["name"] for s in lab.get("storages").json()["storages"])


def plain_ipython_message(settings, line: str) -> str:
    """What ``%storage LINE`` answers in plain IPython (the core in process)."""
    args = storage_parser("%storage").parse_args(line.split())
    try:
        run_command(args, StorageClient(settings=settings), follow=None,
                    ask=lambda prompt: pytest.fail(f"asked {prompt!r} before the check"))
    except CloudTikError as e:
        return f"UsageError: {e.message}"
    raise AssertionError(f"{line!r} was accepted in plain IPython")


TYPOS = [
    ("add {n} s3://nb-bucket -o endpint=http://127.0.0.1:9 --ask secret_access_key",
     "did you mean endpoint"),
    ("add {n} s3:/nb-bucket --ask secret_access_key", "is not a storage URL"),
    ("add {n} s3://nb-bucket --ask secret_acess_key", "did you mean secret_access_key"),
    ("add {n} -b s33 --ask pass", "did you mean s3?"),
    ("add {n} s4://nb-bucket --ask secret_access_key", "unknown scheme 's4'"),
    ("add bad.name s3://nb-bucket --ask secret_access_key", "is not a valid storage name"),
    ("add {n} s3://nb-bucket -o provider=Rclon --ask secret_access_key",
     "did you mean Rclone"),
]


def test_input_errors_come_before_the_token_refusal(lab, kernel, settings):
    """Each typo gets plain IPython's one-line message (no token refusal, no prompt),
    and nothing is saved."""
    before = storage_names(lab)
    name = unique("typo").replace("-", "_")
    for line, hint in TYPOS:
        line = line.format(n=name)
        message = kernel_error(kernel, f"%storage {line}")
        assert hint in message, (line, message)
        assert "kernel token" not in message and "\n" not in message
        assert message == plain_ipython_message(settings, line), line
    # an unknown flag is argparse's, in the kernel before any request
    message = kernel_error(kernel, f"%storage add {name} s3://nb-bucket --aks secret_access_key")
    assert "unrecognized arguments: --aks" in message
    assert storage_names(lab) == before


def test_existing_name_and_secret_values_are_answered_in_the_kernel(lab, kernel, s3):
    name = unique("exists").replace("-", "_")
    r = lab.request("POST", "storages", json={
        "name": name, "url": "s3://nb-bucket", "options": s3.storage_options()})
    assert r.status_code == 201, r.text
    try:
        message = kernel_error(kernel, f"%storage add {name} s3://nb-bucket "
                                       "--ask secret_access_key")
        assert message == (f"UsageError: a storage named {name!r} exists; remove it first "
                           "or use replace")
        # a secret's value may not travel through the kernel: it says to ask for it
        kernel.run(f"sk = {s3.password!r}")
        other = unique("value").replace("-", "_")
        message = kernel_error(kernel, f"%storage add {other} s3://nb-bucket "
                                       "-o secret_access_key=$sk")
        assert message.startswith("UsageError: options.secret_access_key: a secret option")
        assert "--ask secret_access_key" in message and s3.password not in message
        assert other not in storage_names(lab)
    finally:
        lab.request("DELETE", f"storages/{name}")


def test_the_kernel_token_still_cannot_add(lab, kernel, s3):
    """Straight from the kernel, with its own token: 403 naming the token."""
    name = unique("direct").replace("-", "_")
    body = {"name": name, "url": "s3://nb-bucket", "options": s3.storage_options()}
    out = kernel.run(
        "import json, os, requests\n"
        "token = os.environ['CLOUDTIK_API_TOKEN']\n"
        "r = requests.post(os.environ['CLOUDTIK_API_URL'] + 'storages', timeout=30,\n"
        f"                  headers={{'Authorization': 'token ' + token}}, json={body!r})\n"
        "print(json.dumps([r.status_code, r.json()]))")
    status, answer = json.loads(out)
    assert status == 403 and answer["field"] == "token", answer
    assert "kernel token may not be used for adding a storage" in answer["message"]
    assert name not in storage_names(lab)


# the add and the check refuse the same things, the same way (status and field)
HOSTILE = [
    {"name": "x; touch pwned", "backend": "s3"},
    {"name": "../../etc", "url": "s3://b"},
    {"name": "ok", "backend": "s3", "options": {"provider": "AWS", "nope": "1"}},
    {"name": "ok", "backend": "local"},
    {"name": "ok", "backend": "alias", "options": {"remote": "/etc"}},
    {"name": "ok", "backend": "sftp", "options": {"host": "h", "key_file": "/root/.ssh/x"}},
    {"name": "ok", "url": "sftp://h/x", "options": {"ssh": "nc evil 22"}},
    {"name": "ok", "url": "gopher://x"},
    {"name": "ok", "url": "s3://b", "options": {"provider": "Nope"}},
    {"name": "ok", "url": "s3://b", "mount_path": "/etc"},
    {"name": "ok", "url": "s3://b", "mount_path": "../outside"},
    {"name": "ok", "url": "s3://b", "mount_path": "~/x"},
    {"name": "ok", "url": "s3://b", "source": "a\nb"},
    {"name": "ok", "url": "s3://b", "vfs_cache_mode": "all"},
    {"name": "ok", "url": "s3://b", "options": {"chunk_size": "lots"}},
    {"name": "ok", "url": "s3://b", "extra": 1},
    {"name": "ok", "url": "s3://b", "options": {"provider": "AWS", "endpoint": {"a": 1}}},
]


@pytest.mark.parametrize("body", HOSTILE, ids=[json.dumps(b)[:60] for b in HOSTILE])
def test_the_check_refuses_what_add_refuses(lab, spec_checker, kernel_token, body):
    before = storage_names(lab)
    add = lab.request("POST", "storages", json=body)
    check = checked(spec_checker, lab.request(
        "POST", "storage-checks", json={"storage": body},
        headers={"Authorization": f"token {kernel_token}"}))
    assert 400 <= add.status_code < 500, add.text
    # the same refusal; a field the schema names is inside the check's "storage"
    field = add.json()["field"]
    assert check.status_code == add.status_code, (check.text, add.text)
    same = {field, f"storage.{field}"} | ({"storage"} if field == "body" else set())
    assert check.json()["field"] in same, (check.text, add.text)
    assert storage_names(lab) == before


@pytest.mark.parametrize(("body", "status", "field"), [
    # asked names are checked as option names are (unknown, unsafe)
    ({"storage": {"name": "ok", "url": "s3://b"}, "ask": ["secret_acess_key"]}, 400,
     "options.secret_acess_key"),
    ({"storage": {"name": "ok", "backend": "sftp", "options": {"host": "h"}},
      "ask": ["key_file"]}, 403, "options.key_file"),
    # no secret values: given ones are refused, asked ones carry none
    ({"storage": {"name": "ok", "url": "s3://b", "options": {"secret_access_key": "v"}}},
     400, "options.secret_access_key"),
    ({"storage": {"name": "ok", "url": "webdav+https://u:pw@h/dav"}}, 400, "options.pass"),
    ({"storage": {"name": "ok", "url": "s3://b", "options": {"endpoint": "e"}},
      "ask": ["endpoint"]}, 400, "options.endpoint"),
    ({"storage": {"name": "ok", "url": "s3://b"}, "ask": [""]}, 400, "ask.0"),
    ({"storage": {"name": "ok", "url": "s3://b"}, "ask": "secret_access_key"}, 400, "ask"),
    ({"name": "ok", "url": "s3://b"}, 400, "body"),
])
def test_check_only_refusals(lab, spec_checker, kernel_token, body, status, field):
    before = storage_names(lab)
    resp = checked(spec_checker, lab.request(
        "POST", "storage-checks", json=body, headers={"Authorization": f"token {kernel_token}"}))
    assert resp.status_code == status, resp.text
    assert resp.json()["field"] == field, resp.text
    assert "pw" not in resp.json()["message"].split()
    assert storage_names(lab) == before


def test_a_good_check_saves_nothing(lab, spec_checker, kernel_token, s3):
    name = unique("good").replace("-", "_")
    resp = checked(spec_checker, lab.request(
        "POST", "storage-checks", headers={"Authorization": f"token {kernel_token}"},
        json={"storage": {"name": name, "url": "s3://nb-bucket/x", "options": {
            "provider": "Rclone", "endpoint": s3.url}},
            "ask": ["access_key_id", "secret_access_key"]}))
    assert resp.status_code == 200, resp.text
    got = resp.json()
    assert got["ask"] == ["access_key_id", "secret_access_key"]
    assert got["storage"]["secret_options"] == ["access_key_id", "secret_access_key"]
    assert got["storage"]["source"] == "nb-bucket/x"
    assert got["storage"]["mount_path"] == str(lab.root.resolve() / "storage" / name)
    assert lab.get(f"storages/{name}").status_code == 404
    assert name not in storage_names(lab)


# --------------------------------------------------------------------------- the form
def _execute(k, code: str, on_message, timeout: float = 60) -> list[dict[str, Any]]:
    """Run ``code`` in the kernel; every IOPub message of it goes to ``on_message`` as it
    arrives; returns them all (until the kernel is idle again)."""
    client = k.client
    msg_id = client.execute(code)
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = client.get_iopub_msg(timeout=1)
        except Exception:  # queue.Empty
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        seen.append(msg)
        on_message(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return seen
    raise AssertionError(f"the kernel did not finish {code!r} in {timeout}s: {seen}")


def _plain(msg) -> str:
    return msg["content"].get("data", {}).get("text/plain", "")


def test_form_then_result_line_over_kernel_messages(lab, kernel, s3):
    """The kernel shows the form (no secret in it), waits, and once the storage exists —
    here added with the server's token, as the browser would with the user's session —
    replaces the form with the result line (the same display id)."""
    name = unique("form").replace("-", "_")
    line = (f"%storage add {name} s3://nb-bucket -o provider=Rclone -o endpoint={s3.url} "
            "--ask access_key_id --ask secret_access_key")
    shown: list[dict[str, Any]] = []

    def on_message(msg):
        if msg["msg_type"] == "display_data" and MIME_TYPE in msg["content"]["data"]:
            shown.append(msg)
            r = lab.request("POST", "storages", json={**msg["content"]["data"][MIME_TYPE][
                "request"], "options": s3.storage_options()})
            assert r.status_code == 201, r.text

    messages = _execute(kernel, line, on_message)
    assert len(shown) == 1
    form = shown[0]["content"]["data"][MIME_TYPE]
    assert form["ask"] == ["access_key_id", "secret_access_key"]
    assert form["request"]["options"] == {"provider": "Rclone", "endpoint": s3.url}
    assert form["storage"]["backend"] == "s3" and form["storage"]["source"] == "nb-bucket"
    text = _plain(shown[0])
    assert "panel's Storage section" in text
    assert (f"jupyter cloudtik storage add {name} s3://nb-bucket -o provider=Rclone -o "
            f"endpoint={s3.url} --ask access_key_id --ask secret_access_key") in text
    display_id = shown[0]["content"]["transient"]["display_id"]
    updates = [m for m in messages if m["msg_type"] == "update_display_data"]
    assert [m["content"]["transient"]["display_id"] for m in updates] == [display_id]
    assert list(updates[0]["content"]["data"]) == ["text/plain"]
    assert _plain(updates[0]).startswith(f"storage {name!r}: s3 nb-bucket (read-only)")
    assert not [m for m in messages if m["msg_type"] in ("error", "stream")], messages
    every = json.dumps([m["content"] for m in messages])
    assert s3.password not in every and s3.user not in every
    lab.request("DELETE", f"storages/{name}")


def test_interrupt_closes_the_form(lab, kernel):
    name = unique("intr").replace("-", "_")
    sessions = lab.session.get(lab.url + "api/sessions", headers=lab.headers()).json()
    kid = next(s["kernel"]["id"] for s in sessions if s["path"] == NOTEBOOK)

    def on_message(msg):
        if msg["msg_type"] == "display_data" and MIME_TYPE in msg["content"]["data"]:
            lab.session.post(lab.url + f"api/kernels/{kid}/interrupt", headers=lab.headers(),
                             timeout=30).raise_for_status()

    messages = _execute(kernel, f"%storage add {name} s3://nb-bucket --ask secret_access_key",
                        on_message)
    updates = [_plain(m) for m in messages if m["msg_type"] == "update_display_data"]
    assert updates == [f"storage {name!r}: the form is closed (interrupted)"]
    printed = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
    assert printed == f"cancelled: adding storage {name!r}: interrupted; the form is closed\n"
    assert lab.get(f"storages/{name}").status_code == 404
