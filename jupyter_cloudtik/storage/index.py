"""Which storages a state folder holds, and which of them are read-only: what the grant
policies (``core/grants.py`` for one person's folder, ``hub/policy.py`` for a shared one)
decide on.

Storage owns its table; the policies sit below (core) or beside (hub) and reach this through
the registry (``feature_service("storage_index")``) instead of reading the table with SQL of
their own, so the table's shape is known in one feature.  A folder whose storage tables were
never made (storage's migrations not yet run there) has no storages.
"""

from __future__ import annotations

from typing import Any


class StorageIndex:
    """The storages of one store, read-only view."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def _made(self) -> bool:
        return self.store.query_one(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'storages'") is not None

    def read_only(self, name: str) -> bool | None:
        """Whether storage ``name`` is read-only; None when the folder has no such storage."""
        if not self._made():
            return None
        row = self.store.query_one("SELECT read_only FROM storages WHERE name = ?", (name,))
        return None if row is None else bool(row["read_only"])

    def names(self) -> list[str]:
        if not self._made():
            return []
        return [r[0] for r in self.store.query("SELECT name FROM storages ORDER BY name")]
