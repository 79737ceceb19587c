"""``jsonschema``, imported when a schema is first checked, without its slow ``iri`` checker.

jsonschema imports ``rfc3987_syntax`` (when installed, as jupyter_events' extras do) for its
"iri" format checker, and that module compiles about 40 Lark grammars at import: 2 to 4 s
added to every CLI call, kernel and daemon start.  No cloudtik schema uses the iri formats,
so the first import of jsonschema *by cloudtik* is made as if that optional module were
absent (jsonschema then has no iri checker), and ``sys.modules`` is left as it was right
after: importing ``jupyter_cloudtik`` patches nothing, and a later
``import rfc3987_syntax`` elsewhere works.  When jsonschema is already loaded (a Jupyter
server loads it first) nothing changes; ``CLOUDTIK_IRI_FORMAT=1`` (``env.IRI_FORMAT``)
keeps the checker.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

from . import env


def jsonschema() -> ModuleType:
    """The ``jsonschema`` module (see the module docstring for how it is first imported)."""
    loaded = sys.modules.get("jsonschema")
    if loaded is not None:
        return loaded
    if os.environ.get(env.IRI_FORMAT) or "rfc3987_syntax" in sys.modules:
        import jsonschema as module

        return module
    sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]  # "not installed"
    try:
        import jsonschema as module
    finally:
        if sys.modules.get("rfc3987_syntax", 0) is None:
            del sys.modules["rfc3987_syntax"]
    return module
