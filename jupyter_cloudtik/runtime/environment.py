"""The client's environment, as nodes must replicate it.

Why: a task is a cloudpickled function; a node with another Python minor version or
other dask/distributed/cloudpickle/msgpack versions fails on it, often obscurely (or
worse, silently computes with other code).  So a node checks at boot that it has exactly
these versions and, on a stock image, installs them from wheels the client staged once in
the workspace's bucket (``stage``): the client's own wheels, the same files, no index
needed on the node.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigError

if TYPE_CHECKING:
    from ..core.grants import BuildPermit

#: what a node must match exactly (besides Python major.minor)
CHECKED = ("dask", "distributed", "cloudpickle", "msgpack")


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def expected(extra: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """{"python": "3.11", "packages": {name: version}} of this interpreter."""
    pkgs = {n: md.version(n) for n in CHECKED}
    for n in extra:
        pkgs[_norm(n)] = md.version(n)
    return {"python": "{}.{}".format(*sys.version_info[:2]), "packages": pkgs}


def closure(names: list[str] | tuple[str, ...]) -> dict[str, str]:
    """{distribution: installed version} of ``names`` and everything they require here."""
    from packaging.requirements import Requirement

    seen: dict[str, str] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = _norm(name)
        if key in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen[key] = dist.version
        for r in dist.requires or []:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def download_wheels(pins: dict[str, str], dest: Path) -> list[Path]:
    """The wheels of exactly these versions for this interpreter, in ``dest`` (a cache:
    what is there already is not fetched again)."""
    dest.mkdir(parents=True, exist_ok=True)

    def have(name: str, version: str) -> Path | None:
        stem = f"{name.replace('-', '_')}-{version}-"
        for p in dest.glob("*.whl"):
            if p.name.lower().startswith(stem.lower()):
                return p
        return None

    missing = [f"{n}=={v}" for n, v in sorted(pins.items()) if have(n, v) is None]
    if missing:
        p = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                            "--only-binary=:all:", "-d", str(dest), *missing],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            tail = "\n".join(line for line in p.stderr.splitlines()
                             if not line.startswith("WARNING: Location"))[-1500:]
            raise RuntimeError(f"pip download {' '.join(missing)} failed: {tail}")
    out = []
    for n, v in sorted(pins.items()):
        w = have(n, v)
        if w is None:
            raise RuntimeError(f"no wheel of {n}=={v} for this platform")
        out.append(w)
    return out


#: ``platform.machine()`` of a Linux node -> the wheel platform tag's architecture suffix
LINUX_MACHINES = ("x86_64", "aarch64")


def wheel_platform_problem(filename: str, machine: str) -> str | None:
    """Why a wheel (by its PEP 427 file name) does not install on a glibc Linux node of
    ``machine`` (``x86_64``, ``aarch64``), or None.

    Why here: pip on the client makes wheels for the client's own platform, so a macOS or
    Windows client (or an x86 client of Kunpeng nodes) stages binary wheels every node
    would refuse at boot, after its server is made and billed.  Fits: ``any``, and
    ``manylinux*``/``linux`` tags of that architecture (not ``musllinux``: Ubuntu and
    Debian are glibc)."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as e:
        return f"{filename} is not a wheel file name ({e})"
    plats = sorted({t.platform for t in tags})
    for plat in plats:
        if plat == "any":
            return None
        if plat.startswith(("manylinux", "linux_")) and plat.endswith("_" + machine):
            return None
    return f"the wheel {filename} is for {'.'.join(plats)}, the nodes are Linux {machine}"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- packages the user asks for: ``runtime: {pip: [...], sync_env: true}`` ----------------
#
# Why on the client: the nodes may have no index to reach (a private subnet, no PyPI
# through the NAT gateway) and packages installed here from a local folder exist nowhere
# else.  So the client makes every wheel (its pip cache, ``pip download``, or ``pip wheel``
# of a local folder), stages them in the workspace bucket, and the nodes install exactly
# those files (with pip if the image has it, else by unpacking them).

#: never synced: the installer's own tools (the node brings its own or needs none)
NOT_SYNCED = frozenset({"pip", "setuptools", "wheel", "distribute"})


def is_local(entry: str) -> bool:
    """A ``runtime.pip`` entry that names a folder on this machine, not a requirement."""
    return entry.startswith((".", "/", "~", "file:"))


def check_pip_entries(entries: Any, field: str = "runtime.pip") -> None:
    """Each entry is a requirement (``six``, ``toolz==0.12.1``, ``attrs>=23``) or a local
    folder with a Python project; raise a ConfigError naming the first bad one."""
    from packaging.requirements import InvalidRequirement, Requirement

    for i, e in enumerate(entries or []):
        if not isinstance(e, str) or not e.strip():
            raise ConfigError(f"{field}.{i}: {e!r} is not a requirement; use e.g. 'six' or "
                              "'toolz==0.12.1', or a local project folder './mypkg'",
                              field=f"{field}.{i}", value=e)
        if is_local(e):
            folder = Path(e.removeprefix("file://")).expanduser()
            if not ((folder / "pyproject.toml").is_file() or (folder / "setup.py").is_file()):
                raise ConfigError(f"{field}.{i}: {e!r} is not a folder with a Python project "
                                  "(no pyproject.toml or setup.py there)",
                                  field=f"{field}.{i}", value=e)
            continue
        try:
            Requirement(e)
        except InvalidRequirement as err:
            raise ConfigError(f"{field}.{i}: {e!r} is not a requirement ({err}); use e.g. "
                              "'six' or 'toolz==0.12.1'", field=f"{field}.{i}",
                              value=e) from None


