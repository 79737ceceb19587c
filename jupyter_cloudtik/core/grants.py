"""The one place that decides who may use what — and the only way to a secret.

Every feature that lets a caller use a named thing someone else holds the credentials of
(a provider account, a cluster template, a storage, an HPC backend, a side-kick, an egress
rule, an image) asks ``policy.grant(caller, kind, name, mode)``.  The answer is a
:class:`Grant`, or the same ``NotFoundError`` for "no such thing" and "not yours" (so
nobody learns what exists for others, and nothing lists other names).  The secret store
hands out values only against a grant (``SecretStore.reveal(grant)``): a code path that
forgot to ask cannot get a secret at all, and ``tests/test_grants.py`` fails if any module
reads secrets another way.

Two kinds of grant:

* **for a caller** (``grant``): the caller may use the item in ``mode`` (``use``, ``read``,
  ``write``, ``run``).  What a user-controlled process (a cluster node, a side-kick) may
  receive of it is decided here too (``node_secrets``): never more than the mode — a
  read grant releases a storage's read-only credential, or nothing.
* **for the service itself** (``service``): the process uses the secret on its own (to
  call a cloud's API, to run a copy, to feed the egress proxy) and never hands it on.
  Each use names its purpose; the modules allowed to ask are listed in the test.

Policies: :class:`OwnerPolicy` — a state folder of one person (a notebook, a single-user
server): everything in it is its owner's — and the hub sidekick's catalogue policy
(``hub/policy.py``), found through the ``jupyter_cloudtik.policies`` entry points when the
state folder says it is shared (``shared.json``, written by the sidekick).  Every process
that opens that folder — the idle reaper daemon too — gets the same policy.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError, NotFoundError, PermissionDeniedError
from .identity import Caller, acting_caller

KINDS = ("provider", "template", "storage", "hpc", "sidekick", "egress", "image",
         "workspace", "gateway", "zone", "kernel")
MODES = ("use", "read", "write", "run")
SHARED_FILE = "shared.json"

#: where each kind keeps its secrets in the secret store (``{name}`` is the item's name)
SCOPES = {
    "provider": "hub:provider:{name}",
    "template": "hub:template:{name}",
    "sidekick": "hub:sidekick:{name}",
    "egress": "hub:egress:{name}",
    "storage": "storage:{name}",
    "storage-read-only": "storage-read-only:{name}",
    "hpc": "hpc:{name}",
    "workspace": "provider:{name}",  # name = "<provider type>:<workspace>"
    "gateway": "provider:dask-gateway",
    "zone": "zone:{name}",
    "image": "image:{name}",
    "kernel": "hub:kernel:{name}",  # a kernel profile: no secrets of its own
}

_SEAL = object()  # only this module can make a Grant


#: the process acting on its own behalf (a service grant's caller)
SERVICE = Caller("<service>", (), True)


@dataclass(frozen=True)
class Grant:
    """A decision: ``caller`` may use ``kind``/``name`` in ``mode``.  Made only by a policy;
    the secret store checks the seal, so a hand-made one opens nothing."""

    caller: Caller
    kind: str
    name: str
    mode: str
    scope: str
    purpose: str = ""
    detail: dict[str, Any] = field(default_factory=dict, compare=False)
    _seal: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._seal is not _SEAL:
            raise TypeError("a Grant is made by a policy (core.grants), not by hand")

    @property
    def for_service(self) -> bool:
        return self.caller is SERVICE

    def sealed(self) -> bool:
        return self._seal is _SEAL


@dataclass(frozen=True)
class BuildPermit:
    """Leave for this process to run setup code its caller chose: ``pip`` building a local
    folder, a source distribution or a direct reference (``NAME @ URL``) runs that
    project's build code here, with this process's files and secrets.  A single person's
    server may (the code is its own user's, in their own process); a service many users
    share (the hub's sidekick) may not, whoever asks.  Made only by a policy
    (:meth:`Policy.build_permit`): code that builds without one cannot be written, since
    ``runtime.environment.collect`` takes nothing else as leave."""

    _seal: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._seal is not _SEAL:
            raise TypeError("a BuildPermit is made by a policy (core.grants), not by hand")

    def sealed(self) -> bool:
        return self._seal is _SEAL


def _mint(caller: Caller, kind: str, name: str, mode: str, *, purpose: str = "",
          scope_kind: str | None = None, **detail: Any) -> Grant:
    if kind not in KINDS:
        raise ConfigError(f"kind: {kind!r} is not one of {', '.join(KINDS)}", field="kind",
                          value=kind)
    if mode not in MODES:
        raise ConfigError(f"mode: {mode!r} is not one of {', '.join(MODES)}", field="mode",
                          value=mode)
    scope = SCOPES[scope_kind or kind].format(name=name)
    return Grant(caller, kind, name, mode, scope, purpose, dict(detail), _SEAL)


#: the mode a plain "may the caller use it" question means, per kind
DEFAULT_MODES = {"storage": "read", "hpc": "run", "sidekick": "run", "kernel": "run"}


def default_mode(kind: str) -> str:
    return DEFAULT_MODES.get(kind, "use")


def not_found(kind: str, name: str, field: str | None = None,
              known: list[str] | None = None) -> NotFoundError:
    """The one answer for "no such item" and "not yours": it names nothing else — except,
    in a single person's folder, their own items (``known``), as a hint."""
    hint = f"; {kind}s: {', '.join(known)}" if known else ""
    return NotFoundError(f"{field or kind}: no {kind} named {name!r} that you may use{hint}",
                         field=field or kind, value=name)


class Policy:
    """Decides grants; subclasses say who may use what."""

    def __init__(self, store: Any) -> None:
        self.store = store

    # decisions --------------------------------------------------------------------------
    def grant(self, caller: Caller, kind: str, name: str, mode: str = "use", *,
              field: str | None = None) -> Grant:
        raise NotImplementedError

    def service(self, kind: str, name: str, purpose: str) -> Grant:
        """The process's own use of a secret (never handed to a caller or a node)."""
        if not purpose:
            raise ValueError("a service grant names its purpose")
        scope_kind = "storage" if kind == "storage" else None
        return _mint(SERVICE, kind, name, "use", purpose=purpose, scope_kind=scope_kind)

    def visible(self, caller: Caller, kind: str) -> list[str]:
        """Names of ``kind`` the caller may use (for pickers: never other people's)."""
        raise NotImplementedError

    def caller(self, name: str) -> Caller:
        """The caller a background action of ``name``'s (a scale of their cluster) acts as."""
        current = acting_caller.get()
        if current is not None and current.name == name:
            return current
        return Caller(name)

    def node_secrets(self, grant: Grant, secrets: Any) -> dict[str, str]:
        """What a process the caller controls (a cluster node) may receive for ``grant``:
        a storage's own credential for a write grant; for a read grant its read-only
        credential — or a refusal naming what the admin can add."""
        if grant.kind != "storage" or grant.for_service:
            raise PermissionDeniedError(f"{grant.kind} {grant.name!r}: its secrets are not "
                                        "handed to nodes", field=grant.kind, value=grant.name)
        if grant.mode == "write" or self.trusts_nodes_with_full_credentials(grant):
            return secrets.reveal(grant)
        ro = _mint(grant.caller, "storage", grant.name, "read",
                   scope_kind="storage-read-only")
        values = secrets.reveal(ro)
        if not values:
            raise PermissionDeniedError(
                f"storage.remotes: storage {grant.name!r} is read-only for you, and its only "
                "credential can write: a node given it could change the storage. An admin "
                "can add a read-only credential (catalogue storage "
                f"'{grant.name}': read_only_credentials), or make it writable for you",
                field="storage.remotes", value=grant.name)
        return {**values, "__read_only_credential__": "1"}

    def trusts_nodes_with_full_credentials(self, grant: Grant) -> bool:
        """A single owner's nodes may hold the owner's own credentials."""
        return False

    def build_permit(self) -> BuildPermit | None:
        """Leave to build what a caller named (folders, source distributions, direct
        references) in this process, or None: binary wheels from the index only.  None
        unless a policy says otherwise: a policy that does not know fails closed."""
        return None


class OwnerPolicy(Policy):
    """A state folder of one person: everything in it is theirs (read-only storages are
    still not written)."""

    def grant(self, caller: Caller, kind: str, name: str, mode: str = "use", *,
              field: str | None = None) -> Grant:
        if kind == "storage":
            index = storage_index(self.store)
            read_only = index.read_only(name) if index is not None else None
            if read_only is None:
                raise not_found("storage", name, field, self.visible(caller, "storage"))
            if mode == "write" and read_only:
                raise PermissionDeniedError(f"{field or 'storage'}: storage {name!r} is "
                                            "read-only", field=field or "storage", value=name)
        return _mint(caller, kind, name, mode)

    def visible(self, caller: Caller, kind: str) -> list[str]:
        index = storage_index(self.store) if kind == "storage" else None
        return index.names() if index is not None else []

    def trusts_nodes_with_full_credentials(self, grant: Grant) -> bool:
        return True

    def build_permit(self) -> BuildPermit | None:
        """The folder's one user builds their own projects in their own process."""
        return BuildPermit(_SEAL)


def storage_index(store: Any) -> Any | None:
    """The storage feature's index of ``store`` (which storages exist, which are read-only),
    or None when no installed feature offers one (then there are no storages to grant).  A
    feature that offers it but fails to load raises: a broken install is not "nothing"
    (the policy fails closed either way: no index, no storage grant)."""
    # deferred: start-up (core.features ~20 ms, loads importlib.metadata)
    from .features import feature_service

    try:
        index = feature_service("storage_index")
    except ConfigError:
        return None
    return index(store)


# which policy a state folder has ------------------------------------------------------------
POLICY_GROUP = "jupyter_cloudtik.policies"


def declare_shared(state_dir: str | Path, **entries: Any) -> None:
    """Write ``shared.json``: this state folder serves many users — ``policy`` (an entry
    point name of ``jupyter_cloudtik.policies``), ``sandbox`` (core/sandbox.py)."""
    path = Path(state_dir) / SHARED_FILE
    data = {**_read_shared(path, missing_ok=True), **entries}
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def shared_settings(state_dir: str | Path) -> dict[str, Any] | None:
    """The folder's ``shared.json`` (None: a single person's folder).  A damaged or
    unreadable one refuses: it is never read as "single user"."""
    return _read_shared(Path(state_dir) / SHARED_FILE, missing_ok=False) or None


def _read_shared(path: Path, missing_ok: bool) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise PermissionDeniedError(f"{path}: cannot be read ({e.strerror}); nothing is "
                                    "granted without it", field="state_dir") from None
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError
    except ValueError:
        if missing_ok:
            return {}
        raise PermissionDeniedError(f"{path} is damaged; nothing is granted until its "
                                    "service rewrites it (restart it)",
                                    field="state_dir") from None
    return data


def policy_for(store: Any) -> Policy:
    """The policy of ``store``'s state folder (made once per store object)."""
    policy = getattr(store, "_cloudtik_policy", None)
    if policy is not None:
        return policy
    shared = shared_settings(store.state_dir)
    if shared is None:
        policy = OwnerPolicy(store)
    else:
        # deferred: start-up (core.plugins ~19 ms, loads importlib.metadata, importlib.resources)
        from . import plugins

        if not shared.get("policy"):
            raise PermissionDeniedError(f"{Path(store.state_dir) / SHARED_FILE} names no "
                                        "access policy; nothing is granted without one",
                                        field="policy")
        cls = plugins.load(POLICY_GROUP, shared["policy"], field="policy",
                           what="access policy")
        policy = cls(store)
    store._cloudtik_policy = policy
    return policy


def install_policy(store: Any, policy: Policy) -> None:
    """Use ``policy`` for ``store`` (the sidekick, which built it with its catalogue)."""
    store._cloudtik_policy = policy
