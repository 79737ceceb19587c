"""The session's environment, built once on an HPC system and reused by every job.

Why: on a real site the job's account cannot read the session's virtualenv and the
system's Python has none of the notebook's packages.  So, as cloud nodes do
(``runtime/environment.py``, ``sync_env``), the session pins the exact versions it has,
makes their wheels (its pip cache, the index, or ``pip wheel`` of a local folder), and
stages them once per system in the backend's work folder; the first job that needs the
environment builds a venv from exactly those files with the system's own Python, offline
(``pip install --no-index --no-deps``: the system needs no index), under a lock so that
concurrent jobs build it once.  Later jobs with the same lock hash just activate it.

Layout on the system (``<workdir>/.cloudtik-envs``)::

    wheels/<file>.whl      every wheel staged, shared by all environments
    <hash>.txt             the lock: absolute paths of that environment's wheels
    <hash>.sh              builds <hash>/ under <hash>.lock unless it is complete
    <hash>/                the venv; .cloudtik-complete when built, .cloudtik-used touched
                           by every job (the garbage collector's clock)

Everything a system cannot run is refused at submit, in one line naming the package and
why (a wheel for another platform, a ``Requires-Python`` the system's Python does not
meet, no Python of the session's major.minor), never after the job queued.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import shlex
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError, ProviderError
from ..core.grants import policy_for
from ..runtime import environment as rtenv
from . import env_requirements as reqs

log = logging.getLogger(__name__)

ENVS_DIR = ".cloudtik-envs"
COMPLETE = ".cloudtik-complete"
USED = ".cloudtik-used"
#: the container runtimes a job's ``environment.container_runtime`` may name (script.py,
#: ``container_run``: how each runs the image)
CONTAINER_RUNTIMES = ("apptainer", "singularity", "podman")
#: what every job needs to run a notebook, always part of the environment
RUNNER = ("papermill", "ipykernel")
#: unused environments older than this are removed (``environment.keep_days``)
KEEP_DAYS = 30.0
#: how long a system's Python, once asked, is taken as known
PROBE_TTL = 600.0
GC_INTERVAL = 3600.0

PROBE = r"""
import json, platform, sys, sysconfig
print(json.dumps({"executable": sys.executable, "version": list(sys.version_info[:3]),
                  "implementation": sys.implementation.name,
                  "abiflags": getattr(sys, "abiflags", ""), "machine": platform.machine(),
                  "libc": list(platform.libc_ver()), "platform": sysconfig.get_platform()}))
"""

#: the modes a job's environment can have (recorded in the job's plan, ``build.mode``)
BUILT, SESSION_INTERPRETER, NAMED, SYSTEM, CONTAINER = (
    "built", "session-interpreter", "named", "system", "container")


def session_python() -> str:
    return "{}.{}".format(*sys.version_info[:2])


# --- the system's Python ------------------------------------------------------------------

@dataclass
class SystemPython:
    """What the system's Python told us (``PROBE``)."""

    executable: str
    version: tuple[int, int, int]
    implementation: str
    abiflags: str
    machine: str
    libc: tuple[str, str]
    platform: str

    @property
    def minor(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    def describe(self) -> str:
        libc = f" {self.libc[0]} {self.libc[1]}" if self.libc[0] else ""
        return f"Python {'.'.join(map(str, self.version))} on {self.platform}{libc}"

    def platform_tags(self) -> list[str]:
        """The platform tags a wheel may have to install here (PEP 600 manylinux,
        PEP 656 musllinux, the legacy aliases, the plain platform)."""
        arch = self.machine
        plain = self.platform.replace("-", "_").replace(".", "_")
        out: list[str] = []
        lib, ver = self.libc
        m = re.match(r"(\d+)\.(\d+)", ver or "")
        if plain.startswith("linux") and lib == "glibc" and m:
            major, minor = int(m.group(1)), int(m.group(2))
            for mi in range(minor, -1, -1):
                out.append(f"manylinux_{major}_{mi}_{arch}")
                legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}.get(mi)
                if major == 2 and legacy:
                    out.append(f"{legacy}_{arch}")
        elif plain.startswith("linux") and m:  # musl
            major, minor = int(m.group(1)), int(m.group(2))
            out += [f"musllinux_{major}_{mi}_{arch}" for mi in range(minor, -1, -1)]
        out.append(plain)
        return out

    def tags(self) -> set[Any]:
        from packaging import tags

        pv = (self.version[0], self.version[1])
        plats = self.platform_tags()
        if self.implementation == "cpython":
            abi = f"cp{pv[0]}{pv[1]}{self.abiflags}"
            found = set(tags.cpython_tags(python_version=pv, abis=[abi], platforms=plats))
            interp = f"cp{pv[0]}{pv[1]}"
        else:
            found = set()
            interp = f"pp{pv[0]}{pv[1]}"
        found |= set(tags.compatible_tags(python_version=pv, interpreter=interp,
                                          platforms=plats))
        return found


