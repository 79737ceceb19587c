"""The fenced code blocks of README.md and docs/*.md, for the tests that run them.

Every fenced block has an info string, and it says what the block is:

* ``python``, ``bash``, ``yaml``, ``json``, ``toml``, ``ini``: something a user runs (a
  cell, shell commands) or a file a command reads.  The test suite runs each of them;
  a full run of the suite fails when one ran nowhere (``check_coverage``, called at the end
  of the session by ``tests/conftest.py``).
* ``text``: output, diagrams, layouts, syntax synopses with placeholders — never run.

A runnable language can be opted out with an HTML comment on the line right before the
fence, giving the reason in the doc itself::

    <!-- not-run: starts this machine's shared Slurm services; tests/hpc/conftest.py does -->

``<!-- pending: reason -->`` marks a block that should run but no test runs yet (a real
JupyterHub or cloud set-up the tests do not build for it yet): the end of a full run lists
these without failing, so the gap stays visible.  Prefer running the block.

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
NOT_RUN = re.compile(r"^<!--\s*(not-run|pending):\s*(.*?)\s*-->\s*$")
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
    pending: bool = False  # "pending:" rather than "not-run:"

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
                           prev.group(2) if prev else None,
                           bool(prev) and prev.group(1) == "pending"))
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


def code(text: str) -> list[str]:
    """The lines of a block without comments and blank lines (for "the same example")."""
    lines = (re.sub(r"\s+#.*$|^#.*$", "", ln).rstrip() for ln in text.splitlines())
    return [ln for ln in lines if ln]


def entry_points_txt(toml_text: str) -> str:
    """The ``entry_points.txt`` of a dist-info for a ``pyproject.toml`` fragment's
    ``[project.entry-points."GROUP"]`` tables (what pip writes when it installs it)."""
    import tomllib

    groups = tomllib.loads(toml_text)["project"]["entry-points"]
    return "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
                   for g, eps in groups.items())


def write_dist_info(root: Path, name: str, toml_text: str) -> Path:
    """A ``NAME-0.1.dist-info`` in ``root`` with the fragment's entry points: importlib
    finds it on ``sys.path`` as it finds an installed wheel."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points_txt(toml_text))
    return root


def mark_run(b: Block, by: str = "") -> None:
    import os

    _RAN.setdefault((b.doc, b.index), by or os.environ.get("PYTEST_CURRENT_TEST", "?"))


def ran() -> dict[tuple[str, int], str]:
    return dict(_RAN)


def ran_records() -> list[list]:
    """This process's record as JSON-able rows (a pytest-xdist worker's share)."""
    return [[d, i, by] for (d, i), by in _RAN.items()]


def merge_ran(rows: list[list]) -> int:
    """Merge a worker's ``ran_records()`` into this process's; how many rows it had."""
    for d, i, by in rows:
        _RAN.setdefault((d, i), by)
    return len(rows)


def not_run() -> list[Block]:
    """Runnable blocks that no test of this session fetched."""
    return [b for b in all_blocks() if b.runnable and (b.doc, b.index) not in _RAN]


def check_coverage() -> list[str]:
    """One line per runnable block of the docs that no test ran (empty: all ran)."""
    return [b.id for b in not_run()]


def pending() -> list[Block]:
    """Blocks the docs mark ``pending:`` (should run; no test runs them yet)."""
    return [b for b in all_blocks() if b.pending]


# --- running blocks: IPython cells in a real kernel, shell blocks in bash --------------------


def cells(b: Block) -> list[str]:
    """The block as a user types it into IPython: one complete statement (or magic line) at
    a time; a cell-magic (``%%``) block is one cell."""
    from IPython.core.inputtransformer2 import TransformerManager

    if b.text.lstrip().startswith("%%"):
        return [b.text]
    tm, out, cur = TransformerManager(), [], []

    def complete() -> bool:
        return tm.check_complete("\n".join(cur) + "\n")[0] != "incomplete"

    for line in b.text.splitlines():
        if not line.strip() and not cur:
            continue
        # an unindented line after a complete statement starts the next one (the body of
        # a def or a for is complete at each line, so a cell ends only at a dedent)
        starts = line[:1] not in ("", " ", "\t", ")", "]", "}")
        if cur and starts and complete():
            out.append("\n".join(cur).rstrip())
            cur = []
        cur.append(line)
    if cur:
        if not complete():
            raise ValueError(f"{b.id}: an incomplete statement at the end")
        out.append("\n".join(cur).rstrip())
    return out


class CellError(AssertionError):
    pass


class Kernel:
    """A real IPython kernel (jupyter_client) in ``cwd`` with ``env``; cells run as a
    frontend runs them, prompts (``input``/``getpass``) answered from ``answers``."""

    def __init__(self, cwd: Path, env: dict[str, str] | None = None) -> None:
        from jupyter_client.manager import start_new_kernel

        self.km, self.kc = start_new_kernel(kernel_name="python3", cwd=str(cwd), env=env,
                                            startup_timeout=60)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)

    def __enter__(self) -> Kernel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def cell(self, source: str, timeout: float = 120,
             answers: dict[str, str] | None = None) -> tuple[str, str]:
        """(the cell's result as text/plain, what it printed and displayed)."""
        result: list[str] = []
        shown: list[str] = []
        error: list[str] = []
        asked: list[str] = []

        def output(msg) -> None:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                shown.append(content["text"])
            elif kind == "execute_result":
                result.append(content["data"].get("text/plain", ""))
            elif kind == "display_data":
                shown.append(content["data"].get("text/plain", "") + "\n")
            elif kind == "error":
                error.append(f"{content['ename']}: {content['evalue']}")

        def stdin(msg) -> None:
            prompt = msg["content"]["prompt"]
            asked.append(prompt)
            value = next((v for k, v in (answers or {}).items() if k in prompt), None)
            if value is None:
                raise CellError(f"unexpected prompt {prompt!r} in {source!r}")
            self.kc.input(value)

        reply = self.kc.execute_interactive(source, timeout=timeout, output_hook=output,
                                            stdin_hook=stdin, allow_stdin=True)
        if error or reply["content"]["status"] != "ok":
            raise CellError(f"{source!r}: " + ("; ".join(error) or str(reply["content"])))
        return "".join(result), "".join(shown)

    def run(self, b: Block, timeout: float = 120, answers: dict[str, str] | None = None,
            text: str | None = None) -> list[tuple[str, str, str]]:
        """Run every cell of the block (``text``: the block with a test's stand-ins);
        a statement whose last line ends in ``# -> VALUE`` must give VALUE."""
        done = []
        block = b if text is None else Block(**{**b.__dict__, "text": text})
        for source in cells(block):
            result, shown = self.cell(source, timeout, answers)
            expected = re.search(r"#\s*->\s*(.+?)\s*$", source.splitlines()[-1])
            if expected and result != expected.group(1):
                raise CellError(f"{b.id}: {source!r} gave {result!r}, the doc says "
                                f"{expected.group(1)!r}\n{shown}")
            done.append((source, result, shown))
        return done


def bash(b: Block, cwd: Path, env: dict[str, str], timeout: float = 120,
         text: str | None = None) -> str:
    """Run a shell block with ``bash -e -o pipefail`` (``text``: with a test's stand-ins)."""
    import subprocess

    r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", b.text if text is None else text],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0 or "Traceback" in r.stderr:
        raise AssertionError(f"{b.id} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout
