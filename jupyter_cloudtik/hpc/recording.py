"""``record(name, value)``: a value a notebook job hands back to its sweep's results table;
``read_recorded(notebook)``: the values an executed notebook recorded.

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

# the mime types scrapbook's glue() writes (record writes the first)
SCRAP_JSON = "application/scrapbook.scrap.json+json"
SCRAP_TEXT = "application/scrapbook.scrap.text+json"


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


def read_recorded(nb: bytes | str | dict[str, Any]) -> dict[str, Any]:
    """The values a notebook recorded, by name (the last one wins): the outputs
    scrapbook's ``glue`` writes, in its JSON or text encoding, which ``hpc.recording.record``
    writes too."""
    if not isinstance(nb, dict):
        try:
            nb = json.loads(nb)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return {}  # not a notebook (a nesting bomb included): it records nothing
    out: dict[str, Any] = {}
    # the notebook is what the job wrote (the user's code): another shape records nothing
    cells = nb.get("cells") if isinstance(nb, dict) else None
    for cell in cells if isinstance(cells, list) else []:
        outputs = cell.get("outputs") if isinstance(cell, dict) else None
        for o in outputs if isinstance(outputs, list) else []:
            data = o.get("data") if isinstance(o, dict) else None
            if not isinstance(data, dict):
                continue
            for mime in (SCRAP_JSON, SCRAP_TEXT):
                scrap = data.get(mime)
                if isinstance(scrap, dict) and isinstance(scrap.get("name"), str):
                    out[scrap["name"]] = scrap.get("data")
    return out


__all__ = ["read_recorded", "record"]
