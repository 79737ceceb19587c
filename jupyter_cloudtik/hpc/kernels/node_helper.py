"""The session's storages from an HPC kernel, on its compute node.

Written into the kernel's job folder as ``cloudtik_node.py`` and loaded by the kernel at
its start (``job.py``): the standard library only, since the node's environment need not
have jupyter_cloudtik.  It registers the ``%storage`` line magic of the kernel, with the
session's own grammar (``ls`` and ``cp``; storage/magics.py)::

    %storage ls data:results              # a storage's folder, as the session lists it
    %storage cp data:results/run1.csv .   # into the kernel's working folder (on the node)
    %storage cp data:inputs in            # a folder, as in/
    %storage cp plots data:results/run7   # a file or folder of the working folder, back

and the same as functions (``import cloudtik_node as s; s.get("data:x.csv")``).  Each is a
request to the user's Jupyter server, which copies between the storage (its credentials
stay there) and the job's folder; the request goes to the server's port forwarded to the
node's loopback through the kernel's own SSH connection, with a token that is this
kernel's alone, in a file of the job's account (``$CLOUDTIK_NODE_API``, mode 0600).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

API_ENV = "CLOUDTIK_NODE_API"
USAGE = ("usage: %storage ls NAME:path | %storage cp SRC DST (one of them a storage's "
         "NAME:path, the other a path in the kernel's working folder)")
_STORAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*:")


def _api() -> dict[str, str]:
    path = os.environ.get(API_ENV)
    try:
        with open(path or "") as f:
            info = json.load(f)
        return {"url": str(info["url"]), "token": str(info["token"])}
    except (OSError, ValueError, KeyError, TypeError):
        raise RuntimeError("the session's storages are not reachable from this kernel: "
                           "the Jupyter server has not connected it (the server's log and "
                           "the side panel's HPC kernels section say why; a kernel of the "
                           "hub's catalogue has none)") from None


def _call(verb: str, body: dict[str, Any] | None = None, query: str = "") -> Any:
    info = _api()
    req = urllib.request.Request(
        info["url"] + verb + query, method="POST" if body is not None else "GET",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": "token " + info["token"],
                 "Content-Type": "application/json"})
    # the server is on the node's loopback: never through a site's HTTP proxy
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=24 * 3600) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as e:
        try:
            message = json.load(e).get("message") or str(e)
        except ValueError:
            message = str(e)
        raise RuntimeError(message) from None
    except OSError as e:
        raise RuntimeError(f"the Jupyter server did not answer: {e}") from None


def ls(path: str) -> list[dict[str, Any]]:
    """The entries of a storage's folder ``NAME:path``."""
    return _call("ls", query="?path=" + urllib.parse.quote(path))["entries"]


def get(src: str, dest: str = "") -> dict[str, Any]:
    """Copy ``NAME:path`` (a file or folder) into the working folder (as ``dest``)."""
    return _call("get", {"src": src, "dest": dest})


def put(src: str, dst: str) -> dict[str, Any]:
    """Copy ``src`` (a file or folder of the working folder) to the storage ``NAME:path``."""
    return _call("put", {"src": src, "dst": dst})


def _magic(line: str) -> None:
    try:
        args = shlex.split(line, comments=True)  # IPython passes "# ..." on to the magic
    except ValueError as e:
        print(f"%storage: {e}; {USAGE}")
        return
    verb, rest = (args[0], args[1:]) if args else ("", [])
    try:
        if verb == "ls" and len(rest) == 1:
            for e in ls(rest[0]):
                print(f"{e['name']}/" if e.get("is_dir") else
                      f"{e['name']}\t{e.get('size')}")
        elif verb in ("cp", "copy") and len(rest) == 2:
            src, dst = rest
            if _STORAGE.match(src) and not _STORAGE.match(dst):
                # "." or "dir/": into that folder under the source's own name
                name = src.rstrip("/").rsplit("/", 1)[-1].split(":", 1)[-1]
                dest = dst if dst not in (".", "./") else ""
                if dest.endswith("/"):
                    dest += name
                done = get(src, dest)
                print(f"{done['src']} -> {done['path']} ({done['bytes']} bytes)")
            elif _STORAGE.match(dst) and not _STORAGE.match(src):
                done = put(src, dst)
                print(f"{done['path']} -> {done['dst']} ({done['bytes']} bytes)")
            else:
                print(f"%storage: one of SRC and DST must be a storage's NAME:path and the "
                      f"other a path in the kernel's working folder; {USAGE}")
        else:
            print(USAGE)
    except RuntimeError as e:
        print(f"%storage: {e}")


def register() -> None:
    """Add ``%storage`` to the running IPython kernel (nothing in the user's names)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is not None:
        ip.register_magic_function(_magic, "line", "storage")
