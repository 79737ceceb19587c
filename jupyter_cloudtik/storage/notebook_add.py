"""``%storage add`` in a notebook of a Jupyter server: the user confirms it in the browser.

A kernel holds the kernel token, which may not add storages (``api/base.py``
``KERNEL_REFUSED``): credentials go from the user's browser to the server, never through
the kernel.  So after the server has checked the request (``POST storage-checks``, the
same checks as an add, nothing saved), the kernel shows a form in the cell's output — a
MIME bundle of :data:`MIME_TYPE` that the JupyterLab extension renders (only in outputs
of the live session: its renderer is not *safe*), with everything of the request but
secret values and a password field for each ``--ask`` key.  Its Add button posts the add
from the browser with the user's own session.  The kernel meanwhile waits for the storage
to exist (with ``--replace``: to change), then replaces the form with the one-line result,
so the saved notebook holds neither the form nor a secret.  Other front ends show the
text fallback: it says what to do instead (the panel's Storage form, or the CLI in a
terminal), and the wait ends when the storage appears whichever way it was added.
"""

from __future__ import annotations

import argparse
import shlex
import time
import uuid
from typing import Any

from ..core.errors import CloudTikError, NotFoundError, OperationCancelled
from .catalog import StorageInfo
from .commands import describe

MIME_TYPE = "application/vnd.cloudtik.storage-add+json"
WAIT_TIMEOUT = 900.0  # seconds the kernel waits for the user to press Add
POLL_INTERVAL = 1.0


def terminal_command(args: argparse.Namespace) -> str:
    """The ``jupyter cloudtik storage add`` line that does the same in a terminal (values
    of ``--ask`` keys are asked there; nothing secret is in it: the check refused those)."""
    words = ["jupyter", "cloudtik", "storage", "add", args.name]
    if args.url:
        words.append(args.url)
    if args.backend:
        words += ["--backend", args.backend]
    for key, value in args.option:
        if key not in args.ask:
            words += ["-o", f"{key}={value}"]
    for key, var in args.from_env:
        words += ["--from-env", f"{key}={var}"]
    for key in args.ask:
        words += ["--ask", key]
    if args.source:
        words += ["--source", args.source]
    if args.read_write:
        words.append("--read-write")
    if args.mount_path:
        words += ["--mount-path", args.mount_path]
    if args.vfs_cache_mode:
        words += ["--vfs-cache-mode", args.vfs_cache_mode]
    if args.description:
        words += ["--description", args.description]
    if args.replace:
        words.append("--replace")
    return shlex.join(words)


def form_bundle(args: argparse.Namespace, request: dict[str, Any], checked: StorageInfo,
                timeout: float) -> dict[str, Any]:
    """The cell output that asks the user: the form's data and a text fallback."""
    name = args.name
    ask = list(dict.fromkeys(args.ask))
    access = "read-only" if checked.read_only else "read-write"
    data = {
        "version": 1,
        "request": request,  # POST storages' body without the asked values
        "ask": ask,
        "secret": [k for k in ask if k in checked.secret_options],
        "storage": {"backend": checked.backend, "source": checked.source or "/",
                    "access": access, "mount_path": checked.mount_path,
                    "options": checked.to_dict()["options"]},
        "timeout": timeout,
    }
    needs = (f"its {', '.join(ask)}, typed into JupyterLab's form here" if ask else
             "your confirmation in JupyterLab's form here")
    text = (f"Adding storage {name!r} ({checked.backend} {checked.source or '/'}, {access}) "
            f"needs {needs}: the kernel does not carry credentials.\n"
            "This front end cannot show that form. Add it instead from the CloudTik panel's "
            "Storage section, or in a terminal:\n"
            f"  {terminal_command(args)}\n"
            f"Waiting up to {timeout / 60:.0f} min for storage {name!r} "
            f"{'to change' if args.replace else 'to exist'} (interrupt the kernel to stop).")
    return {MIME_TYPE: data, "text/plain": text}


def add_in_notebook(client: Any, args: argparse.Namespace, request: dict[str, Any],
                    checked: StorageInfo, *, timeout: float = WAIT_TIMEOUT,
                    poll: float = POLL_INTERVAL) -> StorageInfo:
    """Show the form, wait for the storage, replace the form with the result line."""
    from IPython.display import display, update_display

    name = args.name
    before = None
    if args.replace:
        try:
            before = client.get(name).updated_at
        except NotFoundError:
            before = None
    # The display id is ours before the form is shown, and the try starts before it: an
    # interrupt sent as soon as the form arrives can land while display() is still
    # returning, and must still close the form (an update for an id the front end has
    # not seen yet is ignored by it, so closing too early is harmless).
    display_id = uuid.uuid4().hex
    try:
        display(form_bundle(args, request, checked, timeout), raw=True,
                display_id=display_id)
        info = wait_for_storage(client, name, before, timeout, poll)
    except KeyboardInterrupt:
        update_display({"text/plain": f"storage {name!r}: the form is closed (interrupted)"},
                       raw=True, display_id=display_id)
        raise OperationCancelled(f"adding storage {name!r}: interrupted; the form is "
                                 "closed") from None
    except BaseException:
        update_display({"text/plain": f"storage {name!r}: the form is closed"}, raw=True,
                       display_id=display_id)
        raise
    update_display({"text/plain": describe("storage", info)}, raw=True,
                   display_id=display_id)
    return info


def wait_for_storage(client: Any, name: str, before: float | None, timeout: float,
                     poll: float) -> StorageInfo:
    """Poll ``GET storages/NAME`` until the storage exists (and, if ``before`` is its old
    ``updated_at``, has changed).  Not found is waited through; any other error ends the
    wait with that error (fail closed); so does the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            info = client.get(name)
        except NotFoundError:
            info = None
        if info is not None and (before is None or info.updated_at != before):
            return info
        if time.monotonic() >= deadline:
            raise CloudTikError(
                f"storage {name!r} was not {'replaced' if before is not None else 'added'} "
                f"within {timeout:.0f}s (the form in the cell was not used); run the "
                "%storage add again", field="name")
        time.sleep(poll)