def parse_probe(text: str) -> SystemPython:
    d = json.loads(text)
    return SystemPython(d["executable"], tuple(d["version"]), d["implementation"],
                        d.get("abiflags", ""), d["machine"], tuple(d["libc"]), d["platform"])


def find_python(shell, backend: str, setup: list[str], named: str | None) -> SystemPython:
    """The system's Python of the session's major.minor: ``named`` (``base_python``) or
    ``python3.X`` / ``python3`` on the system's PATH after the ``setup`` lines (``module
    load``).  Raises a ConfigError in one line when there is none."""
    want = session_python()
    candidates = [named] if named else [f"python{want}", "python3"]
    loop = ('for p in "$@"; do if command -v "$p" >/dev/null 2>&1; then '
            '"$p" -c "$CT_PROBE" 2>/dev/null || echo "{\\"broken\\": \\"$p\\"}"; '
            'else echo "{\\"missing\\": \\"$p\\"}"; fi; done')
    text = "\n".join([*setup, f"CT_PROBE={shlex.quote(PROBE)}", loop])
    r = shell.run(["bash", "-c", text, "probe", *candidates], timeout=60)
    found: list[SystemPython] = []
    for line in r.stdout.splitlines():
        line = line.strip()
        if line.startswith("{") and '"executable"' in line:
            try:
                found.append(parse_probe(line))
            except (ValueError, KeyError, TypeError):
                continue
    for p in found:
        if p.minor == want:
            return p
    seen = ", ".join(f"{p.executable} is {p.minor}" for p in found) or \
        f"none of {', '.join(candidates)} runs there"
    raise ConfigError(
        f"environment: the session runs Python {want} and backend '{backend}' has no "
        f"Python {want} ({seen}); name one with environment.base_python, load it with "
        "environment.setup (module load), or use a container", field="environment",
        value=want)


# --- the lock -------------------------------------------------------------------------------

def _applies(entry: str) -> bool:
    """A requirement line whose environment marker holds here (pip skips the others:
    a lock made on another platform lists ``pywin32 ; sys_platform == 'win32'``)."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        marker = Requirement(entry).marker
    except InvalidRequirement:
        return True  # check_pip_entries names it
    return marker is None or marker.evaluate({"extra": ""})


def _direct_reference(entry: str) -> bool:
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        return Requirement(entry).url is not None
    except InvalidRequirement:
        return False


def wheel_tags(path: Path) -> set[Any]:
    from packaging.utils import parse_wheel_filename

    return set(parse_wheel_filename(path.name)[3])


def requires_python(path: Path) -> str | None:
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            if name.endswith(".dist-info/METADATA") and name.count("/") == 1:
                for line in z.read(name).decode("utf-8", "replace").splitlines():
                    if not line.strip():
                        break  # the headers end at the first blank line
                    if line.lower().startswith("requires-python:"):
                        return line.split(":", 1)[1].strip()
    return None


def check_wheels(wheels: list[Path], system: SystemPython, backend: str) -> None:
    """Refuse, in one line naming the package and why, a wheel the system cannot install."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    ok_tags = system.tags()
    full = ".".join(map(str, system.version))
    for w in wheels:
        name, version = rtenv.wheel_name_version(w)
        if not wheel_tags(w) & ok_tags:
            raise ConfigError(
                f"environment: package {name} {version} cannot be installed on backend "
                f"'{backend}': its wheel {w.name} is not for {system.describe()}",
                field="environment.packages", value=name)
        rp = requires_python(w)
        if rp:
            try:
                spec = SpecifierSet(rp)
            except InvalidSpecifier:
                continue
            if not spec.contains(full, prereleases=True):
                raise ConfigError(
                    f"environment: package {name} {version} cannot be installed on backend "
                    f"'{backend}': it requires Python {rp} and the system has {full}",
                    field="environment.packages", value=name)


