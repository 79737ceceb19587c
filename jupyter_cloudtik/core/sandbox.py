"""Where a shared service runs what its users control: a bubblewrap sandbox.

Why it exists: the hub sidekick's account holds the secret store's key and every
credential of its catalogue, and some of what it runs is chosen by a user — a side-kick's
requests, a local cluster's nodes and setup commands, a local job.  Run as the service's
account next to its state folder, any of those reads the key (issue 26).  So the sidekick
starts each of them inside a sandbox made with bubblewrap (``bwrap``, the sandbox Flatpak
is built on; Debian's ``bubblewrap``), which the kernel enforces:

* **An allowlisted view of the filesystem.**  The process sees the operating system's
  programs and libraries (``/usr``, ``/bin``, ``/lib*``), a few files of ``/etc`` that
  programs need (users, name resolution, CA certificates, time zone), the Python
  installation and this package, all read-only; the folders it owns read-write; a private
  ``/tmp``.  Nothing else exists in its view — not the state folder, the service's home,
  its configuration files, nor other users' folders — so a path the sandbox was not given
  cannot be opened, whatever its permissions.  ``c.CloudTikHub.sandbox_readable`` adds
  read-only paths (a site's module tree, a shared data set).
* **Its own process, IPC and host-name namespaces.**  It sees only its own processes: no
  ``/proc`` of the sidekick (its environment, memory, open files) or of other sandboxes.
* **An unprivileged account.**  When the service runs as root, the process runs as
  ``c.CloudTikHub.sandbox_uid`` (65534, ``nobody``, by default) with every capability
  dropped and ``no_new_privs`` set, so even a file the view shows is readable only if it
  is readable by everybody; its own folders are handed to that account.  A service that
  is not root runs it as itself in a user namespace (its view is then the protection).
* **Only the environment it is given** (``environment()``: ``PATH``, locale, ``HOME``;
  callers add their own variables).  The service's own variables — tokens, the secret
  key, catalogue secrets read from the environment — never reach it.

The network is shared: nodes and side-kicks must answer the sidekick on loopback; what
listens there authenticates (the side-kick token, TLS client certificates of clusters,
the egress proxy's per-user credential).

Fail closed: when bubblewrap is missing or cannot create namespaces here, ``check()``
raises :class:`SandboxUnavailable` naming what to install or enable, and nothing is run
unsandboxed unless the admin chose ``c.CloudTikHub.sandbox = "none"``.

Which processes are sandboxed is a property of the *state folder*, not of the code path:
the sidekick declares it in its state folder's ``shared.json`` when it starts (``install``),
and every process that works on that folder — the sidekick, the idle reaper daemon it
starts, a provider or HPC backend created anywhere — asks ``sandbox_for(state_dir)``
before it starts a node or a job.  A path that forgot to ask still runs nothing outside:
the local provider and the local backend ask themselves.  An unreadable ``shared.json``
refuses, it is never read as "no sandbox".
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError
from .grants import declare_shared, shared_settings

#: the operating system: programs and libraries (read-only)
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: files of /etc that ordinary programs read: users and groups (for names), name
#: resolution, CA certificates, time zone, the dynamic linker's cache, Java's settings
ETC_PATHS = ("/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/hosts",
             "/etc/host.conf", "/etc/resolv.conf", "/etc/gai.conf", "/etc/localtime",
             "/etc/timezone", "/etc/ssl/certs", "/etc/ca-certificates",
             "/etc/ca-certificates.conf", "/etc/pki/tls/certs", "/etc/ld.so.cache",
             "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/mime.types",
             "/etc/protocols", "/etc/services", "/etc/os-release", "/etc/debian_version",
             "/etc/java-17-openjdk", "/etc/fonts", "/etc/bash.bashrc", "/etc/profile",
             "/etc/inputrc", "/etc/magic", "/etc/machine-id")
#: variables a sandboxed process inherits from the service (everything else is dropped)
INHERITED_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM", "PYTHONUNBUFFERED")
NOBODY = 65534


class SandboxUnavailable(ConfigError):
    """The sandbox cannot be made on this machine (and the admin did not opt out)."""

    http_status = 503
    reason = "sandbox_unavailable"


def python_paths() -> list[str]:
    """What a Python process of this installation needs to import what we import: the
    interpreter's prefixes, this package and the source folders of the other editable
    installs (a plugin installed with ``pip install -e`` lives outside the prefixes; a
    process that sees its entry point but not its code fails to load every plugin of
    that group)."""
    package = Path(__file__).resolve().parents[1]  # jupyter_cloudtik/ (core/..)
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix,
             os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))),
             str(package)}
    # this package's own checkout is its package folder alone (bwrap makes the parents),
    # not the whole checkout beside it
    paths |= {src for src in _editable_sources()
              if not (package.is_relative_to(src) and str(package) != src)}
    return sorted(p for p in paths if p and os.path.exists(p))


def _editable_sources() -> set[str]:
    """Absolute folders that ``.pth`` files of this environment's site-packages add to
    ``sys.path`` (editable installs); only what the installation itself names, never
    the caller's working folder or ``PYTHONPATH``."""
    import site

    found: set[str] = set()
    for folder in site.getsitepackages():
        for pth in sorted(Path(folder).glob("*.pth")):
            try:
                lines = pth.read_text().splitlines()
            except (OSError, UnicodeDecodeError):
                continue
            for line in lines:
                line = line.strip()
                if os.path.isabs(line) and os.path.isdir(line):
                    found.add(os.path.realpath(line))
    return found


