"""The hub sidekick's access policy: the admins' catalogue decides every grant.

``core/grants.py`` asks this policy whenever a hub user's request — or a background action
of theirs (the reaper scaling their cluster, a job's stage-out) — would use a catalogue
item: a provider, a template, a storage, an HPC backend, a side-kick, an image.  One rule
for every face and field: the item exists *and* its access lists name the caller (or one
of their groups, or ``"*"``); otherwise the very answer of a missing item, which names
nothing else.  Storages are read-only when the admin says so (``spec.read_only``), and a
node of a user who may only read one gets its read-only credential or nothing.  Users
never get grants on egress rules, workspaces, gateways or zones: those secrets are the
service's own (``Policy.service``).

Found through the ``jupyter_cloudtik.policies`` entry point ``catalog``: the sidekick
declares it in its state folder's ``shared.json``, so every process of that folder (the
reaper daemon too) decides the same way.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import NotFoundError, PermissionDeniedError
from ..core.grants import Caller, Grant, Policy, _mint, not_found, storage_index
from .catalog import Catalog

#: kinds a user may be granted, with the modes each knows
USER_KINDS = {"provider": ("use",), "template": ("use",), "storage": ("read", "write"),
              "hpc": ("run", "use"), "sidekick": ("run", "use"), "image": ("use",),
              "kernel": ("run",)}


class CatalogPolicy(Policy):
    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.catalog = Catalog(store, None)

    def grant(self, caller: Caller, kind: str, name: str, mode: str = "use", *,
              field: str | None = None) -> Grant:
        if not isinstance(name, str) or not name or kind not in USER_KINDS \
                or mode not in USER_KINDS[kind]:
            if kind in USER_KINDS or not caller.admin:
                raise not_found(kind, str(name), field)
            return _mint(caller, kind, name, mode)  # an admin's workspace, gateway, zone
        if kind == "image":
            return self._image(caller, name, field)
        res = self.catalog.find(kind, name)
        if res is None or not caller.may_use(res.users, res.groups):
            raise not_found(kind, name, field)
        if kind == "kernel":
            # a profile runs on its backend: no grant on one without the other, and a
            # backend the caller may not use is not named (the profile's own 404)
            backend = res.spec.get("backend")
            backend_res = self.catalog.find("hpc", backend) if isinstance(backend, str) \
                else None
            if backend_res is None or not caller.may_use(backend_res.users,
                                                         backend_res.groups):
                raise not_found(kind, name, field)
        if kind == "storage":
            index = storage_index(self.store)
            read_only = index.read_only(name) if index is not None else None
            if read_only is None:  # in the catalogue but never made (a refused sync)
                raise not_found(kind, name, field)
            if mode == "write" and read_only:
                raise PermissionDeniedError(f"{field or 'storage'}: storage {name!r} is "
                                            "read-only", field=field or "storage", value=name)
        return _mint(caller, kind, name, mode)

    def _image(self, caller: Caller, name: str, field: str | None) -> Grant:
        """``name`` is ``<catalogue provider>/<image id>``: an image is usable if the
        provider (which the caller may use) lists it in ``spec.images`` (``"*"``: any)."""
        provider, _, image = name.partition("/")
        res = self.catalog.find("provider", provider)
        if res is None or not image or not caller.may_use(res.users, res.groups):
            raise not_found("image", image or name, field)
        images = res.spec.get("images") or []
        if image not in images and "*" not in images:
            raise not_found("image", image, field)
        return _mint(caller, "image", name, "use")

    def visible(self, caller: Caller, kind: str) -> list[str]:
        if kind not in USER_KINDS or kind == "image":
            return []
        names = [r.name for r in self.catalog.visible(caller, kind)]
        if kind == "kernel":  # and its backend: the one decision, grant()
            names = [n for n in names if self._granted(caller, kind, n)]
        return names

    def _granted(self, caller: Caller, kind: str, name: str) -> bool:
        try:
            self.grant(caller, kind, name, USER_KINDS[kind][0])
        except (NotFoundError, PermissionDeniedError):
            return False
        return True

    def caller(self, name: str) -> Caller:
        """Who ``name`` is for a background action: the request's caller if it is them,
        else their groups at their last request; unknown users are in no group."""
        current = super().caller(name)
        if current.groups or current.admin:
            return current
        return self.catalog.remembered(name) or current
