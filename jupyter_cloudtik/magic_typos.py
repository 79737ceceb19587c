"""A suggestion for a mistyped magic of ours (``%clsuter`` → ``%cluster``).

IPython answers an unknown magic with "Line magic function `%clsuter` not found." and
nothing more; it has no hook for unknown magics.  An input transformer (IPython's
documented extension point, run before its own magic handling) sees the cell first: a line
whose magic IPython does not know, close to one of ours, becomes a ``UsageError`` naming
ours.  Everything else passes untouched, so other extensions' magics and other typos get
IPython's own answer.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import Any

_MAGIC = re.compile(r"^(?P<indent>[ \t]*)(?P<escape>%%?)(?P<name>[A-Za-z_]\w*)")


class MagicTypos:
    """The transformer; ``ours`` are the names of our line and cell magics."""

    def __init__(self, shell: Any, ours: Iterable[str]) -> None:
        self.shell = shell
        self.ours = sorted(set(ours))

    def _suggestion(self, escape: str, name: str) -> str | None:
        kind = "cell" if escape == "%%" else "line"
        if self.shell.find_magic(name, kind) is not None:
            return None
        close = difflib.get_close_matches(name, self.ours, n=1, cutoff=0.7)
        if not close:
            return None
        return (f"{kind.capitalize()} magic function `{escape}{name}` not found. Did you mean "
                f"`{escape}{close[0]}`? (`%{close[0]} --help` lists what it does)")

    def __call__(self, lines: list[str]) -> list[str]:
        out = []
        for i, line in enumerate(lines):
            m = _MAGIC.match(line)
            if m is None or (m["escape"] == "%%" and i > 0):
                out.append(line)
                continue
            said = self._suggestion(m["escape"], m["name"])
            if said is None:
                out.append(line)
                continue
            raise_it = (f"{m['indent']}raise __import__('IPython.core.error', fromlist=['x'])"
                        f".UsageError({said!r})\n")
            if m["escape"] == "%%":  # the rest of the cell is the magic's body, not Python
                return [raise_it]
            out.append(raise_it)
        return out


def install(shell: Any, ours: Iterable[str]) -> None:
    """Add the transformer once per shell (``%load_ext`` may run again)."""
    cleanup = shell.input_transformers_cleanup
    if any(isinstance(t, MagicTypos) for t in cleanup):
        return
    cleanup.append(MagicTypos(shell, ours))