_digests: dict[tuple[str, int, int], str] = {}


def _digest(path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _digests:
        _digests[key] = rtenv.sha256(path)
    return _digests[key]


def build_permit(backend: Any) -> Any:
    """The state folder's leave to build what a job names (core/grants.py decides): a
    backend with no secret store knows no policy, so it builds nothing (fail closed)."""
    secrets = getattr(backend.context, "secrets", None)
    if secrets is None:
        return None
    return policy_for(secrets.store).build_permit()


def lock(packages: Any, requirements: str | None, cache: Path,
         system: SystemPython, *, permit: Any, requirements_text: str | None = None
         ) -> tuple[list[Path], dict[str, str], str]:
    """(wheels, {name: version}, hash) of the environment: every installed distribution
    (``packages: session``) or the declared ``packages`` / ``requirements`` (a file here)
    / ``requirements_text`` (a file's contents sent over REST: names only, see
    ``env_requirements``) with what they require as installed here, plus papermill and
    ipykernel (the runner), plus pip (the installer, run from its wheel on the system).
    The hash covers the Python major.minor, the system's platform and every wheel's
    content.  ``permit``: the policy's leave to build source distributions here
    (``build_permit``); without it, binary wheels only."""
    entries: list[str] = []
    whl: list[Path] = []
    if isinstance(packages, (list, tuple)):
        entries += [str(p) for p in packages]
    declared: list[tuple[str, list[Any]]] = []
    if requirements:
        declared.append(("environment.requirements",
                         reqs.read(requirements, "environment.requirements")))
    if requirements_text:
        declared.append(("requirements", reqs.parse(requirements_text, "requirements")))
    for req_field, lines in declared:
        for ln in lines:
            if ln.wheel:
                if not Path(ln.entry).is_file():
                    raise ConfigError(f"{req_field} line {ln.number}: no wheel file "
                                      f"{ln.entry!r}", field=req_field, value=ln.entry)
                whl.append(Path(ln.entry))
            elif _applies(ln.entry):
                entries.append(ln.entry)
    where = declared[0][0] if declared and not isinstance(packages, (list, tuple)) \
        else "environment.packages"
    for i, e in enumerate(packages if isinstance(packages, (list, tuple)) else []):
        if rtenv.is_local(str(e)):  # names only: a folder would be built on this side
            raise ConfigError(f"environment.packages.{i}: {e!r} is not a package name; "
                              "give the name of a package installed in the session (or "
                              "a wheel file in environment.requirements)",
                              field=f"environment.packages.{i}", value=e)
    rtenv.check_pip_entries(entries, "environment.packages")
    for i, e in enumerate(packages if isinstance(packages, (list, tuple)) else []):
        # 'name @ file:///folder' or 'name @ https://...' is a folder or an archive that
        # ``pip wheel`` would fetch and build (running its setup code) on this side: on a
        # hub, the sidekick's machine, past its location policy and egress proxy
        if _direct_reference(str(e)):
            raise ConfigError(f"environment.packages.{i}: {e!r} is a direct reference "
                              "(NAME @ URL); give the name of a package installed in the "
                              "session (or a wheel file in environment.requirements)",
                              field=f"environment.packages.{i}", value=e)
    try:
        wheels, pins = rtenv.collect([*entries, *RUNNER], packages == "session", cache, {},
                                     permit=permit)
        wheels += rtenv.wheels_for({"pip": rtenv.md.version("pip")}, cache)
    except RuntimeError as e:
        first = str(e).splitlines()[0][:300]
        raise ConfigError(f"{where}: {first}", field=where, value=None) from None
    for req_field, lines in declared:
        reqs.check_hashes(lines, wheels, req_field)
    for w in whl:
        n, v = rtenv.wheel_name_version(w)
        pins[n] = v
        wheels.append(w)
    wheels = sorted({w.name: w for w in wheels}.values(), key=lambda p: p.name)
    h = hashlib.sha256()
    h.update(f"{system.minor} {system.platform} {system.libc}\n".encode())
    for w in wheels:
        h.update(f"{w.name} {_digest(w)}\n".encode())
    return wheels, pins, h.hexdigest()[:16]


# --- on the system -----------------------------------------------------------------------------

def build_script(root: str, env_hash: str, base_python: str, pip_wheel: str,
                 gc_minutes: int | None = None, files: str | None = None,
                 wheels_dir: str | None = None, lock_path: str | None = None,
                 gc_path: str | None = None) -> str:
    """The script every job runs first: builds ``root/<hash>`` unless complete, under an
    exclusive lock (a second job waits, then finds it built); a folder without the
    completion marker is a build that was cut off: removed and built again.

    ``files``: where the wheels and the lock are when not in ``root`` (ARC: the job's own
    session folder).  ``gc_minutes``: the job itself collects old environments (at most
    once an hour), for backends whose API runs no command (FirecREST, ARC)."""
    q = shlex.quote
    env = f"{root}/{env_hash}"
    files = files or root
    wheels_dir = wheels_dir or f"{files}/wheels"
    lock_path = lock_path or f"{files}/{env_hash}.txt"
    gc_path = gc_path or f"{files}/gc.sh"
    gc = "" if gc_minutes is None else (
        f'if [ -z "$(find {q(root + "/.cloudtik-gc")} -mmin -60 2>/dev/null)" ]; then\n'
        f"  touch {q(root + '/.cloudtik-gc')} 2>/dev/null && bash {q(gc_path)} "
        f"{q(root)} {int(gc_minutes)} {q(env_hash)} >&2 || true\n"
        "fi\n")
    return f"""#!/bin/bash
# jupyter_cloudtik: the environment {env_hash} (built once, then reused)
set -u
env={q(env)}
if [ ! -f "$env/{COMPLETE}" ]; then
  mkdir -p {q(root)} || exit 1
  exec 9>>{q(env + '.lock')} || exit 1
  # the lock stays held by fd 9 of this shell after python took it (flock(2) semantics)
  {q(base_python)} -c 'import fcntl; fcntl.flock(9, fcntl.LOCK_EX)' || exit 1
  if [ ! -f "$env/{COMPLETE}" ]; then
    if [ -e "$env" ]; then
      echo "jupyter_cloudtik: environment {env_hash} was left half-built; building it again" >&2
      rm -rf -- "$env"
    fi
    echo "jupyter_cloudtik: building environment {env_hash} (once for this system)" >&2
    t0=$(date +%s)
    {q(base_python)} -m venv --without-pip "$env" || exit 1
    "$env/bin/python" {q(f"{wheels_dir}/{pip_wheel}/pip")} install --quiet --no-index \\
      --no-deps --no-compile --disable-pip-version-check --no-warn-script-location \\
      -r {q(lock_path)} || exit 1
    # bytecode now, in parallel (pip compiles one file at a time): the jobs may not be
    # allowed to write it (PYTHONDONTWRITEBYTECODE, a read-only share), and without it
    # every job would compile its imports again
    "$env/bin/python" -m compileall -q -j 0 "$env/lib" >/dev/null 2>&1
    touch "$env/{COMPLETE}" || exit 1
    echo "jupyter_cloudtik: environment {env_hash} built in $(( $(date +%s) - t0 )) s" >&2
  fi
  exec 9>&-
fi
touch "$env/{USED}" 2>/dev/null
{gc}exit 0
"""


def gc_script() -> str:
    """Remove environments not used for ``$2`` minutes (except ``$3``, the one being
    staged) and the wheels no remaining environment lists.  An environment whose lock is
    held (being built) is left alone."""
    return r"""
root=$1; minutes=$2; keep=$3
cd "$root" 2>/dev/null || exit 0
for d in */; do
  h=${d%/}
  [ "$h" = wheels ] || [ "$h" = "$keep" ] && continue
  [ -f "$h.txt" ] || [ -f "$h/.cloudtik-used" ] || [ -d "$h" ] || continue
  clock="$h/.cloudtik-used"; [ -e "$clock" ] || clock="$h"
  if [ -n "$(find "$clock" -maxdepth 0 -mmin +"$minutes" 2>/dev/null)" ]; then
    if command -v flock >/dev/null 2>&1; then
      flock -n "$h.lock" rm -rf -- "$h" "$h.txt" "$h.sh" || continue
    else
      rm -rf -- "$h" "$h.txt" "$h.sh"
    fi
    rm -f -- "$h.lock"
    echo "removed $h"
  fi
done
listed=$(cat ./*.txt 2>/dev/null)
for w in wheels/*.whl; do
  [ -e "$w" ] || continue
  case "$listed" in *"/$w"*) ;; *) rm -f -- "$w"; echo "removed $w";; esac
done
"""


_gc_done: dict[str, float] = {}


def stage(shell, root: str, build: dict[str, Any], where: str) -> None:
    """Put the environment's wheels (those not there yet), its lock and its build script
    on the system; then collect old environments (at most once an hour per folder).
    Raises ProviderError in one line (a full disk names itself).

    A shell with ``listdir`` (FirecREST's file API: names and sizes) gets each wheel
    under its own name, a short one being taken as cut off and sent again; others get
    ``NAME.part`` renamed when complete.  A shell that runs commands as jobs
    (``runs_by_job``) leaves the garbage collection to the jobs themselves."""
    q = shlex.quote
    wheels = [Path(p) for p in build["wheels"]]
    by_job = getattr(shell, "runs_by_job", False)
    try:
        shell.mkdir(f"{root}/wheels")
        if hasattr(shell, "listdir"):
            sizes = shell.listdir(f"{root}/wheels")
            missing = [w for w in wheels if sizes.get(w.name) != w.stat().st_size]
            for w in missing:
                shell.put(w, f"{root}/wheels/{w.name}")
        else:
            r = shell.run(["bash", "-c", f"cd {q(root)}/wheels && ls -1"], timeout=60)
            have = set(r.stdout.split()) if r.rc == 0 else set()
            missing = [w for w in wheels if w.name not in have]
            for w in missing:
                shell.put(w, f"{root}/wheels/{w.name}.part")
            if missing:
                mv = " && ".join(f"mv -f -- {q(w.name + '.part')} {q(w.name)}"
                                 for w in missing)
                r = shell.run(["bash", "-c", f"cd {q(root)}/wheels && {mv}"], timeout=120)
                if r.rc != 0:
                    raise OSError(r.stderr.strip() or "mv failed")
        h = build["hash"]
        shell.write_bytes(f"{root}/{h}.txt", lock_listing(root, wheels).encode())
        gc_minutes = None
        if by_job:
            gc_minutes = keep_minutes(build.get("keep_days"))
            shell.write_bytes(f"{root}/gc.sh", gc_script().encode(), 0o755)
        shell.write_bytes(f"{root}/{h}.sh", build_script(
            root, h, build["base_python"], build["pip_wheel"], gc_minutes).encode(), 0o755)
    except (OSError, ProviderError) as e:
        msg = getattr(e, "message", None) or getattr(e, "strerror", None) or str(e)
        full = "No space left" in str(e) or getattr(e, "errno", None) == 28
        raise ProviderError(
            f"cannot stage the job's environment in {root} on {where}: "
            f"{'the disk is full' if full else msg}") from None
    log.info("environment %s: %d of %d wheels staged in %s", build["hash"], len(missing),
             len(wheels), root)
    if by_job:
        return
    now = time.monotonic()
    if now - _gc_done.get(f"{where}:{root}", -GC_INTERVAL) >= GC_INTERVAL or \
            build.get("keep_days") == 0:
        _gc_done[f"{where}:{root}"] = now
        collect_garbage(shell, root, build.get("keep_days"), build["hash"])


def lock_listing(files: str, wheels: list[Path], wheels_dir: str | None = None) -> str:
    """The ``<hash>.txt`` pip installs: the wheels' paths under ``files`` (or
    ``wheels_dir``).  The installer is run from its wheel, not installed; it is named in a
    comment so the garbage collector knows it is still wanted."""
    d = wheels_dir or f"{files}/wheels"
    return "".join(f"{d}/{w.name}\n" if not w.name.startswith("pip-")
                   else f"# installer: {d}/{w.name}\n" for w in wheels)


def keep_minutes(keep_days: float | None) -> int:
    days = KEEP_DAYS if keep_days is None else float(keep_days)
    return max(0, int(days * 1440))


def collect_garbage(shell, root: str, keep_days: float | None, keep: str = "") -> list[str]:
    """Remove what ``gc_script`` finds old; returns what went."""
    minutes = keep_minutes(keep_days)
    r = shell.run(["bash", "-c", gc_script(), "gc", root, str(minutes), keep], timeout=300)
    gone = [line.split(" ", 1)[1] for line in r.stdout.splitlines()
            if line.startswith("removed ")]
    if gone:
        log.info("environments: removed %s from %s", ", ".join(gone), root)
    return gone


#: how long a job-run probe (``job_shell.JobShell``) may take, queue included
JOB_RUN_TIMEOUT = 900.0
#: how long the answer of a job-run probe is kept (in the state folder)
PROBE_KEEP = 86400.0


# --- choosing ------------------------------------------------------------------------------

def mode(env: Any, explicit: set[str], builds_by_default: bool) -> str:
    """How a job's environment is had (recorded in the plan):

    * ``container``: an image has everything;
    * ``system``: ``packages: system``, the system's own Python (with ``setup`` lines);
    * ``named``: an interpreter, venv or conda env on the system named in the config or
      the job (``python``, ``venv``, ``conda_env``);
    * ``built``: ``packages`` (``session`` or a list) / ``requirements`` (a file, or its
      text sent over REST: ``requirements_text``) given, or the
      backend's jobs cannot use this session's interpreter (another machine or account);
    * ``session-interpreter``: this session's interpreter itself (jobs on this machine as
      this user: it *is* the session's environment, nothing to build).
    """
    if env.container:
        return CONTAINER
    if env.packages == "system":
        return SYSTEM
    if env.packages is not None or env.requirements or env.requirements_text:
        return BUILT
    if explicit & {"python", "venv", "conda_env"}:
        return NAMED
    return BUILT if builds_by_default else SESSION_INTERPRETER


def check_packages_value(value: Any) -> None:
    if value is None or value in ("session", "system"):
        return
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) and v for v in value):
        return
    raise ConfigError(f"environment.packages: {value!r} is not allowed; use 'session' (every "
                      "installed package), 'system' (the system's own Python) or a list of "
                      "package names", field="environment.packages", value=value)