def _local_source(dist: md.Distribution) -> str | None:
    """The folder a distribution was installed from (``pip install ./x``, ``-e``), if any
    (PEP 610's direct_url.json)."""
    import json

    text = dist.read_text("direct_url.json")
    if not text:
        return None
    try:
        url = json.loads(text).get("url", "")
    except ValueError:
        return None
    if not url.startswith("file://"):
        return None
    from urllib.parse import unquote, urlsplit

    path = Path(unquote(urlsplit(url).path))
    return str(path) if path.is_dir() else None


def installed_here(path: list[str] | None = None) -> tuple[dict[str, str], list[str]]:
    """({name: version} of every distribution installed from an index, [folders of those
    installed from local folders]) of this interpreter (or of ``path``): what
    ``sync_env`` replicates, as Coiled's package sync does."""
    pins: dict[str, str] = {}
    local: list[str] = []
    for dist in md.distributions(**({"path": path} if path is not None else {})):
        name = dist.metadata["Name"]
        if not name or _norm(name) in NOT_SYNCED or _norm(name) in pins:
            continue
        src = _local_source(dist)
        if src is not None:
            local.append(src)
        else:
            pins[_norm(name)] = dist.version
    return pins, sorted(set(local))


def _writable_by_others(folder: Path) -> str | None:
    """Why someone other than this process's account or root could change what building
    ``folder`` runs (the folder, its parent, or anything at its top level: the build files
    and the hooks they name), or None.  Fails closed: what cannot be read counts as
    changeable."""
    me = os.geteuid()
    try:
        entries = [folder.parent, folder, *folder.iterdir()]
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    for entry in entries:
        try:
            st = entry.lstat()
        except OSError as e:
            return f"has {entry.name!r} that cannot be read ({e.strerror})"
        if st.st_uid not in (0, me):
            return f"has {entry.name or str(entry)!r} owned by uid {st.st_uid}"
        if stat.S_ISLNK(st.st_mode):
            continue
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            if entry == folder.parent and st.st_mode & stat.S_ISVTX:
                continue  # a sticky shared parent (/tmp): others cannot replace the folder
            return f"has {entry.name or str(entry)!r} writable by its group or others"
    return None


def wheel_name_version(path: Path) -> tuple[str, str]:
    """(normalised name, version) from a wheel's file name (PEP 427)."""
    name, version = path.name.split("-")[:2]
    return _norm(name), version


def _pip(args: list[str], what: str, timeout: float = 900) -> None:
    p = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        tail = "\n".join(line for line in (p.stderr or p.stdout).splitlines()
                         if not line.startswith("WARNING: Location"))[-1500:]
        raise RuntimeError(f"{what} failed: {tail.strip()}")


def wheels_for(pins: dict[str, str], dest: Path) -> list[Path]:
    """Wheels of exactly these versions: binary wheels from the pip cache or the index
    (``download_wheels``, one pip run); a package with none (pip names it) is built
    (``pip wheel``, from its sdist) and the rest asked for again."""
    import re

    todo = dict(pins)
    built: list[Path] = []
    while todo:
        try:
            return sorted({w.name: w for w in [*download_wheels(todo, dest), *built]}.values())
        except RuntimeError as e:
            m = re.search(r"No matching distribution found for ([A-Za-z0-9_.\-]+)==", str(e))
            name = _norm(m.group(1)) if m else None
            if name not in todo:
                raise
        version = todo.pop(name)
        _pip(["wheel", "--quiet", "--no-deps", "-w", str(dest), f"{name}=={version}"],
             f"making a wheel of {name}=={version}")
        built += download_wheels({name: version}, dest)
    return sorted(built)


