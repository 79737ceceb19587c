"""The seconds each unit of work of the test suite took, as ``tests/conftest.py``'s
``_UNIT_SECONDS`` table: summed test times (setup, call and teardown) from a JUnit file of
a run (``.ci/run`` writes ``test-artifacts/junit.xml``), grouped into the units the
workers are handed (``_scope_of``: a group of modules whole, else a module).

    .venv/bin/python scripts/unit_seconds.py test-artifacts/junit.xml [--min 20]
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def unit_seconds(junit: Path) -> dict[str, float]:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    from tests.conftest import _scope_of

    out: dict[str, float] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = (case.get("classname") or "").split(".")
        # classname is the dotted module path, then the class if any
        parts = []
        for p in module:
            parts.append(p)
            if p.startswith("test_"):
                break
        nodeid = "/".join(parts) + ".py::" + (case.get("name") or "")
        scope = _scope_of(nodeid)
        out[scope] = out.get(scope, 0.0) + float(case.get("time") or 0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit", type=Path)
    ap.add_argument("--min", type=float, default=20.0, help="leave out units shorter")
    args = ap.parse_args()
    units = unit_seconds(args.junit)
    print(f"# total {sum(units.values()):.0f} s in {len(units)} units")
    for scope, secs in sorted(units.items(), key=lambda kv: -kv[1]):
        if secs >= args.min:
            print(f'    "{scope}": {secs:.0f},')


if __name__ == "__main__":
    main()
