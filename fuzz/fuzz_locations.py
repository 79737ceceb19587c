"""Locations users name (core/locations.py): ``NAME:path``, ``file://`` URLs, plain paths,
``NAME=LOCATION`` inputs and file names inside a job's folder, under the three policies.

Properties: nothing but a ``CloudTikError`` that names the field escapes; under the server's
policy (``ServerRoot``) every path that is accepted is inside the root folder and not
hidden; under the hub's (``NoLocal``) nothing local is ever accepted; a file name accepted
by ``check_file_name`` is relative and has no ``..``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from _harness import choose, instrumented, main, text

with instrumented():
    from jupyter_cloudtik.core.errors import CloudTikError, NotFoundError
    from jupyter_cloudtik.core.locations import (
        InProcess,
        NoLocal,
        ServerRoot,
        check_file_name,
        is_within,
        resolve,
        split_named,
    )

ROOT = Path(tempfile.mkdtemp(prefix="fuzz-locations-"))
(ROOT / "data").mkdir()
(ROOT / "data" / "in.csv").write_text("a,b\n")
(ROOT / ".hidden").mkdir()
os.symlink("/etc", ROOT / "out")  # a symlink planted in the root that points out
STORAGES = {"s3", "bucket"}


def _hub_check(name: str, field: str, write: bool) -> None:
    if name not in STORAGES:
        raise NotFoundError(f"{field}: no storage named {name!r}", field=field)


POLICIES = [InProcess(ROOT), ServerRoot(ROOT), NoLocal(_hub_check)]


def one(data: bytes) -> None:
    which, rest = choose(data, 5)
    value = text(rest)
    field = "inputs[0]"
    if which == 3:
        name, loc = split_named(value)
        assert name is None or ("/" not in name and ":" not in name and name), name
        value = loc
    if which == 4:
        try:
            name = check_file_name(value, field)
        except CloudTikError as e:
            assert e.field == field, e.field
            return
        assert not name.startswith("/") and ".." not in name.split("/"), name
        return
    policy = POLICIES[which % 3]
    try:
        r = resolve(value, field, policy, is_storage=STORAGES.__contains__,
                    backends=("slurm",))
    except CloudTikError as e:
        assert e.field == field, (e.field, value)
        return
    if r.kind == "local":
        assert not isinstance(policy, NoLocal), ("the hub accepted a local path", value)
        if isinstance(policy, ServerRoot):
            real = Path(r.path)
            assert is_within(real, policy.root), ("outside the root", value, r.path)
            rel = real.relative_to(policy.root)
            assert not any(p.startswith(".") for p in rel.parts), ("hidden", value)
    elif r.kind == "system":
        assert not isinstance(policy, NoLocal), ("the hub accepted a system path", value)


if __name__ == "__main__":
    main(one)