@dataclass(frozen=True)
class Sandbox:
    """How to run one command sandboxed; ``command()`` wraps an argv in ``bwrap``.

    ``hidden`` are paths that must never be visible even if a readable path contains them
    (the service's state folder, say): they are covered by an empty, read-only folder.
    """

    readable: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    uid: int = NOBODY
    gid: int = NOBODY
    bwrap: str = "bwrap"
    extra_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def as_root(self) -> bool:
        return hasattr(os, "geteuid") and os.geteuid() == 0

    @property
    def owner(self) -> tuple[int, int] | None:
        """The account a sandboxed process writes its files as, when it differs from the
        service's own (the service is root): its folders are handed to it."""
        return (self.uid, self.gid) if self.as_root else None

    def check(self) -> None:
        """Raise :class:`SandboxUnavailable` unless a sandbox can be made here."""
        problem = _probe(self.bwrap, self.as_root, self.uid, self.gid)
        if problem:
            raise SandboxUnavailable(problem, field="sandbox")

    def prepare(self, *folders: Path) -> None:
        """Make ``folders`` (the process's own, read-write) and hand them to the sandbox's
        account; their parents stay the service's (0700), so the account cannot walk up."""
        for folder in folders:
            Path(folder).mkdir(parents=True, exist_ok=True, mode=0o700)
            if self.owner is not None:
                for root, dirs, files in os.walk(folder):
                    os.chown(root, *self.owner)
                    for name in dirs + files:
                        os.lchown(os.path.join(root, name), *self.owner)

    def environment(self, extra: Mapping[str, str] = (), *, home: str | Path = "/tmp"
                    ) -> dict[str, str]:
        """The whole environment of a sandboxed process: a few harmless variables of the
        service (``INHERITED_ENV``, ``LC_*``), ``HOME``, then ``extra``."""
        env = {k: v for k, v in os.environ.items()
               if k in INHERITED_ENV or k.startswith("LC_")}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.update({"HOME": str(home), "TMPDIR": "/tmp", "USER": "sandbox",
                    "LOGNAME": "sandbox"})
        env.update(self.extra_env)
        env.update(dict(extra))
        return env

    def command(self, argv: list[str], *, writable: Iterable[str | Path] = (),
                readable: Iterable[str | Path] = (), cwd: str | Path | None = None,
                die_with_parent: bool = False) -> list[str]:
        """``argv`` inside the sandbox: the view is the allowlist, ``readable`` (read-only)
        and ``writable`` (read-write), each at its own path.  ``die_with_parent``: the
        sandbox ends when bwrap or its parent does (a side-kick, which its supervisor
        owns); nodes and jobs outlive the process that started them."""
        # order matters: later mounts go over earlier ones (the fresh /tmp first, then
        # what is shown inside it; the hidden folders over what shows them; the process's
        # own folders last)
        args = [self.bwrap, "--tmpfs", "/"]
        for path in SYSTEM_PATHS:
            if os.path.islink(path):  # merged /usr: /bin -> usr/bin
                args += ["--symlink", os.readlink(path), path]
            elif os.path.exists(path):
                args += ["--ro-bind", path, path]
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/var/tmp"]
        made: set[str] = {"/", "/tmp", "/var", "/var/tmp", "/proc", "/dev"}

        def parents(path: str) -> list[str]:
            """The folders leading to ``path``, made walkable (bwrap would make them 0700,
            which the sandbox's account could not pass)."""
            out = []
            for parent in reversed(Path(path).parents):
                p = str(parent)
                if p not in made and not _under(p, SYSTEM_PATHS):
                    made.add(p)
                    out += ["--perms", "0755", "--dir", p]
            return out

        ro = [*ETC_PATHS, *python_paths(), *self.readable, *map(str, readable)]
        for path in _unique(ro):
            if os.path.exists(path) and not _under(path, SYSTEM_PATHS):
                args += [*parents(path), "--ro-bind", path, path]
        for path in self.hidden:
            if any(_under(path, [r]) for r in ro):  # covered by an empty read-only folder
                args += ["--tmpfs", path, "--remount-ro", path]
        for path in _unique(map(str, writable)):
            args += [*parents(path), "--bind", path, path]
        args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                 "--hostname", "cloudtik-sandbox"]
        if cwd is not None:
            args += ["--chdir", str(cwd)]
        if die_with_parent:
            args += ["--die-with-parent"]
        if self.as_root:
            # bwrap builds the view as root; setpriv then becomes the sandbox's account
            # with no capability left (and bwrap's no_new_privs: no setuid way back)
            args += ["--", shutil.which("setpriv") or "/usr/bin/setpriv",
                     f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                     "--inh-caps=-all", "--bounding-set=-all", "--"]
        else:
            args += ["--unshare-user", "--disable-userns", "--"]
        return args + list(argv)


