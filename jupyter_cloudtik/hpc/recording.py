"""``record(name, value)``: a value a notebook job hands back to its sweep's results table.

It writes the same output scrapbook's ``glue(name, value)`` writes (a display output of
type ``application/scrapbook.scrap.json+json`` holding ``{"name", "data", "encoder":
"json", "version": 1}``), so a notebook may use either: ``sweep.results()`` reads both from
each element's executed notebook.  scrapbook itself is not needed (it is unmaintained and
pulls in pyarrow); this module needs only IPython, and a notebook without
jupyter_cloudtik installed can write the same output with ``IPython.display.display``
(docs/hpc.md, "Sweeps").
"""

from __future__ import annotations

import json
from typing import Any

SCRAP_JSON = "application/scrapbook.scrap.json+json"


def record(name: str, value: Any) -> None:
    """Record ``value`` (anything JSON can hold) under ``name`` in the executed notebook."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: {name!r} is not a non-empty string")
    json.dumps(value)  # a value JSON cannot hold fails here, in the notebook, not later
    from IPython.display import display

    display(
        {
            SCRAP_JSON: {"name": name, "data": value, "encoder": "json", "version": 1},
            "text/plain": f"{name} = {value!r}",
        },
        metadata={"scrapbook": {"name": name, "data": True, "display": False}},
        raw=True,
    )


__all__ = ["record"]