def check_container_runtime(env: Any) -> None:
    """A runtime the job script cannot write is refused before the job is recorded."""
    runtime = env.container_runtime
    if env.container and runtime is not None and runtime not in CONTAINER_RUNTIMES:
        raise ConfigError(f"environment.container_runtime: {runtime!r} is not allowed; use "
                          f"{', '.join(CONTAINER_RUNTIMES)}",
                          field="environment.container_runtime", value=runtime)


_probed: dict[tuple[Any, ...], tuple[float, SystemPython]] = {}


def system_python(backend: Any, env: Any) -> SystemPython:
    """The system's Python for ``env`` (asked once per ``PROBE_TTL`` per backend)."""
    key = (id(backend), backend.name, tuple(env.setup), env.base_python)
    now = time.monotonic()
    hit = _probed.get(key)
    if hit and now - hit[0] < PROBE_TTL:
        return hit[1]
    shell = backend.environment_shell()
    kept = None
    if getattr(shell, "runs_by_job", False):
        # a probe is a batch job there: its answer is kept on disk for a day
        kept = backend.context.state_dir / "hpc" / "system-pythons.json"
        where = json.dumps([backend.kind, backend.name, backend.config.get("url"),
                            list(env.setup), env.base_python])
        try:
            seen = json.loads(kept.read_text())
        except (OSError, ValueError):
            seen = {}
        hit2 = seen.get(where)
        if hit2 and time.time() - hit2[0] < PROBE_KEEP:
            found = parse_probe(json.dumps(hit2[1]))
            _probed[key] = (now, found)
            return found
    found = find_python(shell, backend.name, list(env.setup), env.base_python)
    _probed[key] = (now, found)
    if kept is not None:
        seen[where] = [time.time(), dataclasses.asdict(found)]
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps(seen))
    return found