class NoSandbox(Sandbox):
    """``c.CloudTikHub.sandbox = "none"``: the admin accepts that users' code runs as the
    service, next to every credential (for a hub whose users may all read them)."""

    @property
    def owner(self) -> tuple[int, int] | None:
        return None

    def check(self) -> None:
        return None

    def command(self, argv: list[str], **kwargs: object) -> list[str]:
        return list(argv)


def _unique(items: Iterable[str]) -> list[str]:
    seen: list[str] = []
    for item in items:
        p = os.path.normpath(item)
        if p not in seen:
            seen.append(p)
    return seen


def _under(path: str, roots: Iterable[str]) -> bool:
    p = os.path.normpath(path)
    return any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)


@functools.lru_cache(maxsize=8)
def _probe(bwrap: str, as_root: bool, uid: int, gid: int) -> str | None:
    """Why no sandbox can be made here, or None: one real sandboxed ``true`` (cached)."""
    exe = shutil.which(bwrap)
    if exe is None:
        return (f"sandbox: bubblewrap ({bwrap!r}) is not installed; install it (Debian: "
                "apt-get install bubblewrap) or set c.CloudTikHub.sandbox = 'none' to run "
                "users' code as the service itself, next to every credential")
    probe = Sandbox(bwrap=exe, uid=uid, gid=gid).command(["/bin/true"])
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sandbox: bubblewrap could not run here ({e})"
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        hint = ("" if as_root else "; a service that is not root needs unprivileged user "
                "namespaces (sysctl kernel.unprivileged_userns_clone=1)")
        return f"sandbox: bubblewrap cannot make a sandbox here: {detail[0]}{hint}"
    return None


def install(state_dir: str | Path, mode: str = "bubblewrap", *, uid: int = NOBODY,
            gid: int = NOBODY, readable: Iterable[str] = ()) -> Sandbox:
    """Declare that what users control and this state folder runs is sandboxed (the hub
    sidekick, at start; ``shared.json``); returns the sandbox (``check()`` it to learn
    whether it can be made here: every use checks again and refuses if not)."""
    if mode not in ("bubblewrap", "none"):
        raise ConfigError(f"c.CloudTikHub.sandbox: {mode!r} is not one of 'bubblewrap', "
                          "'none'", field="sandbox", value=mode)
    declare_shared(state_dir, sandbox={"mode": mode, "uid": int(uid), "gid": int(gid),
                                       "readable": [str(Path(p)) for p in readable]})
    sandbox = sandbox_for(state_dir)
    assert sandbox is not None
    return sandbox


def sandbox_for(state_dir: str | Path) -> Sandbox | None:
    """The sandbox users' code of this state folder runs in; None when the folder is a
    single person's own (no ``shared.json``: a notebook's, a single-user server's).  A
    shared folder without sandbox settings gets the default sandbox, never none."""
    shared = shared_settings(state_dir)
    if shared is None:
        return None
    data = shared.get("sandbox") or {}
    try:
        mode = data.get("mode", "bubblewrap")
        uid, gid = int(data.get("uid", NOBODY)), int(data.get("gid", NOBODY))
        readable = tuple(str(p) for p in data.get("readable") or ())
    except (AttributeError, ValueError, TypeError):
        raise SandboxUnavailable(f"sandbox: the settings in {state_dir}/shared.json are "
                                 "damaged; nothing of a user's is started until the "
                                 "sidekick rewrites them (restart it)",
                                 field="sandbox") from None
    hidden = (os.path.realpath(state_dir),)
    if mode == "none":
        return NoSandbox(readable=readable, hidden=hidden, uid=uid, gid=gid)
    return Sandbox(readable=readable, hidden=hidden, uid=uid, gid=gid)
