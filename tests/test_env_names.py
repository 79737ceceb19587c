"""Environment names are defined once (``core/env.py``), and importing the package changes
no interpreter state (issue 30).

Real source files and a real interpreter: the package's code is parsed (not grepped, so
docstrings that name a variable for people do not count), and a fresh Python imports the
package and checks a config.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from ast_parse import parse

import jupyter_cloudtik
from jupyter_cloudtik.core import env

PACKAGE = Path(jupyter_cloudtik.__file__).parent

# files that must spell names themselves, and why
SPELLED_ON_PURPOSE = {
    # pickled by value to nodes without jupyter_cloudtik installed: stdlib + distributed only
    "storage/node_plugin.py",
    # the node's bootstrap: a shell script and a Python script written into user data,
    # run on the node before the package is installed there
    "providers/huaweicloud/userdata.py",
    # written into an HPC kernel's job folder and run there: the standard library only
    "hpc/kernels/node_helper.py",
}


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """String constants of ``path`` that are not docstrings."""
    tree = parse(path.read_text())
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def _spelled() -> list[str]:
    names = {v for k, v in vars(env).items() if k.isupper() and isinstance(v, str)}
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "core/env.py" or rel in SPELLED_ON_PURPOSE:
            continue
        for line, text in _code_strings(path):
            # a string that *is* a name (or the prefix) is a read or a write of it; messages
            # and help texts that mention one are for people
            if text.startswith(env.PREFIX) and text.replace("_", "").isalnum() \
                    and text.isupper():
                spelled.append(f"{rel}:{line}: {text!r}"
                               + ("" if text in names else " (not in core/env.py)"))
    return spelled


def test_every_cloudtik_name_in_code_comes_from_core_env():
    # parsed in a fresh interpreter: CPython 3.11's ast.parse is not safe beside another
    # thread converting an AST (CI: "AST constructor recursion depth mismatch" in a worker
    # whose earlier tests left threads behind)
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
            "from test_env_names import _spelled; print(json.dumps(_spelled()))")
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    spelled = json.loads(out.stdout.strip().splitlines()[-1])
    assert not spelled, "use core/env.py's names:\n" + "\n".join(spelled)


def test_importing_the_package_patches_no_module_and_jsonschema_skips_iri():
    code = (
        "import sys\n"
        "import jupyter_cloudtik, jupyter_cloudtik.core.config as c\n"
        "assert 'rfc3987_syntax' not in sys.modules, 'patched at import'\n"
        "assert 'jsonschema' not in sys.modules, 'jsonschema loaded at import'\n"
        "c.validate_against({'a': 1}, {'type': 'object'})\n"
        "import jsonschema._format as f\n"
        "assert sys.modules.get('rfc3987_syntax', 0) is not None, 'left patched'\n"
        "print(sorted(k for k in ('iri', 'iri-reference')"
        " if k in f.draft202012_format_checker.checkers))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={"PATH": "/usr/bin:/bin",
                                           "PYTHONPATH": str(PACKAGE.parent)})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"  # the slow checker skipped, nothing patched for good
    kept = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", env.IRI_FORMAT: "1",
                                            "PYTHONPATH": str(PACKAGE.parent)})
    assert kept.returncode == 0, kept.stderr
    assert kept.stdout.strip() == "['iri', 'iri-reference']"
