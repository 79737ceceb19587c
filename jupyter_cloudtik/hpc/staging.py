"""Moving inputs and results between where they live and where the job runs.

A location is a local path (``data/in.csv``, ``/home/me/x``, ``file:///...``), a URL, or
whatever a registered ``Stager`` understands (storages, once configured).  For every input
the job manager first asks the backend whether the system reads it itself
(``HPCBackend.can_reach``: a path on a filesystem the system shares, a URL an ARC CE
fetches); only otherwise is it staged through the session: a stager brings it to a local
staging folder and the backend uploads it into the job's folder.  Results go the other
way.  A location nobody can reach is refused before anything is submitted.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from ..core.errors import ConfigError, NotFoundError, ProviderError
from ..core.locations import (
    ALWAYS_REFUSED,
    is_within,
    nearest_real,
    split_named,  # noqa: F401  (re-exported: one rule)
)
from ..core.paths import user_path

Progress = Callable[[float, str], None]


class Stager(Protocol):
    """Copies between a kind of location and local files (in the session)."""

    def handles(self, location: str) -> bool: ...

    def check(self, location: str, *, for_output: bool = False) -> None:
        """Raise a user-facing error if ``location`` is unusable (missing input, ...)."""

    def download(self, location: str, dest: Path, progress: Progress) -> Path:
        """Make ``location`` available as a local file or folder; return its path."""

    def upload(self, src: Path, location: str, progress: Progress) -> None:
        """Copy the local file or folder ``src`` to ``location`` (a folder)."""


_NAMED = re.compile(r"^[A-Za-z][\w.-]*:")


def is_local(location: str) -> bool:
    """A path of this machine (``x``, ``/x``, ``~/x``, ``file:///x``), not ``NAME:...`` or a URL."""
    if location.startswith("file://"):
        return True
    return "://" not in location and not _NAMED.match(location)


def local_path(location: str) -> Path:
    if location.startswith("file://"):
        return Path(urlparse(location).path)
    return user_path(location, "location")


def normalize(location: str) -> str:
    """Absolute local paths (relative ones are relative to the session's folder)."""
    if is_local(location):
        return str(local_path(location).resolve())
    return location




def check_output_folder(path: Path, shown: str, field: str = "output") -> None:
    """Refuse a local results folder nothing could write into, before the job runs:
    one inside ``/proc``, ``/sys`` or ``/dev``, an existing file, one under a file, one
    whose nearest existing folder is read-only, or one two levels below a folder that
    does not exist.  (The folder itself is created when results are copied.)"""
    allowed = "give a folder you can write (it is created if missing)"
    real = nearest_real(path)
    for system in ALWAYS_REFUSED:
        if is_within(real, system):
            raise ConfigError(f"{field}: {shown!r} is inside the system folder {system}, "
                              f"where no results can be written; {allowed}", field=field,
                              value=shown)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{field}: {shown!r} exists and is not a folder; {allowed}",
                          field=field, value=shown)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{field}: {shown!r} is under {str(existing)!r}, which is a file, "
                          f"not a folder; {allowed}", field=field, value=shown)
    if existing != path and existing not in (path.parent, path.parent.parent):
        raise ConfigError(f"{field}: the folder above {shown!r} does not exist; {allowed}",
                          field=field, value=shown)
    problem = write_problem(existing)
    if problem is not None:
        raise ConfigError(f"{field}: {shown!r} cannot be written: {str(existing)!r} "
                          f"{problem}; {allowed}", field=field, value=shown)


def write_problem(folder: Path) -> str | None:
    """Why nothing can be created in ``folder`` (tried: a temporary file made and removed
    again), or None.  Why not ``os.access``: it answers for the mode bits and the mount,
    but root passes every mode, and a full file system (no space, no inodes left) or a
    FUSE/network mount refusing this user pass it too; results then fail at stage-out."""
    import errno
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix=".cloudtik-write-check-", dir=folder)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return "is read-only for this session"
        return f"refuses new files ({e.strerror or e})"
    os.close(fd)
    try:
        os.unlink(name)
    except OSError:
        pass
    return None


def default_name(location: str) -> str:
    if is_local(location):
        return local_path(location).name
    path = urlparse(location).path if "://" in location else location.split(":", 1)[-1]
    name = Path(path.rstrip("/")).name
    return name or "input"


class LocalStager:
    """Plain local paths: nothing to download; results are copied into the folder."""

    def handles(self, location: str) -> bool:
        return is_local(location)

    def check(self, location: str, *, for_output: bool = False) -> None:
        path = local_path(location)
        if for_output:
            check_output_folder(path, location, "output")
            return
        if not path.exists():
            raise NotFoundError(f"inputs: {location!r} does not exist", field="inputs")

    def download(self, location: str, dest: Path, progress: Progress) -> Path:
        return local_path(location)

    def upload(self, src: Path, location: str, progress: Progress) -> None:
        target = local_path(location)
        dest = target / src.name
        try:
            target.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dest, dirs_exist_ok=True)
            else:
                shutil.copyfile(src, dest)
        except shutil.Error as e:  # copytree's: the files it could not copy
            first = e.args[0][0] if e.args and e.args[0] else None
            why = first[2] if isinstance(first, tuple) and len(first) == 3 else str(e)
            raise ProviderError(f"cannot write output {location!r}: {why}") from e
        except OSError as e:
            raise ProviderError(f"cannot write output {location!r}: "
                                f"{e.strerror or e}") from e
        progress(1.0, f"copied {src.name} to {target}")


class Stagers:
    """The stagers this session has; the first that handles a location wins."""

    def __init__(self, stagers: list[Stager] | None = None) -> None:
        self.stagers: list[Stager] = list(stagers) if stagers else [LocalStager()]

    def add(self, stager: Stager) -> None:
        self.stagers.insert(0, stager)

    def for_location(self, location: str) -> Stager | None:
        for s in self.stagers:
            if s.handles(location):
                return s
        return None