def collect(pip: list[str] | None, sync_env: bool, cache: Path,
            base: dict[str, str], *,
            permit: BuildPermit | None) -> tuple[list[Path], dict[str, str]]:
    """Every wheel the nodes need beyond the ``base`` pins, and {name: version} of the
    packages a node must then have.

    ``pip`` entries installed here are pinned to the version installed here (with what
    they require, as installed here); others are resolved by ``pip wheel`` on this machine
    under the base pins as constraints; local folders are built into wheels
    (``--ignore-requires-python``: the node's Python decides, at boot, and says so).
    ``sync_env`` adds every installed distribution.  Raises RuntimeError naming the
    package that could not be had.

    Building runs the built project's code in this process, so it needs ``permit`` (the
    state folder's policy decides: ``Policy.build_permit``).  Without one — a service
    many users share — a folder or a direct reference (``NAME @ URL``) is refused before
    anything is fetched, and requirements not installed here come as binary wheels only
    (``--only-binary=:all:``: no source distribution is built).  What is installed here
    already (its exact version, from the index) was the admin's choice and is built as
    before."""
    import shutil
    import tempfile

    from packaging.requirements import Requirement

    builds = permit is not None and permit.sealed()
    pins: dict[str, str] = {}
    resolve: list[str] = []
    local: list[str] = []
    if sync_env:
        synced, local = installed_here()
        pins.update(synced)
        if not builds:
            # the admin installed these from folders: built only when nobody else could
            # have changed what building runs
            for folder in local:
                if (why := _writable_by_others(Path(folder))) is not None:
                    raise ConfigError(
                        f"runtime.sync_env: {folder!r} is installed here from a folder "
                        f"that {why}; a service many users share builds such a folder "
                        "only when no one but its own account (or root) can change it "
                        "(its setup code runs beside every user's secrets): install the "
                        "package from an index, or make the folder the service's own",
                        field="runtime.sync_env", value=folder)
    for i, entry in enumerate(pip or []):
        if is_local(entry):
            if not builds:
                raise ConfigError(
                    f"runtime.pip.{i}: {entry!r} is a folder; a service many users share "
                    "builds no folder (its setup code would run here, beside every user's "
                    "secrets): give requirements from the package index",
                    field=f"runtime.pip.{i}", value=entry)
            local.append(str(Path(entry.removeprefix("file://")).expanduser().resolve()))
            continue
        req = Requirement(entry)
        if req.url and not builds:
            raise ConfigError(
                f"runtime.pip.{i}: {entry!r} is a direct reference (NAME @ URL); a service "
                "many users share fetches and builds none (its setup code would run here): "
                "give a requirement from the package index", field=f"runtime.pip.{i}",
                value=entry)
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            have = None
        if have is not None and req.specifier.contains(have, prereleases=True):
            pins.update(closure([req.name]))
        else:
            resolve.append(entry)
    for n in base:
        pins.pop(n, None)
    wheels = wheels_for(pins, cache) if pins else []
    if resolve:
        with tempfile.TemporaryDirectory() as tmp:
            cons = Path(tmp) / "constraints.txt"
            cons.write_text("".join(f"{n}=={v}\n" for n, v in sorted({**base, **pins}.items())))
            out = Path(tmp) / "wheels"
            binary = [] if builds else ["--only-binary=:all:"]
            _pip(["wheel", "--quiet", *binary, "-w", str(out), "-c", str(cons), *resolve],
                 f"pip wheel {' '.join(resolve)}"
                 + ("" if builds else " (binary wheels only: a shared service builds no "
                                      "source distribution)"))
            for w in out.glob("*.whl"):
                n, v = wheel_name_version(w)
                if base.get(n) == v:
                    continue
                target = cache / w.name
                if not target.exists():
                    shutil.copy2(w, target)
                wheels.append(target)
                pins[n] = v
    if local:
        built = cache / "local"  # rebuilt every time: the folder may have changed
        shutil.rmtree(built, ignore_errors=True)
        built.mkdir(parents=True)
        for folder in local:
            before = set(built.glob("*.whl"))
            _pip(["wheel", "--quiet", "--no-deps", "--ignore-requires-python", "-w",
                  str(built), folder], f"building a wheel of {folder}")
            for w in set(built.glob("*.whl")) - before:
                n, v = wheel_name_version(w)
                wheels.append(w)
                pins[n] = v
    unique = {w.name: w for w in wheels}
    return sorted(unique.values()), pins


def check_packages(cfg: dict[str, Any], provider_cls: type) -> None:
    """Refuse ``runtime.pip`` / ``runtime.sync_env`` early when the provider cannot honour
    them.  ``installs_packages`` on a provider class: True (stages wheels for its nodes),
    "shared" (its nodes run this very Python: the packages must be installed here), absent
    (it cannot)."""
    from packaging.requirements import Requirement

    rt = cfg.get("runtime") or {}
    pip, sync = list(rt.get("pip") or []), bool(rt.get("sync_env"))
    if not pip and not sync:
        return
    check_pip_entries(pip)
    how = getattr(provider_cls, "installs_packages", False)
    ptype = cfg["provider"]["type"]
    if how is True:
        return
    if how == "shared":
        for i, e in enumerate(pip):
            if is_local(e):
                raise ConfigError(f"runtime.pip.{i}: {e!r}: {ptype} nodes run this machine's "
                                  "Python; install the folder here (pip install -e) instead",
                                  field=f"runtime.pip.{i}", value=e)
            req = Requirement(e)
            try:
                have = md.version(req.name)
            except md.PackageNotFoundError:
                have = None
            if have is None or not req.specifier.contains(have, prereleases=True):
                raise ConfigError(
                    f"runtime.pip.{i}: {e!r} is not installed here ({req.name} "
                    f"{have or 'missing'}); {ptype} nodes run this machine's Python, so "
                    "install it here first", field=f"runtime.pip.{i}", value=e)
        return
    field = "runtime.pip" if pip else "runtime.sync_env"
    raise ConfigError(f"{field}: the {ptype} provider cannot install packages on its nodes; "
                      "use an image or environment that has them, or setup_commands",
                      field=field, value=ptype)
