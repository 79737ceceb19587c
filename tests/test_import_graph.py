"""The import graph's figures (scripts/import_graph.py, docs/architecture.md "Layers"):
no two folders import each other, and nothing runs up the layers but the named edges the
layers contract lists (a new one must be named there, with its reason, to pass); every
deferred first-party import says why it is deferred (``# deferred: <reason>``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_no_folder_pair_imports_each_other_and_only_named_edges_run_up():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph.py")],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "folder pairs importing each other: 0" in out, out
    up = re.findall(r"^  (\S+ -> \S+)$", out.split("imports running up")[1]
                    .split("circles across files")[0], re.M)
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    named = next(c for c in contracts["contracts"] if c["id"] == "layers")["ignore_imports"]
    assert up or not named, "the script found no edge at all: it no longer reads the graph"
    assert sorted(up) == sorted(named), out
    assert re.search(r"deferred first-party imports: \d+ of \d+", out), out
    # issue 30's targets: at most 3 arrows up, no circle across files
    assert len(up) <= 3, out
    assert "circles across files: 0" in out, out
    # issue 30: deferred imports only where they save start-up time (or break a cycle,
    # or need an optional extra), each marked why
    unmarked = re.search(r"^deferred first-party imports without a reason: (\d+)$", out, re.M)
    assert unmarked, out
    assert int(unmarked.group(1)) == 0, out