def prepare(backend: Any, merged: Any, given: Any = None) -> Any:
    """The job's environment with ``build`` filled: its mode and, when built, the lock
    (hash, wheels, pins), the system's Python and where it lives.  Raises a ConfigError
    in one line for what the system cannot have (before the job is recorded)."""
    import dataclasses

    explicit = {k for k, v in (backend.config.get("environment") or {}).items() if v}
    if given is not None:
        explicit |= {k for k in ("python", "venv", "conda_env") if getattr(given, k)}
    check_packages_value(merged.packages)
    check_container_runtime(merged)
    how = mode(merged, explicit, backend.builds_environment())
    env = dataclasses.replace(merged)
    if how == SYSTEM:
        if "python" not in explicit:
            env.python = env.base_python or "python3"
        env.venv = env.conda_env = None
    if how != BUILT:
        env.build = {"mode": how}
        return env
    root = backend.environment_root()
    if root is None:
        raise ConfigError(
            f"environment.packages: backend '{backend.name}' ({backend.kind}) cannot build "
            "the session's environment yet; name a Python on the system "
            "(environment.python), use packages: system, or a container",
            field="environment.packages", value=backend.kind)
    packages = env.packages if env.packages is not None else (
        None if env.requirements or env.requirements_text else "session")
    if packages == "session" and build_permit(backend) is None:
        # a shared service's "session" is the service's own installation, not the
        # user's: replicating it gives the job the wrong packages, slowly
        raise ConfigError(
            f"environment.packages: backend '{backend.name}' is used through a shared "
            "service, whose installed packages are its own, not your session's: name the "
            "packages the job needs (environment.packages: [names]), use packages: "
            "system, or ask the admin to set the backend's environment.python",
            field="environment.packages", value="session")
    system = system_python(backend, env)
    cache = backend.context.state_dir / "hpc" / "wheels"
    wheels, pins, h = lock(packages, env.requirements, cache, system,
                           permit=build_permit(backend),
                           requirements_text=env.requirements_text)
    check_wheels(wheels, system, backend.name)
    pip_wheel = next(w.name for w in wheels if w.name.startswith("pip-"))
    env.python = f"{root}/{h}/bin/python"
    env.venv = f"{root}/{h}"
    env.conda_env = None
    env.build = {"mode": BUILT, "hash": h, "root": root, "python": system.minor,
                 "base_python": system.executable, "system": system.describe(),
                 "pip_wheel": pip_wheel, "wheels": [str(w) for w in wheels],
                 "pins": dict(sorted(pins.items())), "keep_days": env.keep_days,
                 "packages": packages if isinstance(packages, str) else list(packages or [])}
    return env


def summary(plan_env: dict[str, Any] | None) -> dict[str, Any]:
    """What a job's record shows of its environment (the plan keeps every pin): how it
    was had, and for a built one its hash, Python, system and number of packages."""
    if not plan_env:
        return {}
    build = plan_env.get("build") or {}
    out: dict[str, Any] = {"mode": build.get("mode") or (
        CONTAINER if plan_env.get("container") else SESSION_INTERPRETER)}
    if plan_env.get("container"):
        out["container"] = plan_env["container"]
        out["container_runtime"] = plan_env.get("container_runtime") or "apptainer"
    else:
        out["python"] = plan_env.get("python")
    if plan_env.get("setup"):
        out["setup"] = list(plan_env["setup"])
    if build.get("hash"):
        out.update(hash=build["hash"], python_version=build.get("python"),
                   system=build.get("system"), packages=len(build.get("pins") or {}))
    return out
