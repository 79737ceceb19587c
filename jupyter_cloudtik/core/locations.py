"""Every location a user names, resolved in one place with the policy of where it runs.

A location is a local path (``data/in.csv``, ``/abs/x``, ``file:///abs/x``), a storage
path (``NAME:path``), a URL (``https://...``) or a path on an HPC system
(``BACKEND:/path``).  Job notebooks, inputs (also ``NAME=LOCATION``), outputs, fetch
destinations, storage transfers, mount paths: every feature and every face hands what the
user typed to :func:`resolve` with the :class:`LocationPolicy` of its context, and gets a
:class:`Resolved` back or a 4xx error naming the field.  No feature has a check of its own.

Policies:

* :class:`InProcess` — plain IPython or the CLI, no server: the user's own machine, local
  paths are unrestricted (only malformed ones are refused: NUL bytes, over-long names).
* :class:`ServerRoot` — a single-user Jupyter server: local paths stay inside its root
  folder (symlinks resolved; paths that do not exist yet through their nearest existing
  parent), hidden paths are refused like Jupyter's ContentsManager does unless
  ``allow_hidden``, the cloudtik state folder, Jupyter's runtime folder and ``/proc``,
  ``/sys``, ``/dev`` are refused always, and folders staged as inputs are bounded in size.
* :class:`NoLocal` — the hub sidekick: its disk is never a user's, every local path is
  refused; storages are checked against the catalogue's access lists for the caller
  (one "no storage named" for missing and not-yours) and read-only for writes.

This module imports nothing from Jupyter: the server and the hub build their policies
from their own settings.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlparse

from .errors import ConfigError, NotFoundError, PermissionDeniedError
from .paths import user_path

MAX_LOCATION = 4096   # characters of a whole location (PATH_MAX on Linux)
MAX_NAME = 255        # bytes of one path component (NAME_MAX on Linux)
ALWAYS_REFUSED = (Path("/proc"), Path("/sys"), Path("/dev"))

_NAMED = re.compile(r"^([A-Za-z0-9][\w.-]*):(.*)$", re.S)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass(frozen=True)
class Resolved:
    """What a location means here.

    ``kind`` is ``local`` (``path`` is absolute and checked), ``storage`` (``storage`` and
    ``path`` inside it), ``url`` or ``system`` (a path on an HPC backend's own system).
    ``text`` is what the rest of the code works with: the absolute path, ``NAME:path`` or
    the URL."""

    kind: str
    text: str
    given: str
    field: str
    path: str = ""
    storage: str | None = None

    @property
    def is_local(self) -> bool:
        return self.kind == "local"


class LocationPolicy(Protocol):
    """What a context lets its callers reach."""

    name: str

    def local(self, text: str, field: str, *, write: bool = False) -> Path:
        """The absolute, checked local path ``text`` means, or a 4xx naming ``field``."""

    def storage(self, name: str, field: str, *, write: bool = False) -> None:
        """Refuse (404 "no storage named", 403 read-only) what the caller may not use."""

    def check_tree(self, path: Path, field: str) -> int:
        """A folder about to be copied somewhere: refuse what must not leave; its size."""

    def relative(self, path: Path) -> str:
        """``path`` as the caller sees it (relative to their root where there is one)."""


# --- shared checks --------------------------------------------------------------------------

def check_text(text: object, field: str, *, what: str = "location") -> str:
    """Refuse what no context accepts: non-strings, empty, NUL or line breaks, names or
    paths longer than Linux allows (which would otherwise fail deep inside with OSError)."""
    if not isinstance(text, str) or not text:
        raise ConfigError(f"{field}: expected a {what} (a non-empty string), got {text!r}",
                          field=field)
    if "\x00" in text:
        raise ConfigError(f"{field}: {what} contains a NUL character", field=field)
    if "\n" in text or "\r" in text:
        raise ConfigError(f"{field}: {what} must be a single line", field=field)
    if len(text) > MAX_LOCATION:
        raise ConfigError(f"{field}: {what} is {len(text)} characters long; at most "
                          f"{MAX_LOCATION} are allowed", field=field)
    for part in text.split("/"):
        if len(part.encode("utf-8", "surrogateescape")) > MAX_NAME:
            raise ConfigError(f"{field}: a name in {_short(text)!r} is longer than "
                              f"{MAX_NAME} bytes", field=field)
    return text


def _short(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n] + "…"


def file_url_path(text: str, field: str) -> str:
    """``file:///abs/path`` → ``/abs/path`` (``file://localhost/...`` too; other hosts
    are not this machine and are refused)."""
    try:
        u = urlparse(text)
    except ValueError as e:  # "file://[x/": urllib's "Invalid IPv6 URL"
        raise ConfigError(f"{field}: {_short(text)!r} is not a valid file:// URL ({e}); "
                          "write file:///path", field=field, value=text) from None
    if u.netloc not in ("", "localhost"):
        raise ConfigError(f"{field}: {_short(text)!r} names host {u.netloc!r}; a file:// "
                          "location must be on this machine (file:///path)", field=field)
    path = unquote(u.path)
    check_text(path, field)
    return path


def nearest_real(path: Path) -> Path:
    """``path`` with symlinks resolved, also when it does not exist yet: its nearest
    existing ancestor is resolved and the rest appended (so a symlinked parent pointing
    outside is seen for what it is)."""
    path = Path(os.path.abspath(path))
    missing: list[str] = []
    cur = path
    while not cur.exists() and not cur.is_symlink() and cur != cur.parent:
        missing.append(cur.name)
        cur = cur.parent
    real = cur.resolve()
    for name in reversed(missing):
        real = real / name
    return real


def is_within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def contained(root: Path | str, text: str, field: str) -> Path:
    """``text`` (relative to ``root``, or absolute) as a real path inside ``root``; the
    rule mount paths and other trusted folders share with :class:`ServerRoot`."""
    check_text(text, field, what="path")
    real_root = Path(root).expanduser().resolve()
    p = Path(os.path.expanduser(text)) if text.startswith("~") else Path(text)
    real = nearest_real(p if p.is_absolute() else real_root / p)
    if not is_within(real, real_root):
        raise PermissionDeniedError(
            f"{field}: {_short(text)!r} is outside the folder {real_root}", field=field,
            value=text)
    return real


def _is_hidden_name(name: str) -> bool:
    return name.startswith(".") and name not in (".", "..")


def _has_hidden_flag(path: Path) -> bool:
    try:
        st = path.lstat()
    except OSError:
        return False
    return bool(getattr(st, "st_flags", 0) & getattr(stat, "UF_HIDDEN", 0))


# --- policies -------------------------------------------------------------------------------

class InProcess:
    """The user's own session (IPython, CLI): local paths as typed, ``~`` expanded,
    relative ones from ``base`` (the working folder); only malformed ones are refused."""

    name = "in-process"

    def __init__(self, base: Path | str | None = None) -> None:
        self.base = Path(base).expanduser() if base else None

    def local(self, text: str, field: str, *, write: bool = False) -> Path:
        if text.startswith("file://"):
            text = file_url_path(text, field)
        check_text(text, field)
        p = user_path(text, field)
        if not p.is_absolute():
            p = (self.base or Path.cwd()) / p
        return Path(os.path.normpath(p))

    def storage(self, name: str, field: str, *, write: bool = False) -> None:
        return None

    def check_tree(self, path: Path, field: str) -> int:
        return 0

    def relative(self, path: Path) -> str:
        return str(path)


class ServerRoot:
    """A single-user server: everything local stays in its root folder."""

    name = "server"

    def __init__(self, root: Path | str, *, allow_hidden: bool = False,
                 refused: Iterable[tuple[Path | str, str]] = (),
                 max_stage_bytes: int = 1 << 30) -> None:
        self.root = Path(root).expanduser().resolve()
        self.allow_hidden = allow_hidden
        self.max_stage_bytes = max_stage_bytes
        # (real folder, what it is): refused even when the root contains them
        self.refused: list[tuple[Path, str]] = [
            (nearest_real(Path(p).expanduser()), what) for p, what in refused]
        self.refused += [(p, f"the system folder {p}") for p in ALWAYS_REFUSED]

    def _refusal(self, real: Path) -> str | None:
        for folder, what in self.refused:
            if is_within(real, folder):
                return what
        return None

    def local(self, text: str, field: str, *, write: bool = False) -> Path:
        given = text
        if text.startswith("file://"):
            text = file_url_path(text, field)
        check_text(text, field)
        if text.startswith("~"):
            raise ConfigError(
                f"{field}: {_short(given)!r} — '~' is not expanded here; paths are relative "
                "to the server's root folder (as in the file browser)", field=field,
                value=given)
        parts = text.split("/")
        if ".." in parts:
            raise PermissionDeniedError(
                f"{field}: {_short(given)!r} contains '..'; paths are relative to the "
                "server's root folder and stay inside it", field=field, value=given)
        p = Path(text)
        real = nearest_real(p if p.is_absolute() else self.root / p)
        what = self._refusal(real)
        if what is not None:
            raise PermissionDeniedError(f"{field}: {_short(given)!r} is inside {what}, "
                                        "which is never reachable through this server",
                                        field=field, value=given)
        if not is_within(real, self.root):
            raise PermissionDeniedError(
                f"{field}: {_short(given)!r} is outside the server's root folder; give a "
                "path inside it (relative paths start there)", field=field, value=given)
        if not self.allow_hidden:
            rel = real.relative_to(self.root)
            cur = self.root
            for name in rel.parts:
                cur = cur / name
                if _is_hidden_name(name) or _has_hidden_flag(cur):
                    raise PermissionDeniedError(
                        f"{field}: {_short(given)!r} is a hidden path ({name}); hidden files "
                        "are not reachable through this server "
                        "(c.ContentsManager.allow_hidden)", field=field, value=given)
        return real

    def storage(self, name: str, field: str, *, write: bool = False) -> None:
        return None  # the server's storages are its user's own

    def check_tree(self, path: Path, field: str) -> int:
        """Walk a folder input: every entry must be reachable itself (no symlink out of
        the root, nothing hidden or refused inside), and the total stays under
        ``max_stage_bytes``."""
        total = 0
        if not path.is_dir():
            try:
                return path.stat().st_size
            except OSError:
                return 0
        for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
            here = Path(dirpath)
            for name in [*dirnames, *filenames]:
                entry = here / name
                shown = entry.relative_to(path.parent).as_posix()
                if not self.allow_hidden and (_is_hidden_name(name) or
                                              _has_hidden_flag(entry)):
                    raise PermissionDeniedError(
                        f"{field}: folder {path.name!r} holds the hidden entry {shown!r}; "
                        "hidden files are not reachable through this server "
                        "(c.ContentsManager.allow_hidden)", field=field)
                real = entry.resolve() if entry.is_symlink() else entry
                what = self._refusal(real)
                if what is not None or not is_within(real, self.root):
                    raise PermissionDeniedError(
                        f"{field}: {shown!r} in folder {path.name!r} leads outside the "
                        "server's root folder (a symlink?)", field=field)
                if entry.is_symlink() and real.is_dir():
                    total += self.check_tree(real, field)
                elif name in filenames:
                    try:
                        total += real.stat().st_size
                    except OSError:
                        pass
                if total > self.max_stage_bytes:
                    raise ConfigError(
                        f"{field}: folder {path.name!r} is larger than "
                        f"{self.max_stage_bytes} bytes, the most this server stages as one "
                        "input (c.CloudTikServer.max_stage_bytes); put it in a storage and "
                        "name it as STORAGE:path", field=field)
        return total

    def relative(self, path: Path) -> str:
        try:
            return nearest_real(path).relative_to(self.root).as_posix()
        except ValueError:
            return str(path)


class NoLocal:
    """The hub sidekick: its disk is not the users'; storages by the catalogue."""

    name = "hub"

    def __init__(self, storage_check: Callable[[str, str, bool], None]) -> None:
        self._storage_check = storage_check
        # BACKEND:/path is a file of the account the hub submits with, shared by all
        self.allow_system_paths = False

    def local(self, text: str, field: str, *, write: bool = False) -> Path:
        check_text(text, field)
        raise PermissionDeniedError(
            f"{field}: {_short(text)!r} is a local path, and through the hub the sidekick's "
            "disk is not yours: name a storage (NAME:path), a URL, or submit from your "
            "own server, which sends the file along", field=field, value=text)

    def storage(self, name: str, field: str, *, write: bool = False) -> None:
        self._storage_check(name, field, write)

    def check_tree(self, path: Path, field: str) -> int:
        return 0

    def relative(self, path: Path) -> str:
        return path.name


