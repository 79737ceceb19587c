"""A requirements or lock file as a job's environment (pip's text format).

Why a module of its own: the same text reaches a job two ways.  A file named by the
Python API (``Job.submit(requirements="reqs.txt")``), the magic (``--requirements``) or
a backend's config is read where the job is submitted, and its wheel lines are files
there.  Its contents in a REST body (``requirements``) come from another process: a line
naming a file or a folder would be the sender's path, read on the server's machine (on a
hub, the sidekick's), and a direct reference (``NAME @ URL``) something ``pip wheel``
would fetch and build there, so such lines are refused, as are pip's options (``-r``,
``--index-url``, ``-e``: other files and other indexes).

A lock file (``pip-compile --generate-hashes``, ``uv export``, ``pip freeze``) pins every
package, often with ``--hash``: the wheels the session makes for the job are checked
against those hashes (``check_hashes``), so the job runs with exactly the files the lock
names or is refused at submit, as ``pip install --require-hashes`` would refuse it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import ConfigError

#: at most this many lines in one requirements text (a lock of a large environment has
#: a few hundred packages, each with some hash lines)
MAX_LINES = 20000
_HASH = re.compile(r"(?:^|\s)--hash(?:=|\s+)(\S+)")
_OPTION = re.compile(r"(?:^|\s)(--?[A-Za-z][\w-]*)")
_COMMENT = re.compile(r"(?:^|\s)#.*$")
#: names that are file names, not packages: a path sent where the contents belong
_FILE_SUFFIXES = (".txt", ".in", ".lock", ".toml", ".cfg")


@dataclass(frozen=True)
class Line:
    """One requirement of the text: its line number (the first, for a continued line),
    the requirement or (from a file only) a wheel's absolute path, and its hashes."""

    number: int
    entry: str
    hashes: tuple[str, ...] = ()

    @property
    def wheel(self) -> bool:
        return self.entry.endswith(".whl")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    start, parts = 0, []
    for i, raw in enumerate(text.splitlines(), 1):
        if not parts:
            start = i
        if raw.endswith("\\"):
            parts.append(raw[:-1])
            continue
        parts.append(raw)
        out.append((start, " ".join(parts)))
        parts = []
    if parts:
        out.append((start, " ".join(parts)))
    return out


def parse(text: str, field: str, base: Path | None = None,
          label: str | None = None) -> list[Line]:
    """The requirements of ``text``; ``base``: the folder of the file it was read from
    (its wheel lines are files there), None for text sent by another process (no file
    lines at all).  Raises a ConfigError in one line naming ``field`` (or ``label``,
    e.g. the field with the file's name), the line and what is allowed."""
    from packaging.requirements import InvalidRequirement, Requirement

    label = label or field
    if not isinstance(text, str):
        raise ConfigError(f"{label}: {type(text).__name__} is not allowed; send the text "
                          "of a requirements or lock file", field=field)
    lines = _logical_lines(text)
    if len(lines) > MAX_LINES:
        raise ConfigError(f"{label}: {len(lines)} lines is more than {MAX_LINES}",
                          field=field)
    out: list[Line] = []
    for number, line in lines:
        line = _COMMENT.sub("", line)
        hashes = tuple(_HASH.findall(line))
        rest = _HASH.sub(" ", line).strip()
        where = f"{label} line {number}"
        for h in hashes:
            algo, _, digest = h.partition(":")
            if algo not in hashlib.algorithms_guaranteed or not re.fullmatch(
                    r"[0-9a-fA-F]+", digest or ""):
                raise ConfigError(f"{where}: --hash={h} is not ALGORITHM:HEX "
                                  "(e.g. sha256:...)", field=field, value=h)
        if not rest:
            if hashes:
                raise ConfigError(f"{where}: --hash without a requirement", field=field)
            continue
        option = _OPTION.search(rest)
        if option:
            raise ConfigError(
                f"{where}: {option.group(1)!r} is a pip option; a job's requirements are "
                "requirement lines (name==version) with --hash only (no other files, "
                "indexes or editable installs)", field=field, value=rest)
        if rest.endswith(".whl") or rest.startswith((".", "/", "~", "file:")):
            if base is None:
                raise ConfigError(
                    f"{where}: {rest!r} is a file or folder of the side that sent it, which "
                    "is never read here; send requirements (name==version) of packages "
                    "installed in the session", field=field, value=rest)
            if rest.endswith(".whl") and not rest.startswith(("/", "file:")):
                rest = str((base / Path(rest).expanduser()).resolve())
            out.append(Line(number, rest, hashes))
            continue
        try:
            req = Requirement(rest)
        except InvalidRequirement as e:
            first = str(e).splitlines()[0] if str(e) else "unreadable"
            raise ConfigError(f"{where}: {rest!r} is not a requirement ({first}); use e.g. "
                              "'toolz==1.0.0'", field=field, value=rest) from None
        if req.url is not None and base is None:
            raise ConfigError(
                f"{where}: {rest!r} is a direct reference (NAME @ URL), which pip would "
                "fetch and build on the server's side; give name==version of a package "
                "installed in the session", field=field, value=rest)
        if base is None and req.name.lower().endswith(_FILE_SUFFIXES) and \
                not req.specifier and len(lines) == 1:
            raise ConfigError(
                f"{where}: {rest!r} is a file name; send the file's contents (its lines), "
                "not its name", field=field, value=rest)
        out.append(Line(number, rest, hashes))
    return out


def read(path: str, field: str) -> list[Line]:
    """The requirements of the file at ``path`` (its wheel lines relative to it)."""
    p = Path(path).expanduser()
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or "not text"
        raise ConfigError(f"{field}: cannot read {path!r} ({why})", field=field,
                          value=path) from None
    return parse(text, field, p.parent)


def name_of(entry: str) -> str:
    from packaging.requirements import Requirement

    return Requirement(entry).name.lower().replace("_", "-").replace(".", "-")


def check_hashes(lines: list[Line], wheels: list[Path], field: str) -> None:
    """Every wheel of a package whose line has hashes must match one of them (the job
    runs with exactly the lock's files); refused in one line naming the line."""
    # deferred: start-up (runtime.environment ~23 ms, loads importlib.metadata, subprocess)
    from ..runtime import environment as rtenv

    wanted = {name_of(ln.entry): ln for ln in lines if ln.hashes and not ln.wheel}
    if not wanted:
        return
    for w in wheels:
        name, version = rtenv.wheel_name_version(w)
        ln = wanted.get(name)
        if ln is None:
            continue
        algos = {h.split(":", 1)[0] for h in ln.hashes}
        got = {f"{a}:{hashlib.new(a, w.read_bytes()).hexdigest()}" for a in algos}
        if not got & {h.lower() for h in ln.hashes}:
            sha = next(iter(sorted(got)))
            raise ConfigError(
                f"{field} line {ln.number}: the session's {name} {version} is the wheel "
                f"{w.name} ({sha[:19]}...), which matches none of the line's hashes; "
                "install the locked file in the session or lock what it has",
                field=field, value=ln.entry)
