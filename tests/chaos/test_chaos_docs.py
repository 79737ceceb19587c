"""The commands of docs/architecture.md's "Crash chaos", run as written but one round long
and on the smallest of the three tests (the sidekick's): the campaign and the replay of a
seed.  The whole package runs in the suite anyway; this proves the documented commands,
``CLOUDTIK_CHAOS_ROUNDS`` and ``CLOUDTIK_CHAOS_SEED`` work as the page says."""

from __future__ import annotations

import os
from pathlib import Path

import doc_examples as docs
import pytest

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_the_documented_chaos_commands_run(tmp_path):
    b = docs.block("docs/architecture.md", "Crash chaos (`tests/chaos/`)", 0, lang="bash")
    lines = b.text.strip().splitlines()
    assert len(lines) == 2 and all("-m chaos" in line for line in lines), b.text
    text = (b.text.replace("CLOUDTIK_CHAOS_ROUNDS=50", "CLOUDTIK_CHAOS_ROUNDS=1")
            .replace("tests/chaos -m chaos", "tests/chaos/test_sidekick_crashes.py -m chaos")
            .replace(".venv/bin/python -m pytest", ".venv/bin/python -m pytest -p "
                     "no:cacheprovider -rA -s"))
    assert text.count("ROUNDS=1 ") == 2 and text.count("test_sidekick_crashes.py") == 2
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLOUDTIK_CHAOS_",
                                                                    "PYTEST_"))}
    env["CLOUDTIK_DOC_CHECK"] = "0"  # a part of the suite: not the whole-run doc check
    out = docs.bash(b, ROOT, {**env, "TMPDIR": str(tmp_path)}, timeout=240, text=text)
    assert out.count("1 passed") == 2, out
    assert "sidekick chaos, seed 1234, 1 rounds" in out, out  # the replay took the seed
