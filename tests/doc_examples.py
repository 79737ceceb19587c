"""The fenced code blocks of README.md and docs/*.md, for the tests that run them.

Every fenced block has an info string, and it says what the block is:

* ``python``, ``bash``, ``yaml``, ``json``, ``toml``, ``ini``: something a user runs (a
  cell, shell commands) or a file a command reads.  The test suite runs each of them;
  a full run of the suite fails when one ran nowhere (``check_coverage``, called at the end
  of the session by ``tests/conftest.py``).
* ``text``: output, diagrams, layouts, syntax synopses with placeholders — never run.

A runnable language can be opted out with an HTML comment on the line right before the
fence, giving the reason in the doc itself::

    <!-- not-run: needs a real Huawei Cloud account; the emulator walkthrough is run -->

Tests get a block's text through ``block(...)`` (so they run exactly what the doc says) and
that records it as run.  A test that changes a block before running it (a folder of its own
instead of ``/tmp/hwc``, say) says so in its docstring.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = {"python", "bash", "yaml", "json", "toml", "ini"}
ILLUSTRATIVE = {"text"}
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(.*?)\s*-->\s*$")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")


@dataclass(frozen=True)
class Block:
    doc: str  # "README.md", "docs/hpc.md"
    index: int  # the block's number in its file, from 0
    line: int  # the line of its opening fence, from 1
    heading: str  # the nearest heading above it, without the #s
    lang: str
    text: str
    not_run: str | None  # the reason given in the doc, if any

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line} [{self.index}] ({self.lang}, under '{self.heading}')"

    @property
    def runnable(self) -> bool:
        return self.lang in RUNNABLE and self.not_run is None


def doc_paths() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def parse(path: Path) -> list[Block]:
    doc = str(path.relative_to(ROOT))
    lines = path.read_text().splitlines()
    found: list[Block] = []
    heading = ""
    i = 0
    while i < len(lines):
        h = HEADING.match(lines[i])
        if h:
            heading = h.group(2)
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent = m.group(1)
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != indent + "```":
            end += 1
        if end == len(lines):
            raise ValueError(f"{doc}:{i + 1}: unclosed code block")
        prev = NOT_RUN.match(lines[i - 1].strip()) if i else None
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip()
                for ln in lines[i + 1:end]]
        found.append(Block(doc, len(found), i + 1, heading, m.group(2), "\n".join(body) + "\n",
                           prev.group(1) if prev else None))
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [b for p in doc_paths() for b in parse(p)]


_RAN: dict[tuple[str, int], str] = {}  # (doc, index) -> the test that ran it


def block(doc: str, heading: str, n: int = 0, lang: str | None = None,
          by: str = "") -> Block:
    """The ``n``-th runnable block (of language ``lang``, if given) under ``heading`` in
    ``doc`` ("README.md", "docs/hpc.md"), recorded as run by the calling test."""
    candidates = [b for b in parse(ROOT / doc) if b.heading == heading and b.runnable
                  and (lang is None or b.lang == lang)]
    if n >= len(candidates):
        raise LookupError(f"{doc} has no runnable block {n} ({lang or 'any language'}) "
                          f"under the heading '{heading}': {len(candidates)} found")
    b = candidates[n]
    mark_run(b, by)
    return b


def blocks(doc: str, heading: str, lang: str | None = None, by: str = "") -> list[Block]:
    """Every runnable block under ``heading`` (recorded as run)."""
    found = [b for b in parse(ROOT / doc) if b.heading == heading and b.runnable
             and (lang is None or b.lang == lang)]
    if not found:
        raise LookupError(f"{doc} has no runnable block under the heading '{heading}'")
    for b in found:
        mark_run(b, by)
    return found


def mark_run(b: Block, by: str = "") -> None:
    import os

    _RAN.setdefault((b.doc, b.index), by or os.environ.get("PYTEST_CURRENT_TEST", "?"))


def ran() -> dict[tuple[str, int], str]:
    return dict(_RAN)


def not_run() -> list[Block]:
    """Runnable blocks that no test of this session fetched."""
    return [b for b in all_blocks() if b.runnable and (b.doc, b.index) not in _RAN]


def check_coverage() -> list[str]:
    """One line per runnable block of the docs that no test ran (empty: all ran)."""
    return [b.id for b in not_run()]
