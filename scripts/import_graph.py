"""Figures of the import graph (issue 30): the largest modules, folder pairs that import
each other, imports running up the layers of pyproject.toml's "layers" contract (named
edges included), circles across files and deferred (function-level) imports, with those
not marked ``# deferred: <reason>``.

    .venv/bin/python scripts/import_graph.py

It reads the same graph import-linter checks (grimp, deferred imports included,
``if TYPE_CHECKING`` imports not), so its counts and ``lint-imports`` agree.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

import grimp
import tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "jupyter_cloudtik"


def layer_rank() -> dict[str, int]:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in contracts["contracts"] if c["id"] == "layers")["layers"]
    return {name.strip(): len(layers) - i for i, layer in enumerate(layers)
            for name in layer.split("|")}


def folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(package)"


def circles(graph: grimp.ImportGraph) -> list[set[str]]:
    """Strongly connected sets of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []
    counter = 0
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        m = stack.pop()
                        on.discard(m)
                        group.add(m)
                        if m == node:
                            break
                    if len(group) > 1:
                        out.append(group)
    return out


def deferred_imports() -> tuple[int, int, list[str]]:
    """(imports inside functions, all first-party imports, the deferred ones not marked
    why) in the package's files.  A deferred import says why it is not at the top with a
    ``# deferred: <reason>`` comment (docs/architecture.md, "Layers") on its own lines or in
    the contiguous block of comments and imports directly above it."""
    inner = total = 0
    unmarked: list[tuple[str, int, str]] = []
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        funcs = [n for n in ast.walk(tree)
                 if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        nested = {id(n) for f in funcs for n in ast.walk(f)
                  if isinstance(n, ast.Import | ast.ImportFrom)}
        import_lines = {i for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
                        for i in range(n.lineno, n.end_lineno + 1)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (
                    node.level or (node.module or "").startswith(PACKAGE)):
                total += 1
                if id(node) not in nested:
                    continue
                inner += 1
                if not marked(lines, import_lines, node):
                    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                    imported = "." * node.level + (node.module or "")
                    unmarked.append((module.removesuffix(".__init__"), node.lineno, imported))
    return inner, total, [f"{m}:{line} {imported}" for m, line, imported in sorted(unmarked)]


def marked(lines: list[str], import_lines: set[int], node: ast.ImportFrom) -> bool:
    """Whether the import's lines, or the comments and imports right above it, say
    ``# deferred:``."""
    if any("# deferred:" in lines[i - 1] for i in range(node.lineno, node.end_lineno + 1)):
        return True
    i = node.lineno - 1
    while i >= 1 and (lines[i - 1].lstrip().startswith("#") or i in import_lines):
        if "# deferred:" in lines[i - 1]:
            return True
        i -= 1
    return False


def main() -> int:
    graph = grimp.build_graph(PACKAGE, include_external_packages=False,
                              exclude_type_checking_imports=True)
    rank = layer_rank()
    pairs: Counter[tuple[str, str]] = Counter()
    up: list[str] = []
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            a, b = folder(importer), folder(imported)
            if a == b:
                continue
            pairs[(a, b)] += 1
            if a in rank and b in rank and rank[b] >= rank[a]:
                up.append(f"{importer} -> {imported}")
    mutual = sorted({tuple(sorted(p)) for p in pairs if (p[1], p[0]) in pairs})
    sizes = sorted(((len(p.read_text().splitlines()), str(p.relative_to(ROOT)))
                    for p in (ROOT / PACKAGE).rglob("*.py")), reverse=True)[:5]
    rings = circles(graph)
    inner, total, unmarked = deferred_imports()
    print("largest modules: " + ", ".join(f"{path} {n}" for n, path in sizes))
    print(f"folder pairs importing each other: {len(mutual)} {mutual or ''}")
    print(f"imports running up or sideways across layers: {len(up)}")
    for line in sorted(up):
        print("  " + line)
    print(f"circles across files: {len(rings)}")
    for ring in rings:
        print("  " + " ".join(sorted(ring)))
    print(f"deferred first-party imports: {inner} of {total} ({100 * inner / total:.0f}%)")
    print(f"deferred first-party imports without a reason: {len(unmarked)}")
    for line in unmarked[:20]:
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
