"""``ast.parse`` for the tests that read the package's source, safe beside other threads.

CPython 3.11.7 keeps the AST constructor's recursion depth in state shared by threads
(gh-106905, fixed in 3.11.8 and 3.12): an ``ast.parse`` while another thread of the test
process builds an AST (a lazily imported module being assertion-rewritten, a library's
thread) can fail with ``SystemError: AST constructor recursion depth mismatch``, though the
source is fine (a clean-clone CI, 2026-12-05: test_grants, beside a failed test's leftover
threads).  That error, and only it, is tried again."""

from __future__ import annotations

import ast
import time

TRIES = 5


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    for attempt in range(TRIES):
        try:
            return ast.parse(source, filename)
        except SystemError as e:
            if "recursion depth mismatch" not in str(e) or attempt == TRIES - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")