# --- the resolver ---------------------------------------------------------------------------

def resolve(text: object, field: str, policy: LocationPolicy, *, write: bool = False,
            is_storage: Callable[[str], bool] = lambda name: False,
            backends: Iterable[str] = (),
            missing: Callable[[str, str], None] | None = None) -> Resolved:
    """What ``text`` names, checked by ``policy``; a 4xx naming ``field`` otherwise.

    ``is_storage`` says whether a ``NAME`` of ``NAME:path`` is a storage known here;
    ``backends`` are HPC backend names (``BACKEND:/path`` is a path on that system);
    ``missing(name, field)`` raises the context's own "no storage named" (e.g. listing
    the names it knows) when ``NAME:`` is neither a storage nor a local file."""
    given = check_text(text, field)
    if given.startswith("file://"):
        path = policy.local(given, field, write=write)
        return Resolved("local", str(path), given, field, path=str(path))
    m = _SCHEME.match(given)
    if m:
        return Resolved("url", given, given, field, path=given)
    named = _NAMED.match(given)
    if named:
        head, rest = named.group(1), named.group(2)
        if head in set(backends) and rest.startswith("/"):
            if not getattr(policy, "allow_system_paths", True):
                raise PermissionDeniedError(
                    f"{field}: {_short(given)!r} is a path on HPC system {head!r}, under "
                    "the account the hub submits with (shared by every user); name a "
                    "storage (NAME:path) instead", field=field, value=given)
            return Resolved("system", given, given, field, path=rest)
        known = is_storage(head)
        if known or isinstance(policy, NoLocal):
            policy.storage(head, field, write=write)
            if not known:
                raise NotFoundError(f"{field}: no storage named {head!r}", field=field,
                                    value=head)
            return Resolved("storage", f"{head}:{rest}", given, field, path=rest,
                            storage=head)
        # an unknown NAME: a local file of that name, or a storage nobody has
        candidate = policy.local(given, field, write=write)
        if not candidate.exists():
            if missing is not None:
                missing(head, field)
            raise NotFoundError(f"{field}: no storage named {head!r} (and no local file "
                                f"{_short(given)!r})", field=field, value=head)
        return Resolved("local", str(candidate), given, field, path=str(candidate))
    path = policy.local(given, field, write=write)
    return Resolved("local", str(path), given, field, path=str(path))


def split_named(item: str) -> tuple[str | None, str]:
    """``NAME=LOCATION`` renames an input in the job's folder; plain LOCATION keeps its
    name.  A NAME is one plain file name."""
    if "=" in item:
        name, rest = item.split("=", 1)
        if name and "/" not in name and ":" not in name:
            return name, rest
    return None, item


def check_file_name(name: object, field: str) -> str:
    """A name inside a job's folder (``sub/file.txt``): relative, no ``..``, no NUL."""
    check_text(name, field, what="file name")
    assert isinstance(name, str)
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ConfigError(f"{field}: {_short(name)!r} is not a plain relative name inside "
                          "the job's folder (no leading '/', no '.' or '..')", field=field,
                          value=name)
    return name
