"""Finding a record by the id (or the start of the id) a person typed.

Jobs and operations are named by short hex ids, and people type the first few characters.
Two rules keep that safe when one store serves many users (the hub sidekick):

* the text is compared as text: ``substr(id, 1, n) = ?``, never ``LIKE``, so ``%`` and
  ``_`` are characters of an id (which no id has), not wildcards that match every record;
* with ``user`` given, only that user's records are candidates, and a missing id and an
  id of somebody else get the very same answer (one ``NotFoundError``, one message), so
  nothing can be learnt by probing; an ambiguous prefix names the caller's own
  candidates only.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from .errors import ConflictError, NotFoundError
from .store import Store

__all__ = ["MAX_ID_LENGTH", "resolve_row"]

MAX_ID_LENGTH = 128
_CANDIDATES_SHOWN = 5


def resolve_row(store: Store, table: str, given: Any, *, user: str | None,
                missing: str, ambiguous: str, field: str,
                user_column: str = "user") -> sqlite3.Row:
    """The row of ``table`` whose id is ``given`` or, failing that, starts with it.

    ``missing`` and ``ambiguous`` are the messages (``{id}`` and ``{candidates}`` are filled
    in); ``table`` and ``user_column`` are ours, never a caller's value.
    """
    text = given if isinstance(given, str) else ""
    if not text or len(text) > MAX_ID_LENGTH:
        raise NotFoundError(missing.format(id=str(given)[:MAX_ID_LENGTH]), field=field,
                            value=str(given)[:MAX_ID_LENGTH])
    mine = f" AND {user_column} = ?" if user is not None else ""
    extra: tuple[Any, ...] = (user,) if user is not None else ()
    row = store.query_one(f"SELECT * FROM {table} WHERE id = ?{mine}", (text, *extra))
    if row is not None:
        return row
    rows = store.query(
        f"SELECT * FROM {table} WHERE substr(id, 1, ?) = ?{mine}"
        f" ORDER BY created_at DESC LIMIT {_CANDIDATES_SHOWN + 1}",
        (len(text), text, *extra))
    if len(rows) == 1:
        return rows[0]
    if rows:
        names = ", ".join(r["id"] for r in rows[:_CANDIDATES_SHOWN])
        if len(rows) > _CANDIDATES_SHOWN:
            names += ", ..."
        raise ConflictError(ambiguous.format(id=text, candidates=names), field=field,
                            value=text)
    raise NotFoundError(missing.format(id=text), field=field, value=text)
