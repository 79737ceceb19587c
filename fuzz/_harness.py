"""What every fuzz target shares: atheris (libFuzzer, coverage-guided) runs ``one(data)``.

A target module imports the code it fuzzes inside ``instrumented()`` (so libFuzzer sees the
branches of jupyter_cloudtik, and only of it), defines ``one(data: bytes)`` that raises only
when a property is broken (an unexpected exception type, a wrong round trip), and ends with
``main(one)``.  Run one with ``python fuzz/fuzz_NAME.py [libFuzzer options] [corpus dirs]``;
``python fuzz/run.py`` runs them all (docs/security.md#fuzzing).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

import atheris

HERE = os.path.dirname(os.path.abspath(__file__))


@contextlib.contextmanager
def instrumented() -> Iterator[None]:
    """Imports inside are instrumented for coverage when they belong to jupyter_cloudtik."""
    with atheris.instrument_imports(include=["jupyter_cloudtik"]):
        yield


def text(data: bytes) -> str:
    """Bytes as the str a parser is given: UTF-8, undecodable bytes as lone surrogates (what
    ``json.loads`` makes of ``"\\udc80"``, so what a REST body can carry)."""
    return data.decode("utf-8", "surrogateescape")


def output(data: bytes) -> str:
    """Bytes as a command's output is decoded here (``errors="replace"``, transport/shell.py)."""
    return data.decode("utf-8", "replace")


def choose(data: bytes, n: int) -> tuple[int, bytes]:
    """The first byte picks one of ``n`` sub-targets; the rest is its input."""
    if not data:
        return 0, b""
    return data[0] % n, data[1:]


def main(one: Callable[[bytes], None]) -> None:
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()
