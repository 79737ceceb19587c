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

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from ..core.errors import ConfigError, NotFoundError
from ..core.locations import split_named  # noqa: F401  (re-exported: one rule)
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
            parent = path if path.exists() else path.parent
            if path.exists() and not path.is_dir():
                raise ConfigError(f"output: {location!r} exists and is not a folder",
                                  field="output")
            if not parent.exists() and not parent.parent.exists():
                raise ConfigError(f"output: the folder above {location!r} does not exist",
                                  field="output")
            return
        if not path.exists():
            raise NotFoundError(f"inputs: {location!r} does not exist", field="inputs")

    def download(self, location: str, dest: Path, progress: Progress) -> Path:
        return local_path(location)

    def upload(self, src: Path, location: str, progress: Progress) -> None:
        target = local_path(location)
        target.mkdir(parents=True, exist_ok=True)
        dest = target / src.name
        if src.is_dir():
            shutil.copytree(src, dest, dirs_exist_ok=True)
        else:
            shutil.copyfile(src, dest)
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
